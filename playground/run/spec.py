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

The top-level `d_model` and `num_heads` are the width of the speed, memory and fidelity
cells. In a spec that measures only accuracy they have no such cells, so there they are
the tasks' width (where a [[tasks]] table does not set its own) rather than being
ignored. A spec that measures both keeps the tasks at their own small model
(MODEL_DEFAULTS, or the table's `d_model` and `num_heads`): the speed cells' width would
make training slow on a CPU.

The spec is validated whole: a spec with several errors is refused with all of them
listed, each naming its key, so one edit fixes them all.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from playground.config import build_config, field_types
from playground.errors import ConfigError, PlaygroundError
from playground.registry import Registry, bundled_dir
from playground.run.accuracy import MODEL_DEFAULTS, Stage, curriculum_tasks, training_label
from playground.tasks import Task

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


class _Problems:
    """Every error found in one spec, so that a spec with several is refused once with all
    of them listed rather than one per attempt."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[str] = []

    def add(self, message: str) -> None:
        """A problem, as a message that may start with the spec's path (dropped here)."""
        prefix = f"{self.path}: "
        self.messages.append(message[len(prefix) :] if message.startswith(prefix) else message)

    def key(self, key: str, message: str) -> None:
        self.add(f"key {key!r}: {message}")

    def raise_if_any(self) -> None:
        """One SpecError naming the file and every problem; nothing when there is none."""
        if len(self.messages) == 1:
            raise SpecError(f"{self.path}: {self.messages[0]}")
        if self.messages:
            listed = "\n".join(f"  - {message}" for message in self.messages)
            raise SpecError(
                f"{self.path}: {len(self.messages)} problems (fix them all, then run "
                f"again):\n{listed}"
            )


RAY_ADDRESS = re.compile(
    r"(?:ray://)?(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
    r":(?P<port>[0-9]{1,5})"
)
"""host:port as `ray start --head` prints it, or ray://host:port for Ray Client."""


def address_problem(address: str) -> str | None:
    """Why `address` cannot name a Ray cluster; None when it can. Checked before the run
    directory is made: Ray's own error for a malformed address is a raw traceback."""
    if address in ("auto", "local"):
        return None
    match = RAY_ADDRESS.fullmatch(address)
    if match and 1 <= int(match["port"]) <= 65535:
        return None
    return (
        f"{address!r} is not a Ray cluster address; give host:port as `ray start --head` "
        f'prints it (e.g. "10.0.0.1:6379"), "ray://host:10001" for Ray Client, or "auto" for '
        f"the cluster this machine has joined; leave it out to start a fresh local cluster"
    )


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
    """Read and validate a spec file; `path` may also name a bundled spec ("quick").

    Every part is validated even after an error, and one SpecError lists them all."""
    path = resolve_spec_path(path)
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path}: not valid TOML: {error}") from None

    problems = _Problems(path)
    data = _check_settings(data, problems)  # keys of a wrong type are left out from here
    variants, variants_valid = _variant_points(data, registry, path, problems)
    if "accuracy" in data.get("measures", []) and not data.get("tasks"):
        problems.key("tasks", "measures include 'accuracy' but no tasks are given")
    # A spec that measures only accuracy has no other use for its top-level width (the
    # module docstring says why a spec that measures both keeps them apart).
    only_accuracy = set(data.get("measures", Spec.measures)) == {"accuracy"}
    widths = {key: data[key] for key in ("d_model", "num_heads") if key in data and only_accuracy}
    tasks = []
    for index, entry in enumerate(data.get("tasks", [])):
        task = _task_run(
            entry, index, registry, path, data.get("seed", Spec.seed), problems, widths
        )
        if task is not None:
            tasks.append(task)
    repeated = _repeated(label for task in tasks for label in (*task.stage_labels, task.label))
    if repeated:
        problems.key(
            "tasks", f"the task {repeated} is listed more than once; remove the repeated table"
        )
    known = [name for variant in variants for name in (variant.name, variant.label)]
    baseline = data.get("baseline")
    if variants_valid:  # else a name may be missing only because its table was refused
        for index, task in enumerate(tasks):
            for name in task.variants or ():
                if name not in known:
                    problems.key(
                        f"tasks[{index}].variants",
                        f"{name!r} is none of the spec's variant points (a name or a label)"
                        + _suggest(name, known),
                    )
        labels = [variant.label for variant in variants]
        if baseline is not None and baseline not in labels:
            problems.key(
                "baseline",
                f"{baseline!r} is not one of the spec's variant points"
                + _suggest(baseline, labels),
            )
    problems.raise_if_any()
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
        tasks=tuple(tasks),
        variant_options=data.get("options", {}),
        baseline=baseline,
    )


