"""A spec file read into a validated Spec: the TOML parsed (the command line's sizes
merged in), every setting, [[variants]] table and option sweep checked (all problems
listed in one SpecError). playground.run.spec describes the format;
playground.run.spec_overrides applies the command line's other overrides on top."""

from __future__ import annotations

import difflib
import itertools
import re
import tomllib
import types
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any

from playground.config import build_config, field_types
from playground.errors import ConfigError, PlaygroundError
from playground.registry import Registry, bundled_dir
from playground.run.decode_cost import DECODE_RESERVE, MIN_DECODE_CONTEXT
from playground.run.spec import (
    DECODE,
    DTYPES,
    EXECUTORS,
    MEASURES,
    NAME_PATTERN,
    PASSES,
    TASK_SETTINGS,
    Problems,
    Spec,
    SpecError,
    VariantSetup,
    is_instance_of,
    merge_sizes,
    suggest,
    type_name,
    unknown_options,
)
from playground.run.spec_tasks import task_runs

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
    "save_weights": bool,
    "timing": dict,
    "tasks": list,
}
_TIMING = {"min_run_time": float}


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
) -> list[VariantSetup]:
    """Every setup of the sweep over list-valued options, each validated by the variant's
    own config (unknown option, wrong type, invalid value: SpecError naming `where`)."""
    cls = registry.get(name)
    types_by_name = field_types(cls.Config)
    unknown = [key for key in options if key not in types_by_name]
    if unknown:
        raise SpecError(
            f"{where}: variant {name!r} has no option "
            f"{unknown_options(unknown, types_by_name)} (see `playground info {name}`)"
        )
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
        runs.append(VariantSetup(name, chosen))
    return runs


def load_spec(path: str | Path, registry: Registry, sizes: dict[str, Any] | None = None) -> Spec:
    """Read and validate a spec file; `path` may also name a bundled spec ("quick").
    `sizes`: the command line's --seq-lens, --steps, --seeds, --d-model, --num-layers (SIZE_FLAGS),
    merged into the file's settings first (spec.merge_sizes) and validated with them.

    Every part is validated even after an error, and one SpecError lists them all."""
    path = resolve_spec_path(path)
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path}: not valid TOML: {error}") from None
    try:
        data, note = merge_sizes(data, sizes or {})
    except SpecError as error:
        raise SpecError(f"{path}: {error}") from None

    problems = Problems(path, note)
    data = _check_settings(data, problems)  # keys of a wrong type are left out from here
    variants, variants_valid = _variant_setups(data, registry, path, problems)
    if "accuracy" in data.get("measures", []) and not data.get("tasks"):
        problems.key("tasks", "measures include 'accuracy' but no tasks are given")
    # A spec that measures only accuracy has no other use for its top-level width (the
    # module docstring says why a spec that measures both keeps them apart).
    only_accuracy = set(data.get("measures", Spec.measures)) == {"accuracy"}
    widths: dict[str, int] = {
        key: data[key] for key in ("d_model", "num_heads") if key in data and only_accuracy
    }
    tasks = []
    sweeps: list[str] = []
    for index, entry in enumerate(data.get("tasks", [])):
        runs = task_runs(entry, index, registry, data.get("seed", Spec.seed), problems, widths)
        tasks += runs
        # a sweep's label, once per table: the report gives its choice under that label
        sweeps += {run.sweep for run in runs if run.sweep}
    repeated = first_repeated(
        [*(label for task in tasks for label in (*task.stage_labels, task.label)), *sweeps]
    )
    if repeated:
        problems.key(
            "tasks",
            f"the task {repeated} is listed more than once; remove the repeated table (a "
            "sweep's chosen point is reported under the task's own label, so a sweep and "
            "another table of the task would share it: give every value in one table)",
        )
    known = [name for variant in variants for name in (variant.name, variant.label)]
    baseline = data.get("baseline")
    if variants_valid:  # else a name may be missing only because its table was refused
        for index, task in enumerate(tasks):
            for name in task.variants or ():
                if name not in known:
                    problems.key(
                        f"tasks[{index}].variants",
                        f"{name!r} is none of the spec's setups (a variant name or a label)"
                        + suggest(name, known),
                    )
        labels = [variant.label for variant in variants]
        if baseline is not None and baseline not in labels:
            problems.key(
                "baseline",
                f"{baseline!r} is not the label of one of the spec's setups"
                + suggest(baseline, labels),
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
        save_weights=data.get("save_weights", Spec.save_weights),
    )


