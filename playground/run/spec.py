"""Experiment specs as data: a Spec, its setups (VariantSetup) and tasks (TaskRun), and
the helpers its validation shares. Specs are TOML files in experiments/, read and
validated whole by playground.run.spec_loading before anything runs; an error names the
file and the key and says what would be valid.

    name = "quick"                       # results go to results/<name>/<timestamp>/
    description = "..."
    seq_lens = [256, 512, 1024]
    batch_size = 1
    d_model = 512
    num_heads = 8
    dtype = "float32"                    # float32 | float64 | bfloat16 | float16
    device = "cpu"                       # cpu | cuda
    passes = ["forward", "forward_backward"]  # and "decode": one generated token at each
                                         # length as its context (run/decode.py; needs
                                         # "speed", and lengths of MIN_DECODE_CONTEXT on)
    measures = ["speed", "memory", "fidelity"]
    seed = 0
    threads = 2                          # torch threads to measure with (default: torch's own)
    accuracy_workers = 2                 # one-thread processes training accuracy seeds
                                         # side by side (default: one per core on a CPU)
    executor = "local"                   # local | ray (pip install 'attention-playground[ray]')
    address = "10.0.0.1:6379"            # the ray executor's cluster (default: RAY_ADDRESS,
                                         # else a fresh local one)
    baseline = "vanilla"                 # speed-ups are against this setup (default: none)

    [timing]
    min_run_time = 0.2                   # seconds of timed runs per cell (after warm-up)

    [[variants]]                         # omit to run every registered variant
    name = "linformer"
    k = [64, 128, 256]                   # a list sweeps the option...
    seq_len = 4096

    [options.linformer]                  # ...and [options.NAME] sets options of a variant
    seq_len = 16384                      # whether it is listed or picked up automatically

A [[tasks]] table sweeps its training settings the same way (SWEEPABLE): with
`learning_rate = [1e-3, 3e-3, 1e-2]` and `weight_decay = [0.0, 0.1]` every combination
trains, as a cell labelled with its point (`mqar learning_rate=0.001 weight_decay=0.0`);
the report picks each setup's point on the validation split and reports its test score
(playground.report.sweeps).

A variant option's list is a sweep unless the option itself is a tuple: `global_tokens = [0]` is one value,
`global_tokens = [[0], [0, 1]]` sweeps two.

`name` names a directory under the results root, so it is a name, never a path: letters,
digits, `_` and `-`. No cell may appear twice: a repeated length, pass, setup or
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

import difflib
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from playground.errors import ConfigError
from playground.model.transformer import ArchitectureName, PositionalEncodingName
from playground.run.curriculum import Stage
from playground.run.model_settings import MODEL_DEFAULTS

EXECUTORS = ("local", "ray")

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DECODE = "decode"
"""The pass that prefills to the cell's length and times single decoding steps there."""
PASSES = ("forward", "forward_backward", DECODE)
MEASURES = ("speed", "memory", "fidelity", "accuracy")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
"""A spec's name: the directory results/<name>/ is made of it, so no `/`, `.` or space."""


class SpecError(ConfigError):
    """An experiment spec is malformed; the message names the file and key."""


