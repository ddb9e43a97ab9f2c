"""Experiment specs: TOML files in experiments/, read with tomllib and validated whole
before anything runs. An error names the file and the key and says what would be valid.

    name = "quick"                       # results go to results/<name>/<timestamp>/
    description = "..."
    seq_lens = [256, 512, 1024]
    batch_size = 1
    d_model = 512
    num_heads = 8
    dtype = "float32"                    # float32 | float64 | bfloat16 | float16
    device = "cpu"                       # cpu | cuda
    passes = ["forward", "forward_backward"]
    measures = ["speed", "memory", "fidelity"]
    seed = 0
    threads = 2                          # torch threads to measure with (default: torch's own)
    accuracy_workers = 2                 # one-thread processes training accuracy seeds
                                         # side by side (default: one per core on a CPU)
    executor = "local"                   # local | ray (pip install 'attention-playground[ray]')
    address = "10.0.0.1:6379"            # the ray executor's cluster (default: RAY_ADDRESS,
                                         # else a fresh local one)
    baseline = "vanilla"                 # speed-ups are against this variant point (default: none)

    [timing]
    min_run_time = 0.2                   # seconds of timed runs per cell (after warm-up)

    [[variants]]                         # omit to run every registered variant
    name = "linformer"
    k = [64, 128, 256]                   # a list sweeps the option...
    seq_len = 4096

    [options.linformer]                  # ...and [options.NAME] sets options of a variant
    seq_len = 16384                      # whether it is listed or picked up automatically

A list is a sweep unless the option itself is a tuple: `global_tokens = [0]` is one value,
`global_tokens = [[0], [0, 1]]` sweeps two.

`name` names a directory under the results root, so it is a name, never a path: letters,
digits, `_` and `-`. No cell may appear twice: a repeated length, pass, variant point or
task is an error naming it (two rows would share one cell id).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from playground.accuracy import MODEL_DEFAULTS, Stage, curriculum_tasks, training_label
from playground.config import build_config, field_types
from playground.errors import ConfigError, PlaygroundError
from playground.registry import Registry, bundled_dir

EXECUTORS = ("local", "ray")

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
PASSES = ("forward", "forward_backward")
MEASURES = ("speed", "memory", "fidelity", "accuracy")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
"""A spec's name: the directory results/<name>/ is made of it, so no `/`, `.` or space."""


class SpecError(ConfigError):
    """An experiment spec is malformed; the message names the file and key."""


@dataclass(frozen=True)
class VariantPoint:
    """One variant with one concrete set of options (a point of a sweep)."""

    name: str
    options: dict[str, Any]

    @property
    def label(self) -> str:
        """The name plus the options set in the spec, e.g. `linformer(k=64)`."""
        if not self.options:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in sorted(self.options.items()))})"


@dataclass(frozen=True)
class TaskRun:
    """One synthetic task to train every variant on (measure `accuracy`)."""

    name: str
    options: dict[str, Any]
    label: str
    """The task with its non-default options, e.g. `mqar(seq_len=128, num_pairs=8)`."""
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int | None = None
    """Optimizer steps; None = the task's own default (its docstring says why)."""
    d_model: int = MODEL_DEFAULTS["d_model"]
    num_heads: int = MODEL_DEFAULTS["num_heads"]
    num_layers: int = MODEL_DEFAULTS["num_layers"]
    learning_rate: float | None = None
    """Peak learning rate; None = the task's own default."""
    batch_size: int | None = None
    """Sequences per step; None = the task's own default."""
    variants: tuple[str, ...] | None = None
    """The variant points that train on this task, by name (every point of it) or label;
    None = every variant point of the spec."""
    curriculum: tuple[Stage, ...] = ()
    """Stages trained first, in order, on the same model; each is scored too."""
    stage_labels: tuple[str, ...] = ()
    """The label each stage's row is recorded under (the task's own is `label`)."""

    def trains(self, variant: VariantPoint) -> bool:
        """Whether `variant` trains on this task."""
        return self.variants is None or bool({variant.name, variant.label} & set(self.variants))


TASK_SETTINGS = {
    "seeds": int,
    "steps": int,
    "d_model": int,
    "num_heads": int,
    "num_layers": int,
    "learning_rate": float,
    "batch_size": int,
}
"""Keys of a [[tasks]] table that set up training rather than the task itself."""


