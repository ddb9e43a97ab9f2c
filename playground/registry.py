"""Plugin discovery and the variant and task registry (pluggy).

Sources, in order (docs/design.md): the tasks shipped in playground/tasks/; every `*.py` in the
bundled `plugins/`; entry points of
group `playground`; every `*.py` in the directories of `PLAYGROUND_PLUGINS_PATH`
(os.pathsep-separated) and of `--plugins-dir`. A plugin that fails is recorded with its
source and error and the others still load; a duplicate name is recorded as an error
naming both sources, and building that name raises it rather than picking one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import math
import numbers
import os
import pkgutil
import sys
import tempfile
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import pluggy

from playground import hookspecs
from playground.config import VariantConfig
from playground.contract import AttentionVariant, Capabilities
from playground.errors import (
    ConfigError,
    DuplicateVariant,
    PluginLoadError,
    UnknownVariant,
    VariantFailedToLoad,
)

ENTRY_POINT_GROUP = "playground"
PLUGINS_PATH_ENV = "PLAYGROUND_PLUGINS_PATH"
_PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_dir(kind: str) -> Path:
    """The shipped `plugins/` or `experiments/` directory.

    In a checkout (editable install) it is the top-level folder researchers edit; in a
    wheel it is shipped inside the package as `playground/_bundled/<kind>`.
    """
    checkout = _PACKAGE_DIR.parent / kind
    if (_PACKAGE_DIR.parent / "pyproject.toml").is_file() and checkout.is_dir():
        return checkout
    return _PACKAGE_DIR / "_bundled" / kind


@dataclass
class PluginInfo:
    """One loaded (or failed) plugin, as `playground plugins` lists it."""

    source: str
    """Where it came from: a file path or `entry point NAME = module`."""
    kind: str
    """"plugins/", "entry point", "PLAYGROUND_PLUGINS_PATH" or "--plugins-dir"."""
    variants: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    errors: list[PluginLoadError] = field(default_factory=list)


@dataclass(frozen=True)
class VariantEntry:
    cls: type[AttentionVariant]
    source: str


@dataclass(frozen=True)
class TaskEntry:
    cls: type
    source: str


def _describe_error(error: BaseException) -> str:
    """One line for an import error: the exception and the plugin's line that raised."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "importlib" not in f.filename]
    where = f" (line {frames[-1].lineno})" if frames else ""
    if isinstance(error, SyntaxError):  # its str() already names the file and line
        return f"{type(error).__name__}: {error.msg} (line {error.lineno})"
    return f"{type(error).__name__}: {error}{where}"


def _why_not_a_variant(obj: Any) -> str | None:
    """Why `obj` cannot be registered as a variant, or None if it can."""
    if not (isinstance(obj, type) and issubclass(obj, AttentionVariant)):
        return (
            f"registered {obj!r}, which is not an attention variant: pass a class that "
            f"subclasses playground.AttentionVariant"
        )
    for attribute in ("name", "summary", "paper"):
        if not isinstance(getattr(obj, attribute, None), str) or not getattr(obj, attribute):
            return f"variant class {obj.__name__} must set the class attribute {attribute!r}"
    if not obj.name.replace("_", "").isalnum():
        return f"variant name {obj.name!r} must be letters, digits and underscores"
    if not (
        isinstance(obj.Config, type)
        and dataclasses.is_dataclass(obj.Config)
        and issubclass(obj.Config, VariantConfig)
    ):
        return f"{obj.__name__}.Config must be a dataclass deriving from VariantConfig"
    problem = _why_config_not_inherited(obj)
    if problem is not None:
        return problem
    if not isinstance(obj.capabilities, Capabilities):
        return (
            f"{obj.__name__}.capabilities must be a playground.Capabilities; got "
            f"{type(obj.capabilities).__name__}"
        )
    problem = _why_display_hooks_fail(obj)
    if problem is not None:
        return problem
    if obj.forward_reference is AttentionVariant.forward_reference:
        return f"{obj.__name__} must define forward_reference (the paper's math)"
    if obj.flops is AttentionVariant.flops:
        return f"{obj.__name__} must define flops(n_q, n_k, d_model, num_heads, **options)"
    own = [
        getattr(obj, hook) is not getattr(AttentionVariant, hook)
        for hook in ("prefill_state", "step_state")
    ]
    if own[0] != own[1]:
        return (
            f"{obj.__name__} overrides {'prefill_state' if own[0] else 'step_state'} but not "
            f"{'step_state' if own[0] else 'prefill_state'}: the two share one decoding state, "
            f"so override both (or neither, for the default that re-runs the forward)"
        )
    return _why_flops_fail(obj)


