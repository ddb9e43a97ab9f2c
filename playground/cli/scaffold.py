"""`playground new NAME`: write a plugin file for a new variant that passes the contract
suite as written.

The default template (`templates/variant.py.tmpl`) is exact softmax attention spelled out
line by line, with shape comments and a docstring saying what to edit; `--kind mod`
(`templates/mod_variant.py.tmpl`) is a `SoftmaxAttention` with a score_mod and a mask_mod. `--from VARIANT`
copies a registered variant's file instead, with its class, config and name renamed.
Either way the written file is loaded once before the command returns: a file that does
not register exactly NAME is removed again, with the reason.
"""

from __future__ import annotations

import inspect
import keyword
import re
import shlex
import string
from dataclasses import dataclass
from pathlib import Path

from playground.errors import PlaygroundError
from playground.registry import Registry, bundled_dir

TEMPLATES = {
    "reference": Path(__file__).resolve().parent / "templates" / "variant.py.tmpl",
    "mod": Path(__file__).resolve().parent / "templates" / "mod_variant.py.tmpl",
}
"""`--kind reference`: exact attention spelled out; `--kind mod`: a SoftmaxAttention
subclass with a score_mod and a mask_mod, about twenty lines."""
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class Scaffold:
    """A written plugin file and the names in it."""

    name: str
    path: Path
    class_name: str
    in_bundled_plugins: bool
    """True when the file lies in the checkout's plugins/, which every command loads."""

    def next_steps(self) -> list[tuple[str, str]]:
        """(command, what it does) pairs to print after writing the file."""
        plugins_dir = (
            ""
            if self.in_bundled_plugins
            else f"--plugins-dir {shlex.quote(str(self.path.parent))} "
        )
        steps = [
            (f"playground {plugins_dir}check {self.name}", "run the contract suite on it"),
        ]
        if self.in_bundled_plugins:
            steps.append(
                (
                    f"nox -s \"variant(name='{self.name}')\"",
                    "its contract suite, quick benchmark and plots",
                )
            )
        steps.append((f"playground {plugins_dir}compare", "the main job, beside every variant"))
        return steps


def class_stem(name: str) -> str:
    """`my_attn` -> `MyAttn`: the prefix of the generated class names."""
    return "".join(part.capitalize() for part in name.split("_"))


def validate_name(name: str, registry: Registry) -> None:
    """Refuse a name that cannot be a plugin file and registry name, or is taken."""
    if not NAME_PATTERN.fullmatch(name):
        suggestion = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
        raise PlaygroundError(
            f"variant name {name!r} must be a lower-case Python identifier: a letter, then "
            f"letters, digits or underscores (files starting with _ are not loaded)"
            + (f"; for example {suggestion!r}" if NAME_PATTERN.fullmatch(suggestion) else "")
        )
    if keyword.iskeyword(name):
        raise PlaygroundError(f"variant name {name!r} is a Python keyword; choose another name")
    if name in registry.variants or name in registry.duplicates:
        raise PlaygroundError(
            f"a variant named {name!r} is already registered (from "
            f"{registry.variants[name].source if name in registry.variants else 'two sources'}); "
            f"choose another name, or edit that file"
        )


def next_steps_text(name: str, in_bundled_plugins: bool) -> str:
    """The docstring's closing paragraph: the commands that apply where the file lies. A
    file outside the checkout's plugins/ is loaded with --plugins-dir, and has no nox
    session (the `variant` session only knows plugins/)."""
    if in_bundled_plugins:
        return (
            f"Then: `playground check {name}`, `nox -s \"variant(name='{name}')\"`, "
            f"`playground compare`."
        )
    return (
        f"Then, with DIR the folder holding this file:\n`playground --plugins-dir DIR check "
        f"{name}`, `playground --plugins-dir DIR compare`."
    )