def _check_settings(data: dict[str, Any], problems: _Problems) -> dict[str, Any]:
    """The spec's own settings: known keys of the right types, a valid name, timing,
    dtype and device, passes and measures, positive sizes, nothing listed twice, a Ray
    address. Returns the keys of the right type (the rest were reported), so the checks
    that follow see only values they can read."""
    typed: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _TOP_LEVEL:
            problems.key(key, "unknown key" + _suggest(key, _TOP_LEVEL))
        elif not _is_instance(value, _TOP_LEVEL[key]):
            problems.key(key, f"must be {_type_name(_TOP_LEVEL[key])}; got {value!r}")
        else:
            typed[key] = value
    if "name" not in data:
        problems.key("name", "missing: every spec needs a name (results go to results/<name>/)")
    elif "name" in typed and name_problem(typed["name"]):
        problems.key("name", name_problem(typed["name"]) or "")
    timing = {}
    for key, value in typed.get("timing", {}).items():
        if key not in _TIMING:
            problems.key(f"timing.{key}", "unknown key" + _suggest(key, _TIMING))
        elif not _is_instance(value, _TIMING[key]) or value <= 0:
            problems.key(f"timing.{key}", f"must be a positive number; got {value!r}")
        else:
            timing[key] = value
    if "timing" in typed:
        typed["timing"] = timing
    for key, valid in (("dtype", DTYPES), ("device", ("cpu", "cuda")), ("executor", EXECUTORS)):
        if key in typed and typed[key] not in valid:
            problems.key(key, f"{typed.pop(key)!r} is not one of {', '.join(valid)}")
    for key, valid in (("passes", PASSES), ("measures", MEASURES)):
        for item in typed.get(key, []):
            if item not in valid:
                problems.key(
                    key, f"{item!r} is not one of {', '.join(valid)}" + _suggest(item, valid)
                )
        if key in typed and not typed[key]:
            problems.key(key, f"is empty; give at least one of {', '.join(valid)}")
    for key in ("seq_lens", "batch_size", "d_model", "num_heads", "threads", "accuracy_workers"):
        if key not in typed:
            continue
        values = typed[key] if key == "seq_lens" else [typed[key]]
        if not values or any(v < 1 for v in values):
            problems.key(key, f"must be positive; got {typed.pop(key)!r}")
    for key in ("seq_lens", "passes", "measures"):
        repeated = _repeated(typed.get(key, []))
        if repeated:
            problems.key(key, f"lists {repeated} more than once; give each once")
    if "address" in typed:
        problem = address_problem(typed["address"])
        if problem:
            problems.key("address", problem)
    d_model, num_heads = typed.get("d_model", Spec.d_model), typed.get("num_heads", Spec.num_heads)
    refused = any(key in data and key not in typed for key in ("d_model", "num_heads"))
    if not refused and d_model % num_heads:  # a refused one was named above
        problems.key("d_model", f"{d_model} is not divisible by num_heads = {num_heads}")
    return typed


def _variant_points(
    data: dict[str, Any], registry: Registry, path: Path, problems: _Problems
) -> tuple[list[VariantPoint], bool]:
    """The spec's [[variants]] (every registered variant when it has none), each with the
    [options.NAME] table under its own keys, option sweeps expanded into points; and
    whether every table was valid (a refused one is in `problems`, not in the list)."""
    valid = True
    overrides = {}
    for name, options in data.get("options", {}).items():
        if not isinstance(options, dict):
            problems.key(f"options.{name}", "must be a table of that variant's options")
            valid = False
            continue
        try:
            _check_variant_name(name, registry, path, f"options.{name}")
        except SpecError as error:
            problems.add(str(error))
            valid = False
            continue
        overrides[name] = options
    entries = data.get("variants")
    if entries is None:
        entries = [{"name": name} for name in registry.names()]
    variants: list[VariantPoint] = []
    for index, entry in enumerate(entries):
        where = f"{path}: variants[{index}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        try:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise SpecError(
                    f'{where}: each variant needs a name, e.g. {{ name = "NAME" }} with NAME '
                    f"one of {', '.join(registry.names()) or '(none registered)'}"
                )
            name = entry["name"]
            _check_variant_name(name, registry, path, f"variants[{index}].name")
            options = {
                **overrides.get(name, {}),
                **{k: v for k, v in entry.items() if k != "name"},
            }
            variants.extend(expand_variant(name, options, registry, where))
        except SpecError as error:
            problems.add(str(error))
            valid = False
    repeated = _repeated(variant.label for variant in variants)
    if repeated:
        problems.key(
            "variants",
            f"the point {repeated} is listed more than once (its cells would be measured "
            f"twice); remove the repeated [[variants]] table or value",
        )
    return variants, valid


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
    for key in ("accuracy_workers", "executor"):
        if overrides.get(key):
            changes[key] = overrides[key]
    if overrides.get("address") is not None:  # "" too: refused below, not dropped
        problem = address_problem(overrides["address"])
        if problem:
            raise SpecError(f"--address: {problem}")
        changes["address"] = overrides["address"]
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