def _check_settings(data: dict[str, Any], problems: Problems) -> dict[str, Any]:
    """The spec's own settings: known keys of the right types, a valid name, timing,
    dtype and device, passes and measures, positive sizes, nothing listed twice, a Ray
    address. Returns the keys of the right type (the rest were reported), so the checks
    that follow see only values they can read."""
    typed: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _TOP_LEVEL:
            problems.key(key, "unknown key" + _suggest_anywhere(key))
        elif not is_instance_of(value, _TOP_LEVEL[key]):
            problems.key(key, f"must be {type_name(_TOP_LEVEL[key])}; got {value!r}")
        else:
            typed[key] = value
    if "name" not in data:
        problems.key("name", "missing: every spec needs a name (results go to results/<name>/)")
    elif "name" in typed and name_problem(typed["name"]):
        problems.key("name", name_problem(typed["name"]) or "")
    timing = {}
    for key, value in typed.get("timing", {}).items():
        if key not in _TIMING:
            problems.key(f"timing.{key}", "unknown key" + suggest(key, _TIMING))
        elif not is_instance_of(value, _TIMING[key]) or value <= 0:
            problems.key(f"timing.{key}", f"must be a positive number; got {value!r}")
        else:
            timing[key] = value
    if "timing" in typed:
        typed["timing"] = timing
    valid: Collection[str]  # DTYPES' names, or a tuple of them
    for key, valid in (("dtype", DTYPES), ("device", ("cpu", "cuda")), ("executor", EXECUTORS)):
        if key in typed and typed[key] not in valid:
            problems.key(key, f"{typed.pop(key)!r} is not one of {', '.join(valid)}")
    for key, valid in (("passes", PASSES), ("measures", MEASURES)):
        for item in typed.get(key, []):
            if item not in valid:
                problems.key(
                    key, f"{item!r} is not one of {', '.join(valid)}" + suggest(item, valid)
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
        repeated = first_repeated(typed.get(key, []))
        if repeated:
            problems.key(key, f"lists {repeated} more than once; give each once")
    passes, measures = typed.get("passes", Spec.passes), typed.get("measures", Spec.measures)
    if DECODE in passes and "speed" not in measures:
        problems.key("passes", "'decode' times decoding steps: add 'speed' to measures")
    short = [n for n in typed.get("seq_lens", Spec.seq_lens) if n < MIN_DECODE_CONTEXT]
    if DECODE in passes and short:
        problems.key(
            "seq_lens",
            f"{short} too short to decode at: a decode cell times its steps within the "
            f"{DECODE_RESERVE} tokens below the context length, and needs "
            f"{MIN_DECODE_CONTEXT} at the least; give longer lengths, or drop 'decode'",
        )
    if set(passes) == {DECODE} and {"memory", "fidelity"} & set(measures):
        problems.key(
            "measures",
            "'memory' and 'fidelity' measure whole passes, not decoding steps (a decode row "
            "carries its state's bytes): add 'forward' to passes, or drop them",
        )
    if "address" in typed:
        problem = address_problem(typed["address"])
        if problem:
            problems.key("address", problem)
    d_model, num_heads = typed.get("d_model", Spec.d_model), typed.get("num_heads", Spec.num_heads)
    refused = any(key in data and key not in typed for key in ("d_model", "num_heads"))
    if not refused and d_model % num_heads:  # a refused one was named above
        problems.key("d_model", f"{d_model} is not divisible by num_heads = {num_heads}")
    return typed


def _suggest_anywhere(key: str) -> str:
    """The nearest top-level key; else the nearest key of a [[tasks]] or [timing] table,
    saying where it belongs (a top-level `step = 60` meant a table's `steps`)."""
    if difflib.get_close_matches(key, list(_TOP_LEVEL), n=1):
        return suggest(key, _TOP_LEVEL)
    for table, keys in (("each [[tasks]] table", TASK_SETTINGS), ("[timing]", _TIMING)):
        close = difflib.get_close_matches(key, list(keys), n=1)
        if close:
            return f"; did you mean {close[0]!r}? It is a key of {table}, not of the top level"
    return suggest(key, _TOP_LEVEL)


def _variant_setups(
    data: dict[str, Any], registry: Registry, path: Path, problems: Problems
) -> tuple[list[VariantSetup], bool]:
    """The spec's [[variants]] (every registered variant when it has none), each with the
    [options.NAME] table under its own keys, option sweeps expanded into setups; and
    whether every table was valid (a refused one is in `problems`, not in the list)."""
    valid = True
    overrides = {}
    for name, options in data.get("options", {}).items():
        if not isinstance(options, dict):
            problems.key(f"options.{name}", "must be a table of that variant's options")
            valid = False
            continue
        try:
            check_variant_name(name, registry, path, f"options.{name}")
        except SpecError as error:
            problems.add(str(error))
            valid = False
            continue
        overrides[name] = options
    entries = data.get("variants")
    if entries is None:
        entries = [{"name": name} for name in registry.names()]
    variants: list[VariantSetup] = []
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
            check_variant_name(name, registry, path, f"variants[{index}].name")
            options = {
                **overrides.get(name, {}),
                **{k: v for k, v in entry.items() if k != "name"},
            }
            variants.extend(expand_variant(name, options, registry, where))
        except SpecError as error:
            problems.add(str(error))
            valid = False
    repeated = first_repeated(variant.label for variant in variants)
    if repeated:
        problems.key(
            "variants",
            f"the setup {repeated} is listed more than once (its cells would be measured "
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


def first_repeated(values: typing.Iterable[Any]) -> str | None:
    """The first value that occurs twice, as repr; None when all differ."""
    seen: set[Any] = set()
    for value in values:
        if value in seen:
            return repr(value)
        seen.add(value)
    return None


def check_variant_name(name: str, registry: Registry, path: Path, key: str) -> None:
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