@dataclass(frozen=True)
class Spec:
    name: str
    path: Path
    text: str
    description: str = ""
    variants: tuple[VariantPoint, ...] = ()
    seq_lens: tuple[int, ...] = (256, 512, 1024)
    batch_size: int = 1
    d_model: int = 512
    num_heads: int = 8
    dtype: str = "float32"
    device: str = "cpu"
    passes: tuple[str, ...] = PASSES
    measures: tuple[str, ...] = ("speed", "memory", "fidelity")
    seed: int = 0
    threads: int | None = None
    """torch threads every cell is measured with; None = torch.get_num_threads()."""
    accuracy_workers: int | None = None
    """One-thread processes that train accuracy seeds side by side; 1 trains them in the
    runner's process on `threads`; None = one per usable core on a CPU, one on CUDA."""
    executor: str = "local"
    """Where the cells run: "local" (this machine) or "ray" (a Ray cluster)."""
    address: str | None = None
    """The ray executor's cluster; None = RAY_ADDRESS, else a fresh local cluster."""
    min_run_time: float = 0.2
    tasks: tuple[TaskRun, ...] = ()
    variant_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The [options.NAME] tables: applied to NAME wherever it runs."""
    baseline: str | None = None
    """The variant point (its label) that speed-ups are measured against; None: none."""

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


_TOP_LEVEL: dict[str, Any] = {
    "name": str,
    "description": str,
    "variants": list,
    "options": dict,
    "seq_lens": list[int],
    "batch_size": int,
    "d_model": int,
    "num_heads": int,
    "dtype": str,
    "device": str,
    "passes": list[str],
    "measures": list[str],
    "seed": int,
    "threads": int,
    "accuracy_workers": int,
    "executor": str,
    "address": str,
    "baseline": str,
    "timing": dict,
    "tasks": list,
}
_TIMING = {"min_run_time": float}


def _suggest(key: str, valid: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(valid)}"


def _is_instance(value: Any, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin is list:
        (item,) = typing.get_args(expected)
        return isinstance(value, list) and all(_is_instance(v, item) for v in value)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _type_name(expected: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a table"}
    if typing.get_origin(expected) is list:
        return f"a list of {names[typing.get_args(expected)[0]].split(' ', 1)[1]}s"
    return names[expected]


def _is_sweep(value: Any, annotation: Any) -> bool:
    if not isinstance(value, list):
        return False
    options = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    if any(typing.get_origin(option) is tuple for option in options):
        return all(isinstance(item, list) for item in value)  # a list of tuples sweeps
    return True


def expand_variant(
    name: str, options: dict[str, Any], registry: Registry, where: str
) -> list[VariantPoint]:
    """Every point of the sweep over list-valued options, each validated by the variant's
    own config (unknown option, wrong type, invalid value: SpecError naming `where`)."""
    cls = registry.get(name)
    types_by_name = field_types(cls.Config)
    swept = {
        key: value
        for key, value in options.items()
        if key in types_by_name and _is_sweep(value, types_by_name[key])
    }
    fixed = {key: value for key, value in options.items() if key not in swept}
    for key, values in swept.items():
        if not values:
            raise SpecError(f"{where}: option {key!r} sweeps an empty list")
    runs = []
    for point in itertools.product(*swept.values()):
        chosen = {**fixed, **dict(zip(swept, point, strict=True))}
        try:
            build_config(cls.Config, chosen, name)
        except ConfigError as error:
            raise SpecError(f"{where}: {error}") from None
        runs.append(VariantPoint(name, chosen))
    return runs


def load_spec(path: str | Path, registry: Registry) -> Spec:
    """Read and validate a spec file; `path` may also name a bundled spec ("quick")."""
    path = resolve_spec_path(path)
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path}: not valid TOML: {error}") from None

    def fail(key: str, message: str) -> typing.NoReturn:
        raise SpecError(f"{path}: key {key!r}: {message}")

    _check_settings(data, fail)
    variants = _variant_points(data, registry, path, fail)
    if "accuracy" in data.get("measures", []) and not data.get("tasks"):
        fail("tasks", "measures include 'accuracy' but no tasks are given")
    tasks = tuple(
        _task_run(entry, index, registry, path, data.get("seed", Spec.seed))
        for index, entry in enumerate(data.get("tasks", []))
    )
    repeated = _repeated(label for task in tasks for label in (*task.stage_labels, task.label))
    if repeated:
        fail("tasks", f"the task {repeated} is listed more than once; remove the repeated table")
    known = [name for variant in variants for name in (variant.name, variant.label)]
    for index, task in enumerate(tasks):
        for name in task.variants or ():
            if name not in known:
                fail(
                    f"tasks[{index}].variants",
                    f"{name!r} is none of the spec's variant points (a name or a label)"
                    + _suggest(name, known),
                )
    baseline = data.get("baseline")
    labels = [variant.label for variant in variants]
    if baseline is not None and baseline not in labels:
        fail(
            "baseline",
            f"{baseline!r} is not one of the spec's variant points" + _suggest(baseline, labels),
        )
    timing = data.get("timing", {})
    return Spec(
        name=data["name"],
        path=path,
        text=text,
        description=data.get("description", ""),
        variants=tuple(variants),
        seq_lens=tuple(data.get("seq_lens", Spec.seq_lens)),
        batch_size=data.get("batch_size", Spec.batch_size),
        d_model=data.get("d_model", Spec.d_model),
        num_heads=data.get("num_heads", Spec.num_heads),
        dtype=data.get("dtype", Spec.dtype),
        device=data.get("device", Spec.device),
        passes=tuple(data.get("passes", Spec.passes)),
        measures=tuple(data.get("measures", Spec.measures)),
        seed=data.get("seed", Spec.seed),
        threads=data.get("threads", Spec.threads),
        accuracy_workers=data.get("accuracy_workers", Spec.accuracy_workers),
        executor=data.get("executor", Spec.executor),
        address=data.get("address", Spec.address),
        min_run_time=float(timing.get("min_run_time", Spec.min_run_time)),
        tasks=tasks,
        variant_options=data.get("options", {}),
        baseline=baseline,
    )


def _check_settings(data: dict[str, Any], fail: Callable[[str, str], typing.NoReturn]) -> None:
    """The spec's own settings: known keys of the right types, a valid name, timing,
    dtype and device, passes and measures, positive sizes, nothing listed twice."""
    for key, value in data.items():
        if key not in _TOP_LEVEL:
            fail(key, "unknown key" + _suggest(key, _TOP_LEVEL))
        if not _is_instance(value, _TOP_LEVEL[key]):
            fail(key, f"must be {_type_name(_TOP_LEVEL[key])}; got {value!r}")
    if "name" not in data:
        fail("name", "missing: every spec needs a name (results go to results/<name>/)")
    problem = name_problem(data["name"])
    if problem:
        fail("name", problem)
    for key, value in data.get("timing", {}).items():
        if key not in _TIMING:
            fail(f"timing.{key}", "unknown key" + _suggest(key, _TIMING))
        if not _is_instance(value, _TIMING[key]) or value <= 0:
            fail(f"timing.{key}", f"must be a positive number; got {value!r}")
    for key, valid in (("dtype", DTYPES), ("device", ("cpu", "cuda")), ("executor", EXECUTORS)):
        if key in data and data[key] not in valid:
            fail(key, f"{data[key]!r} is not one of {', '.join(valid)}")
    for key, valid in (("passes", PASSES), ("measures", MEASURES)):
        for item in data.get(key, []):
            if item not in valid:
                fail(key, f"{item!r} is not one of {', '.join(valid)}" + _suggest(item, valid))
        if key in data and not data[key]:
            fail(key, f"is empty; give at least one of {', '.join(valid)}")
    for key in ("seq_lens", "batch_size", "d_model", "num_heads", "threads", "accuracy_workers"):
        values = data.get(key, [1]) if key == "seq_lens" else [data.get(key, 1)]
        if not values or any(v < 1 for v in values):
            fail(key, f"must be positive; got {data.get(key)!r}")
    for key in ("seq_lens", "passes", "measures"):
        repeated = _repeated(data.get(key, []))
        if repeated:
            fail(key, f"lists {repeated} more than once; give each once")
    d_model, num_heads = data.get("d_model", Spec.d_model), data.get("num_heads", Spec.num_heads)
    if d_model % num_heads:
        fail("d_model", f"{d_model} is not divisible by num_heads = {num_heads}")


def _variant_points(
    data: dict[str, Any],
    registry: Registry,
    path: Path,
    fail: Callable[[str, str], typing.NoReturn],
) -> list[VariantPoint]:
    """The spec's [[variants]] (every registered variant when it has none), each with the
    [options.NAME] table under its own keys, option sweeps expanded into points."""
    overrides = data.get("options", {})
    for name, options in overrides.items():
        if not isinstance(options, dict):
            fail(f"options.{name}", "must be a table of that variant's options")
        _check_variant_name(name, registry, path, f"options.{name}")
    entries = data.get("variants")
    if entries is None:
        entries = [{"name": name} for name in registry.names()]
    variants: list[VariantPoint] = []
    for index, entry in enumerate(entries):
        where = f"{path}: variants[{index}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise SpecError(
                f'{where}: each variant needs a name, e.g. {{ name = "NAME" }} with NAME one of '
                f"{', '.join(registry.names()) or '(none registered)'}"
            )
        name = entry["name"]
        _check_variant_name(name, registry, path, f"variants[{index}].name")
        options = {**overrides.get(name, {}), **{k: v for k, v in entry.items() if k != "name"}}
        variants.extend(expand_variant(name, options, registry, where))
    repeated = _repeated(variant.label for variant in variants)
    if repeated:
        raise SpecError(
            f"{path}: key 'variants': the point {repeated} is listed more than once (its "
            f"cells would be measured twice); remove the repeated [[variants]] table or value"
        )
    return variants


def name_problem(name: str) -> str | None:
    """Why `name` cannot name the directory <out>/<name>/ of a run; None when it can."""
    if NAME_PATTERN.fullmatch(name):
        return None
    suggestion = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-")
    return (
        f"{name!r} is not a name: results go to <out>/<name>/, so it must be letters, "
        f"digits, '_' or '-', starting with a letter or digit (no '/', '.' or spaces)"
        + (f"; for example {suggestion!r}" if NAME_PATTERN.fullmatch(suggestion) else "")
    )


def _repeated(values: typing.Iterable[Any]) -> str | None:
    """The first value that occurs twice, as repr; None when all differ."""
    seen: set[Any] = set()
    for value in values:
        if value in seen:
            return repr(value)
        seen.add(value)
    return None


def apply_overrides(spec: Spec, registry: Registry, overrides: dict[str, Any]) -> Spec:
    """The command line's --device, --dtype, --seq-lens, --threads, --accuracy-workers and
    --variants on top
    of a loaded spec.

    --variants keeps the spec's sweep of each named variant; a variant the spec does not
    list runs with its defaults and the spec's [options.NAME] table. A length or variant
    named twice is an error naming it."""
    changes: dict[str, Any] = {}
    if overrides.get("device"):
        changes["device"] = overrides["device"]
    if overrides.get("dtype"):
        changes["dtype"] = overrides["dtype"]
    if overrides.get("threads"):
        changes["threads"] = overrides["threads"]
    for key in ("accuracy_workers", "executor", "address"):
        if overrides.get(key):
            changes[key] = overrides[key]
    executor = changes.get("executor", spec.executor)
    if changes.get("address", spec.address) and executor != "ray":
        raise SpecError(
            f"an address is for the ray executor, and this run's executor is {executor!r}; "
            f"add --executor ray (or drop --address)"
        )
    if overrides.get("seq_lens"):
        repeated = _repeated(overrides["seq_lens"])
        if repeated:
            raise SpecError(f"--seq-lens names {repeated} more than once; give each length once")
        changes["seq_lens"] = tuple(overrides["seq_lens"])
    if overrides.get("variants"):
        repeated = _repeated(overrides["variants"])
        if repeated:
            raise SpecError(f"--variants names {repeated} more than once; give each name once")
        chosen: list[VariantPoint] = []
        for name in overrides["variants"]:
            _check_variant_name(name, registry, spec.path, "--variants")
            listed = [v for v in spec.variants if v.name == name]
            chosen.extend(
                listed
                or expand_variant(name, spec.variant_options.get(name, {}), registry, "--variants")
            )
        changes["variants"] = tuple(chosen)
        if spec.baseline not in {variant.label for variant in chosen}:
            changes["baseline"] = None  # not run: no speed-ups rather than an error
    return dataclasses.replace(spec, **changes)


def _task_run(entry: Any, index: int, registry: Registry, path: Path, seed: int) -> TaskRun:
    """A [[tasks]] table: `name`, the task's own options, and the TASK_SETTINGS keys
    (`seeds` is a count, starting at the spec's seed)."""
    where = f"{path}: tasks[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise SpecError(f'{where}: each task needs a name, e.g. {{ name = "mqar" }}')
    try:
        task_cls = registry.get_task(entry["name"])
    except PlaygroundError as error:
        raise SpecError(f"{where}.name: {error}") from None
    settings = {}
    for key, expected in TASK_SETTINGS.items():
        if key in entry:
            value = entry[key]
            if expected is float:
                if not _is_instance(value, float) or not 0 < value < math.inf:
                    raise SpecError(f"{where}.{key}: must be a positive number; got {value!r}")
                value = float(value)
            elif not _is_instance(value, expected) or value < 1:
                raise SpecError(f"{where}.{key}: must be a positive integer; got {value!r}")
            settings[key] = value
    chosen = entry.get("variants")
    if chosen is not None and (
        not isinstance(chosen, list) or not chosen or not all(isinstance(v, str) for v in chosen)
    ):
        raise SpecError(
            f'{where}.variants: must be a non-empty list of variant names or labels, e.g. ["my_variant"]'
        )
    options = {
        k: v
        for k, v in entry.items()
        if k not in ("name", "variants", "curriculum") and k not in TASK_SETTINGS
    }
    try:
        task = task_cls(**options)
    except (PlaygroundError, ValueError, TypeError) as error:
        raise SpecError(f"{where}: {error}") from None
    curriculum = _curriculum(entry.get("curriculum", []), where)
    try:
        *stage_tasks, _ = curriculum_tasks(task_cls, options, curriculum)
    except PlaygroundError as error:
        raise SpecError(f"{where}: {error}") from None
    d_model = settings.get("d_model", MODEL_DEFAULTS["d_model"])
    num_heads = settings.get("num_heads", MODEL_DEFAULTS["num_heads"])
    if d_model % num_heads:
        raise SpecError(f"{where}.d_model: {d_model} is not divisible by num_heads = {num_heads}")
    shape = {k: v for k, v in settings.items() if k in MODEL_DEFAULTS}
    tagged = bool(curriculum)
    return TaskRun(
        name=entry["name"],
        options=options,
        label=training_label(task.label, curriculum=tagged, **shape),
        seeds=tuple(range(seed, seed + settings.pop("seeds", 3))),
        variants=None if chosen is None else tuple(chosen),
        curriculum=curriculum,
        stage_labels=tuple(
            training_label(each.label, curriculum=tagged, **shape) for each in stage_tasks
        ),
        **settings,
    )


STAGE_SETTINGS = ("steps", "batch_size")
"""Keys of a curriculum stage that set its schedule rather than its task's options."""


def _curriculum(entries: Any, where: str) -> tuple[Stage, ...]:
    """A [[tasks]] table's `curriculum`: a list of tables of task options, each with an
    optional `steps` and `batch_size`."""
    example = "e.g. curriculum = [{ seq_len = 64, num_pairs = 4, steps = 600 }]"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SpecError(f"{where}.curriculum: must be a list of tables of task options, {example}")
    stages = []
    for index, entry in enumerate(entries):
        for key in STAGE_SETTINGS:
            if key in entry and (not _is_instance(entry[key], int) or entry[key] < 1):
                raise SpecError(
                    f"{where}.curriculum[{index}].{key}: must be a positive integer; "
                    f"got {entry[key]!r}"
                )
        options = {k: v for k, v in entry.items() if k not in STAGE_SETTINGS}
        if not options:
            raise SpecError(
                f"{where}.curriculum[{index}]: a stage needs at least one task option that "
                f"differs from the task's, {example}"
            )
        stages.append(Stage(options, entry.get("steps"), entry.get("batch_size")))
    return tuple(stages)


def _check_variant_name(name: str, registry: Registry, path: Path, key: str) -> None:
    """UnknownVariant (with suggestions) as a SpecError naming the file and key."""
    try:
        registry.get(name)
    except PlaygroundError as error:
        raise SpecError(f"{path}: key {key!r}: {error}") from None


def resolve_spec_path(path: str | Path) -> Path:
    """A spec file, or the name of a bundled one ("quick" → experiments/quick.toml)."""
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    bundled = bundled_dir("experiments") / f"{candidate.stem}.toml"
    if candidate.suffix in ("", ".toml") and candidate.parent == Path(".") and bundled.is_file():
        return bundled
    available = sorted(p.stem for p in bundled_dir("experiments").glob("*.toml"))
    raise SpecError(
        f"no spec file {str(path)!r}; give a path to a .toml file or one of the shipped "
        f"specs: {', '.join(available) or '(none)'}"
    )