class Problems:
    """Every error found in one spec, so that a spec with several is refused once with all
    of them listed rather than one per attempt."""

    def __init__(self, path: Path, note: str = "") -> None:
        self.path = path
        self.messages: list[str] = []
        self.note = note
        """Said after the problems: what the command line merged into the spec."""

    def add(self, message: str) -> None:
        """A problem, as a message that may start with the spec's path (dropped here);
        once, however many points of a sweep find it."""
        prefix = f"{self.path}: "
        message = message[len(prefix) :] if message.startswith(prefix) else message
        if message not in self.messages:
            self.messages.append(message)

    def key(self, key: str, message: str) -> None:
        self.add(f"key {key!r}: {message}")

    def unknown(self, where: str, keys: typing.Iterable[str], valid: typing.Iterable[str]) -> bool:
        """A problem per key of `keys` that is not in `valid`, each with the nearest valid
        key (a typo: `step` -> did you mean 'steps'?); whether there was one."""
        valid = list(valid)
        unknown = [key for key in keys if key not in valid]
        for key in unknown:
            self.add(f"{where}.{key}: unknown key" + suggest(key, valid))
        return bool(unknown)

    def raise_if_any(self) -> None:
        """One SpecError naming the file and every problem; nothing when there is none."""
        if len(self.messages) == 1:
            note = f" ({self.note})" if self.note else ""
            raise SpecError(f"{self.path}: {self.messages[0]}{note}")
        if self.messages:
            listed = "\n".join(f"  - {message}" for message in self.messages)
            note = f"{self.note}; " if self.note else ""
            raise SpecError(
                f"{self.path}: {len(self.messages)} problems ({note}fix them all, then run "
                f"again):\n{listed}"
            )


@dataclass(frozen=True)
class VariantSetup:
    """A setup: one registered variant with one concrete set of options (a point of a
    sweep), known by its label."""

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
    """The setups that train on this task, by variant name (every setup of it) or label;
    None = every setup of the spec."""
    curriculum: tuple[Stage, ...] = ()
    """Stages trained first, in order, on the same model; each is scored too."""
    stage_labels: tuple[str, ...] = ()
    """The label each stage's row is recorded under (the task's own is `label`)."""
    positional_encoding: PositionalEncodingName = "auto"
    """The model's own positions; "none" trains without them (NoPE)."""
    architecture: ArchitectureName = "playground"
    """The network the variant trains in: the playground's model, or "hf_llama"."""
    eval_lengths: tuple[int, ...] = ()
    """A language task's evaluation lengths beside its training length."""
    settings_label: str = ""
    """The model settings that differ from the defaults and that the grid does not sweep."""
    weight_decay: float | None = None
    """AdamW's decoupled weight decay; None = TrainConfig's default."""
    grid: dict[str, Any] = field(default_factory=dict)
    """This cell's point of the table's sweep (the list-valued TASK_SETTINGS), e.g.
    {"learning_rate": 0.001}; empty outside a sweep."""
    sweep: str = ""
    """The label every point of the sweep shares (`label` less its grid tag); the report
    chooses among them on validation. "" outside a sweep."""

    def trains(self, variant: VariantSetup) -> bool:
        """Whether `variant` trains on this task."""
        return self.variants is None or bool({variant.name, variant.label} & set(self.variants))


TASK_SETTINGS = {
    "seeds": int,
    "steps": int,
    "d_model": int,
    "num_heads": int,
    "num_layers": int,
    "learning_rate": float,
    "weight_decay": float,
    "batch_size": int,
    "positional_encoding": str,
    "architecture": str,
    "eval_lengths": list[int],
}
"""Keys of a [[tasks]] table that set up training rather than the task itself."""

SWEEPABLE = tuple(key for key in TASK_SETTINGS if key not in ("seeds", "eval_lengths"))
"""The TASK_SETTINGS a [[tasks]] table may give as a list of values to sweep: every
combination is a cell (`learning_rate = [1e-3, 3e-3]`); seeds and eval_lengths are not
hyperparameters to choose."""


@dataclass(frozen=True)
class Spec:
    name: str
    path: Path
    text: str
    description: str = ""
    variants: tuple[VariantSetup, ...] = ()
    seq_lens: tuple[int, ...] = (256, 512, 1024)
    batch_size: int = 1
    d_model: int = 512
    num_heads: int = 8
    dtype: str = "float32"
    device: str = "cpu"
    passes: tuple[str, ...] = ("forward", "forward_backward")
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
    """The setup (its label) that speed-ups are measured against; None: none."""
    save_weights: bool = False
    """Keep every trained seed's final weights in the run directory (weights/), for
    `playground eval` to score again at new lengths."""

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


STAGE_SETTINGS = ("steps", "batch_size")
"""Keys of a curriculum stage that set its schedule rather than its task's options."""