def _why_config_not_inherited(obj: type[AttentionVariant]) -> str | None:
    """A subclass of a variant base that has options of its own (a base whose code reads
    them, such as a block size) must keep them: its Config derives from the base's."""
    for base in obj.__mro__[1:]:
        if not (isinstance(base, type) and issubclass(base, AttentionVariant)):
            continue
        if "Config" not in vars(base) and base is not AttentionVariant:
            continue
        if issubclass(obj.Config, base.Config):
            return None
        own = obj.Config.__name__
        config = f"{base.__module__}.{base.Config.__name__}"
        return (
            f"{obj.__name__}.Config ({own}) must derive from {base.__name__}'s config, {config}, "
            f"because {base.__name__} reads its own options from it: write "
            f"`@dataclass(frozen=True) class {own}({base.__name__}.Config): ...` and add your "
            f"fields there"
        )
    return None


def _why_display_hooks_fail(obj: type[AttentionVariant]) -> str | None:
    """`colour` and `display_name` are read by every figure and table: a value of the
    wrong kind is refused here, naming the variant. Whether a string is a colour is the
    figures' question (matplotlib's): `report.plots.data.declared` warns, naming the
    variant and the value, and draws the default colour instead."""
    colour = obj.colour
    if colour is not None and not isinstance(colour, str):
        return (
            f"{obj.__name__}.colour must be a matplotlib colour string such as '#1f77b4' or "
            f"'tab:blue', or None for one derived from the name; got {colour!r}"
        )
    label = obj.display_name
    if label is not None and (
        not isinstance(label, str) or not label.strip() or len(label.splitlines()) != 1
    ):
        return (
            f"{obj.__name__}.display_name must be a non-empty single-line string (the name "
            f"in legends and tables), or None for its registry name; got {label!r}"
        )
    return None