def _task_run(
    entry: Any,
    index: int,
    registry: Registry,
    path: Path,
    seed: int,
    problems: _Problems,
    widths: dict[str, int] | None = None,
) -> TaskRun | None:
    """A [[tasks]] table: `name`, the task's own options, and the TASK_SETTINGS keys
    (`seeds` is a count, starting at the spec's seed). `widths`: the spec's top-level
    d_model and num_heads, where it sets them, for a table that does not. Each problem
    goes to `problems` (all of them, as far as they can be told apart); None then."""
    where = f"tasks[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        problems.add(f'{where}: each task needs a name, e.g. {{ name = "mqar" }}')
        return None
    found = len(problems.messages)
    try:
        task_cls = registry.get_task(entry["name"])
    except PlaygroundError as error:
        problems.add(f"{where}.name: {error}")
        return None
    settings = {}
    for key, expected in TASK_SETTINGS.items():
        if key in entry:
            value = entry[key]
            if expected is float:
                if not _is_instance(value, float) or not 0 < value < math.inf:
                    problems.add(f"{where}.{key}: must be a positive number; got {value!r}")
                    continue
                value = float(value)
            elif not _is_instance(value, expected) or value < 1:
                problems.add(f"{where}.{key}: must be a positive integer; got {value!r}")
                continue
            settings[key] = value
    chosen = entry.get("variants")
    if chosen is not None and (
        not isinstance(chosen, list) or not chosen or not all(isinstance(v, str) for v in chosen)
    ):
        problems.add(
            f"{where}.variants: must be a non-empty list of variant names or labels, "
            f'e.g. ["my_variant"]'
        )
    options = {
        k: v
        for k, v in entry.items()
        if k not in ("name", "variants", "curriculum") and k not in TASK_SETTINGS
    }
    try:
        task = task_cls(**options)
    except (PlaygroundError, ValueError, TypeError) as error:
        problems.add(f"{where}: {error}")
        task = None
    try:
        curriculum = _curriculum(entry.get("curriculum", []), where)
    except SpecError as error:
        problems.add(str(error))
        curriculum = ()
    stage_tasks: list[Task] = []
    if task is not None:
        try:
            *stage_tasks, _ = curriculum_tasks(task_cls, options, curriculum)
        except PlaygroundError as error:
            problems.add(f"{where}: {error}")
    inherited = {k: v for k, v in (widths or {}).items() if k not in settings}
    settings.update(inherited)  # a width the table leaves out is the spec's, if it sets one
    d_model = settings.get("d_model", MODEL_DEFAULTS["d_model"])
    num_heads = settings.get("num_heads", MODEL_DEFAULTS["num_heads"])
    if d_model % num_heads:
        source = f" (the spec's top-level {', '.join(inherited)})" if inherited else ""
        problems.add(
            f"{where}.d_model: {d_model} is not divisible by num_heads = {num_heads}{source}; "
            f"set both in the [[tasks]] table"
        )
    if task is not None:
        for stage, (stage_task, key) in enumerate(
            [(t, f"curriculum[{i}].batch_size") for i, t in enumerate(stage_tasks)]
            + [(task, "batch_size")]
        ):
            schedule = curriculum[stage] if stage < len(stage_tasks) else None
            batch_size = (
                schedule.batch_size if schedule else settings.get("batch_size")
            ) or stage_task.default_batch_size
            if batch_size > stage_task.num_train:
                problems.add(
                    f"{where}.{key}: {batch_size} is more than the {stage_task.num_train} "
                    f"training examples task {stage_task.label!r} generates, so every step "
                    f"would train on all of them; use at most {stage_task.num_train}"
                )
    if task is None or len(problems.messages) > found:
        return None
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