SIZE_FLAGS = {
    "steps": "--steps",
    "seeds": "--seeds",
    "d_model": "--d-model",
    "num_layers": "--num-layers",
}
"""The run's common sizes the command line may set (overrides.json keeps them), by the
flag that sets them: merged into the spec's TOML before it is validated (`merge_sizes`)."""
MERGED_FLAGS = {"seq_lens": "--seq-lens", **SIZE_FLAGS}
"""Every command-line setting merged into the spec's TOML before it is validated, so that
a length or a size is validated once, by the spec's own rules, whichever gave it."""


def suggest(key: str, valid: typing.Iterable[str]) -> str:
    """The end of an error message: the nearest valid key, else every valid one."""
    valid = list(valid)
    close = difflib.get_close_matches(key, valid, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(valid)}"


def unknown_options(unknown: typing.Iterable[str], valid: typing.Iterable[str]) -> str:
    """`'windw' (did you mean 'window'?), 'x'; valid options: ...`: each unknown option
    with its nearest valid one where there is one, then every valid one."""
    valid = list(valid)
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, valid, n=1)
        named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"{', '.join(named)}; valid options: {', '.join(valid) or '(none)'}"


def merge_sizes(data: dict[str, Any], sizes: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The spec's TOML `data` with the command line's `sizes` (MERGED_FLAGS) written in, and
    a note naming them for an error message: `seq_lens` at the top level, `steps`, `seeds` and `num_layers` in every
    [[tasks]] table (`steps` in each curriculum stage too), `d_model` in every table and,
    where the spec measures costs, at the top level (the cost cells' width). The merged data is validated as the file's own
    would be. SpecError when a flag would set nothing (a spec with no tasks)."""
    given = {key: value for key, value in sizes.items() if value is not None}
    if not given:
        return data, ""
    merged = dict(data)
    if "seq_lens" in given:  # the cost cells' lengths
        merged["seq_lens"] = list(given["seq_lens"])
    tables = data.get("tasks")
    untrained = [MERGED_FLAGS[key] for key in given if key not in ("d_model", "seq_lens")]
    if untrained and not (isinstance(tables, list) and tables):
        raise SpecError(
            f"{', '.join(untrained)} set the training of a spec's [[tasks]] tables, and this "
            f"spec has none (it measures {', '.join(data.get('measures', ['costs']))}); drop "
            f"{', '.join(untrained)}"
        )
    if "d_model" in given and set(data.get("measures", Spec.measures)) - {"accuracy"}:
        merged["d_model"] = given["d_model"]  # the cost cells' (the tasks get theirs below)
    trained = {key: value for key, value in given.items() if key != "seq_lens"}
    if isinstance(tables, list) and trained:
        merged["tasks"] = [
            _sized_table(table, trained) if isinstance(table, dict) else table for table in tables
        ]
    note = ", ".join(
        f"{MERGED_FLAGS[key]} {','.join(map(str, value)) if key == 'seq_lens' else value}"
        for key, value in given.items()
    )
    return merged, f"the command line's {note} merged into the spec"


def _sized_table(table: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    sized = {**table, **sizes}
    stages = table.get("curriculum")
    if "steps" in sizes and isinstance(stages, list):
        sized["curriculum"] = [
            {**stage, "steps": sizes["steps"]} if isinstance(stage, dict) else stage
            for stage in stages
        ]
    return sized


def is_instance_of(value: Any, expected: Any) -> bool:
    """Whether a TOML value has the `expected` type (`list[int]` too); a bool is neither
    an int nor a float here, and an int is a float."""
    origin = typing.get_origin(expected)
    if origin is list:
        (item,) = typing.get_args(expected)
        return isinstance(value, list) and all(is_instance_of(v, item) for v in value)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def type_name(expected: Any) -> str:
    """`expected` in words for an error message: "an integer", "a list of strings"."""
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "a table",
        bool: "true or false",
    }
    if typing.get_origin(expected) is list:
        return f"a list of {names[typing.get_args(expected)[0]].split(' ', 1)[1]}s"
    return names[expected]