def _why_flops_fail(obj: type[AttentionVariant]) -> str | None:
    """flops() with the default options at a small size must give a finite number >= 0:
    every table, figure and efficiency divides by it."""
    try:
        options = dataclasses.asdict(obj.Config())
        value = obj.flops(16, 16, 64, 4, **options)
    except Exception as error:
        return (
            f"{obj.__name__}.flops(16, 16, 64, 4, **default options) raised "
            f"{_describe_error(error)}; it must return the FLOPs of one forward pass"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return (
            f"{obj.__name__}.flops() must return a number of FLOPs; got {value!r} "
            f"({type(value).__name__})"
        )
    if not math.isfinite(value) or value < 0:
        return f"{obj.__name__}.flops() must return a finite number >= 0; got {value!r}"
    return None


def _materialise(step: LoadStep) -> Path:
    """A file with `step.text`, under this machine's temporary directory, named as the
    original (a content digest keeps two versions apart)."""
    assert step.text is not None
    digest = hashlib.sha1(step.text.encode()).hexdigest()[:12]
    directory = Path(tempfile.gettempdir()) / "playground-plugins" / digest
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / Path(step.path).name
    if not path.exists():  # written whole, then renamed: a concurrent reader sees all or none
        partial = directory / f".{path.name}.{os.getpid()}"
        partial.write_text(step.text)
        os.replace(partial, path)
    return path


@dataclass(frozen=True)
class LoadStep:
    """One step of loading a registry: the shipped tasks, the entry points, a plugin
    directory or a plugin file (an absolute path, so another process finds it)."""

    source: Literal["builtin_tasks", "entry_points", "directory", "file"]
    path: str = ""
    kind: str = ""
    text: str | None = None
    """A file's source, carried along (`Registry.portable_recipe`) for a process on a
    machine that does not have the file."""


class Registry:
    """Variants by name, with where each came from and what failed to load."""

    def __init__(self) -> None:
        self.plugin_manager = pluggy.PluginManager("playground")
        self.plugin_manager.add_hookspecs(hookspecs)
        self.variants: dict[str, VariantEntry] = {}
        self.tasks: dict[str, TaskEntry] = {}
        self.plugins: list[PluginInfo] = []
        self.duplicates: dict[str, DuplicateVariant] = {}
        self._seen_files: set[Path] = set()
        self.recipe: list[LoadStep] = []
        """How this registry was loaded, step by step: `Registry.from_recipe` repeats it in
        another process (a training worker), so the same plugins load there."""

    @classmethod
    def from_recipe(cls, recipe: Sequence[LoadStep]) -> Registry:
        """A registry loaded by the same steps as the one `recipe` came from."""
        registry = cls()
        for step in recipe:
            if step.source == "builtin_tasks":
                registry.load_builtin_tasks()
            elif step.source == "entry_points":
                registry.load_entry_points()
            elif step.source == "directory":
                registry.load_directory(step.path, step.kind)
            elif step.text is None:
                registry.load_file(step.path, step.kind)
            else:
                registry.load_file(_materialise(step), step.kind)
        return registry

    def portable_recipe(self) -> list[LoadStep]:
        """The recipe with every plugin file's source carried in it, a directory as its
        files: another machine loads the same plugins without sharing a filesystem."""
        portable = []
        for step in self.recipe:
            if step.source == "directory" and Path(step.path).is_dir():
                files = sorted(Path(step.path).glob("*.py"))
                chosen = [file for file in files if not file.name.startswith("_")]
                portable += [LoadStep("file", str(f), step.kind, f.read_text()) for f in chosen]
            elif step.source == "file" and Path(step.path).is_file():
                portable.append(dataclasses.replace(step, text=Path(step.path).read_text()))
            else:
                portable.append(step)
        return portable

    @classmethod
    def discover(
        cls,
        plugin_dirs: Sequence[str | os.PathLike[str]] = (),
        *,
        bundled: bool = True,
        entry_points: bool = True,
        environment: bool = True,
    ) -> Registry:
        """Load every plugin source (see the module docstring) into a new registry."""
        registry = cls()
        if bundled:
            registry.load_builtin_tasks()
            registry.load_directory(bundled_dir("plugins"), kind="plugins/")
        if entry_points:
            registry.load_entry_points()
        if environment:
            for directory in filter(None, os.environ.get(PLUGINS_PATH_ENV, "").split(os.pathsep)):
                registry.load_directory(directory, kind=PLUGINS_PATH_ENV)
        for plugin_dir in plugin_dirs:
            registry.load_directory(plugin_dir, kind="--plugins-dir")
        return registry

    # --- loading ------------------------------------------------------------------
    def load_directory(self, directory: str | os.PathLike[str], kind: str) -> None:
        path = Path(directory)
        self.recipe.append(LoadStep("directory", str(path.resolve()), kind))
        if not path.is_dir():
            info = PluginInfo(source=str(path), kind=kind)
            info.errors.append(
                PluginLoadError(str(path), "plugin directory does not exist or is not a directory")
            )
            self.plugins.append(info)
            return
        for file in sorted(path.glob("*.py")):
            if not file.name.startswith("_"):
                self._load_file(file, kind)

    def load_file(self, file: str | os.PathLike[str], kind: str) -> None:
        self.recipe.append(LoadStep("file", str(Path(file).resolve()), kind))
        self._load_file(file, kind)

    def _load_file(self, file: str | os.PathLike[str], kind: str) -> None:
        path = Path(file).resolve()
        if path in self._seen_files:  # the same folder named twice
            return
        self._seen_files.add(path)
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        module_name = f"_playground_plugin_{path.stem}_{digest}"
        info = PluginInfo(source=str(path), kind=kind)
        self.plugins.append(info)
        try:
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # dataclasses and pickling look it up
            spec.loader.exec_module(module)
        except BaseException as error:  # a plugin may raise anything on import, SystemExit too
            if isinstance(error, KeyboardInterrupt):
                raise
            sys.modules.pop(module_name, None)
            info.errors.append(PluginLoadError(str(path), _describe_error(error)))
            return
        self._register_module(module, info)

    def load_entry_points(self) -> None:
        self.recipe.append(LoadStep("entry_points"))
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            info = PluginInfo(
                source=f"entry point {entry_point.name} = {entry_point.value}", kind="entry point"
            )
            self.plugins.append(info)
            try:
                plugin = entry_point.load()
            except Exception as error:
                info.errors.append(PluginLoadError(info.source, _describe_error(error)))
                continue
            self._register_module(plugin, info)

    def _register_module(self, plugin: ModuleType | object, info: PluginInfo) -> None:
        try:
            self.plugin_manager.register(plugin, name=info.source)
        except (pluggy.PluginValidationError, ValueError) as error:
            info.errors.append(PluginLoadError(info.source, str(error)))
            return
        callers = self.plugin_manager.get_hookcallers(plugin) or []
        known = ", ".join(n for n in dir(hookspecs) if n.startswith("register_"))
        for caller in callers:
            if caller.spec is None:  # pluggy accepts unknown hooks until check_pending()
                info.errors.append(
                    PluginLoadError(
                        info.source,
                        f"implements unknown hook {caller.name!r}; known hooks: {known}",
                    )
                )
        if not callers:
            info.errors.append(
                PluginLoadError(
                    info.source,
                    "defines no hook: decorate `def register_attention(register)` (or "
                    "register_tasks) with "
                    "@playground.hookimpl (files starting with _ are not loaded as plugins)",
                )
            )
        adders = {"register_attention": self._add_variant, "register_tasks": self._add_task}
        for hook_name, add in adders.items():
            for implementation in getattr(self.plugin_manager.hook, hook_name).get_hookimpls():
                if implementation.plugin is not plugin:
                    continue
                try:
                    implementation.function(register=lambda obj, add=add: add(obj, info))
                except Exception as error:
                    info.errors.append(
                        PluginLoadError(info.source, f"{hook_name} raised {_describe_error(error)}")
                    )

    def _add_variant(self, obj: Any, info: PluginInfo) -> None:
        problem = _why_not_a_variant(obj)
        if problem is not None:
            info.errors.append(PluginLoadError(info.source, problem))
            return
        if obj.name in self.variants:
            duplicate = DuplicateVariant(obj.name, self.variants[obj.name].source, info.source)
            self.duplicates[obj.name] = duplicate
            info.errors.append(duplicate)
            return
        clash = self._label_clash(obj)
        if clash is not None:
            info.errors.append(PluginLoadError(info.source, clash))
            return
        self.variants[obj.name] = VariantEntry(obj, info.source)
        info.variants.append(obj.name)

    def _label_clash(self, obj: type[AttentionVariant]) -> str | None:
        """Two series of one figure must never carry the same label: a variant's label
        (display_name, else its name) may not be another registered variant's label."""
        label = obj.display_name or obj.name
        for name, entry in self.variants.items():
            other = entry.cls.display_name or name
            if label in (other, name):
                return (
                    f"{obj.__name__} ({obj.name!r}) would be labelled {label!r} in figures and "
                    f"tables, which variant {name!r} ({entry.source}) already is; choose "
                    f"another display_name"
                )
        return None

    def _add_task(self, obj: Any, info: PluginInfo) -> None:
        name = getattr(obj, "name", None) if isinstance(obj, type) else None
        if not (isinstance(obj, type) and isinstance(name, str) and name):
            info.errors.append(
                PluginLoadError(
                    info.source,
                    f"register_tasks got {obj!r}; pass a task class with a `name` (see "
                    f"playground.tasks)",
                )
            )
            return
        if name in self.tasks:
            duplicate = DuplicateVariant(name, self.tasks[name].source, info.source, kind="task")
            self.duplicates[f"task:{name}"] = duplicate
            info.errors.append(duplicate)
            return
        self.tasks[name] = TaskEntry(obj, info.source)
        info.tasks.append(name)

    def load_builtin_tasks(self) -> None:
        """The tasks shipped in playground/tasks/, registered through the same hook."""
        self.recipe.append(LoadStep("builtin_tasks"))
        package = importlib.import_module("playground.tasks")
        for module_info in pkgutil.iter_modules(package.__path__):
            if module_info.name.startswith("_"):
                continue
            name = f"playground.tasks.{module_info.name}"
            info = PluginInfo(source=name, kind="built-in")
            self.plugins.append(info)
            try:
                module = importlib.import_module(name)
            except Exception as error:
                info.errors.append(PluginLoadError(name, _describe_error(error)))
                continue
            self._register_module(module, info)

    # --- lookup -------------------------------------------------------------------
    @property
    def errors(self) -> list[PluginLoadError]:
        return [error for info in self.plugins for error in info.errors]

    def names(self) -> list[str]:
        return sorted(self.variants)

    def get(self, name: str) -> type[AttentionVariant]:
        if not isinstance(name, str):
            raise ConfigError(
                f"a variant is named by its registered name, a string; got {name!r} "
                f"({type(name).__name__}). Registered: {', '.join(self.names()) or '(none)'}"
            )
        if name in self.duplicates:
            raise self.duplicates[name]
        if name not in self.variants:
            failures = self.failures_defining(name)
            if failures:
                raise VariantFailedToLoad(name, self.variants, failures)
            raise UnknownVariant(name, self.variants)
        return self.variants[name].cls

    def failed_plugins(self) -> list[PluginInfo]:
        """The plugins with a load error, in load order (one warning line each)."""
        return [info for info in self.plugins if info.errors]

    def failures_defining(self, name: str) -> list[tuple[str, str]]:
        """(source, error) of each failed plugin that appears to define variant `name`:
        its file is NAME.py, or its text spells the name as a string literal. A request
        for that name then reports the file's error, not a guess at close names."""
        found = []
        for info in self.failed_plugins():
            if name in info.variants:
                continue
            path = Path(info.source)
            text = ""
            if path.is_file():
                try:
                    text = path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    text = ""
            if path.stem == name or f'"{name}"' in text or f"'{name}'" in text:
                found.append((info.source, "; ".join(error.message for error in info.errors)))
        return found

    def task_names(self) -> list[str]:
        return sorted(self.tasks)

    def get_task(self, name: str) -> type:
        if f"task:{name}" in self.duplicates:
            raise self.duplicates[f"task:{name}"]
        if name not in self.tasks:
            raise UnknownVariant(name, self.tasks, kind="task")
        return self.tasks[name].cls

    def source_of(self, name: str) -> str:
        self.get(name)
        return self.variants[name].source

    def build(
        self, name: str, d_model: int = 512, num_heads: int = 8, **options: Any
    ) -> AttentionVariant:
        cls = self.get(name)
        try:
            return cls(d_model=d_model, num_heads=num_heads, **options)
        except (RuntimeError, MemoryError, OverflowError) as error:
            if not _is_allocation_failure(error):
                raise
            sizes = {"d_model": d_model, "num_heads": num_heads, **options}
            named = ", ".join(
                f"{key}={value}"
                for key, value in sizes.items()
                if isinstance(value, int) and not isinstance(value, bool)
            )
            raise ConfigError(
                f"variant {name!r} cannot be built with {named}: its parameters do not fit "
                f"in memory ({type(error).__name__}: {str(error).splitlines()[0][:160]}); "
                f"lower the sizes that set its parameters' shapes"
            ) from None


def _is_allocation_failure(error: BaseException) -> bool:
    """An allocator refusal or a size that overflows a tensor's storage computation."""
    if isinstance(error, (MemoryError, OverflowError)):
        return True
    message = str(error)
    return any(
        words in message
        for words in (
            "can't allocate memory",
            "Storage size calculation overflowed",
            "out of memory",
            "negative dimension",
        )
    )


_default: Registry | None = None
_default_dirs: tuple[str, ...] = ()


def configure(plugin_dirs: Iterable[str | os.PathLike[str]] = ()) -> Registry:
    """Rebuild the default registry with extra plugin directories (`--plugins-dir`)."""
    global _default, _default_dirs
    _default_dirs = tuple(str(d) for d in plugin_dirs)
    _default = Registry.discover(_default_dirs)
    return _default


def default_registry() -> Registry:
    """The registry behind `playground.build`: discovered once, on first use."""
    global _default
    if _default is None:
        _default = Registry.discover(_default_dirs)
    return _default