def render_template(
    name: str, kind: str = "reference", in_bundled_plugins: bool = True
) -> tuple[str, str]:
    """(source, class name) of the template of `kind`, named `name`, its next steps those
    of a file in the checkout's plugins/ or elsewhere."""
    stem = class_stem(name)
    class_name = f"{stem}Attention"
    text = string.Template(TEMPLATES[kind].read_text(encoding="utf-8")).substitute(
        name=name,
        class_name=class_name,
        config_name=f"{stem}Config",
        next_steps=next_steps_text(name, in_bundled_plugins),
    )
    return text, class_name


def render_copy(name: str, original: str, registry: Registry) -> tuple[str, str]:
    """(source, class name) of the file of registered variant `original`, with the
    variant's class, its config class and its `name = "..."` renamed to `name`."""
    cls = registry.get(original)
    source_file = inspect.getsourcefile(cls)
    if source_file is None:
        raise PlaygroundError(f"cannot find the source file of variant {original!r} to copy")
    text = Path(source_file).read_text(encoding="utf-8")
    stem = class_stem(name)
    renames = {cls.__name__: f"{stem}Attention"}
    if cls.Config.__module__ == cls.__module__:
        renames[cls.Config.__name__] = f"{stem}Config"
    for old, new in renames.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    text, count = re.subn(
        rf"""^(\s+name\s*=\s*)(["']){re.escape(original)}\2""",
        rf"\g<1>\g<2>{name}\g<2>",
        text,
        flags=re.MULTILINE,
    )
    if count != 1:
        raise PlaygroundError(
            f"cannot rename variant {original!r}: its file {source_file} does not set "
            f'`name = "{original}"` on a line of its own; copy it by hand'
        )
    # A copied display_name would label two series alike, which the registry refuses.
    text = re.sub(
        r"""^(\s+display_name\s*=\s*)(["']).*?\2""",
        rf"\g<1>\g<2>{name}\g<2>",
        text,
        flags=re.MULTILINE,
    )
    header = f"# Scaffolded by `playground new {name} --from {original}`: {source_file}, renamed.\n"
    return header + text, renames[cls.__name__]


def _check_written(path: Path, name: str) -> None:
    """Load the new file alone; it must register exactly `name` without an error."""
    probe = Registry()
    probe.load_file(path, kind="playground new")
    problems = [error.message for error in probe.errors]
    if not problems and probe.names() != [name]:
        problems.append(f"it registers {probe.names()} instead of [{name!r}]")
    if problems:
        path.unlink()
        raise PlaygroundError(
            f"the scaffolded {path.name} did not load cleanly, so it was removed: "
            + "; ".join(problems)
        )


def create_variant(
    name: str,
    registry: Registry,
    directory: str | Path | None = None,
    copy_from: str | None = None,
    kind: str = "reference",
) -> Scaffold:
    """Write `directory/name.py` (default: the checkout's plugins/) and return it."""
    validate_name(name, registry)
    plugins = bundled_dir("plugins")
    if directory is None:
        if "_bundled" in plugins.parts:
            raise PlaygroundError(
                "playground is installed from a wheel, so its plugins/ lies inside the "
                "package: pass --dir DIR, and load it with --plugins-dir DIR or "
                "PLAYGROUND_PLUGINS_PATH=DIR"
            )
        directory = plugins
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise PlaygroundError(f"--dir {directory} is a file; give a directory for {name}.py")
    path = directory / f"{name}.py"
    if path.exists():
        raise PlaygroundError(f"{path} already exists; not overwriting it (choose another name)")
    if kind not in TEMPLATES:
        raise PlaygroundError(f"--kind must be one of {', '.join(TEMPLATES)}; got {kind!r}")
    in_bundled = directory.resolve() == plugins.resolve()
    if copy_from is None:
        text, class_name = render_template(name, kind, in_bundled)
    else:
        text, class_name = render_copy(name, copy_from, registry)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as file:  # "x": never clobber a racing writer
            file.write(text)
    except OSError as error:
        raise PlaygroundError(
            f"cannot write {path}: {error.strerror or error}; give --dir a directory you can "
            f"write to (it is created if missing)"
        ) from None
    _check_written(path, name)
    return Scaffold(name, path, class_name, in_bundled)
