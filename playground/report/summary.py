"""What a run's rows say, condensed: one line per (setup, pass, n) with the
speed-up over the spec's baseline setup at the same n, and the fitted log-log
exponents of time and memory over n per (setup, pass); written to summary.csv
(and the accuracy rows to accuracy.csv, the language-model rows to lm_summary.csv:
`report.language`). `report.tables` prints the lines.

How sure each number is, is said beside it:
- IQR only where a spread exists (three or more timed runs; older rows timed once show
  none rather than 0);
- `flags` per line (measure.cost_flags): derived again from the row's own fields, so rows
  written before flags existed get them too;
- efficiency against the run's best GEMM ceiling (env.json `gemm_flops_per_s`, the faster
  of the start's and the end's) for the rows measured on the runner's node and threads,
  and a decode step's bandwidth efficiency likewise against its best memory bandwidth
  (`memory_bandwidth_bytes_per_s`);
- exponents with their standard error from three or more lengths, marked as a two-point
  slope from two, and as doubtful (`DOUBTFUL`, "?") when the error is large or the slope
  is implausible: negative, or above `MAX_PLAUSIBLE_EXPONENT`; the figures show only
  exponents fitted from three or more lengths that are not doubtful;
- `baseline_missing` on every line, and a note, when the spec names a baseline that was
  not run.
"""

from __future__ import annotations

import csv
import io
import math
import re
import tomllib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from playground.report.task_rows import (
    LANGUAGE_COLUMNS,
    LANGUAGE_SUMMARY,
    is_accuracy_row,
    language_records,
)
from playground.run.instruments import (
    FLAG_EFFICIENCY_ABOVE_1,
    FLAG_PASS_ORDER,
    FLAGS,
    MIN_SPREAD_RUNS,
    UNCERTAIN_EXPONENT,
    ScalingFit,
    cost_flags,
    fit_scaling,
)
from playground.run.row_schema import Row
from playground.run.store import ACCURACY, ENV, SPEC, SUMMARY, DamagedRun, RunStore

OK = "ok"
PASS_TITLES = {
    "forward": "forward",
    "forward_backward": "forward + backward",
    "decode": "decode step",
}
"""How a pass is named in tables, figure titles and legends."""


@dataclass(frozen=True)
class Line:
    label: str
    variant: str
    pass_name: str
    seq_len: int
    status: str
    time_ms: float | None
    time_iqr_ms: float | None
    peak_memory_mib: float | None
    efficiency: float | None
    speedup_vs_baseline: float | None
    """The baseline's time over this line's, at the same pass and n."""
    fidelity_rel_error: float | None
    fidelity_local_rel_error: float | None
    fidelity_cosine: float | None
    fidelity_local_attention_distance: float | None
    time_exponent: float | None
    memory_exponent: float | None
    error: str | None
    time_exponent_stderr: float | None = None
    memory_exponent_stderr: float | None = None
    exponent_lengths: int = 0
    """How many lengths the exponents were fitted from (2: a two-point slope)."""
    timed_runs: int | None = None
    load_average: float | None = None
    flags: str = ""
    """The row's quality flags (measure.FLAGS), joined by "; "; empty when none."""
    baseline_missing: str | None = None
    """The spec's baseline label when it has no timed ok row in the run (not run)."""
    fidelity_reference: str | None = None
    time_fit: ScalingFit | None = None
    memory_fit: ScalingFit | None = None
    state_mib: float | None = None
    """Decode pass: the decoding state per sequence at the context length."""
    bandwidth_efficiency: float | None = None
    """Decode pass: reading the state once at the measured bandwidth, over the step's time."""


def scaling_fits(
    rows: Iterable[Row],
) -> tuple[ScalingFit | None, ScalingFit | None]:
    """Time and memory log-log fits over the ok rows of one (setup, pass); None
    where fewer than two lengths were measured."""
    rows = [r for r in rows if r["status"] == "ok"]

    def fit(key: Literal["time_ms", "peak_memory_bytes", "state_bytes"]) -> ScalingFit | None:
        points = [(r["seq_len"], value) for r in rows if (value := r.get(key))]
        if len({n for n, _ in points}) < 2:
            return None
        return fit_scaling([n for n, _ in points], [v for _, v in points])

    # A decode row's memory is its state's bytes at the context length (no profile).
    return fit("time_ms"), fit("peak_memory_bytes") or fit("state_bytes")


MAX_PLAUSIBLE_EXPONENT = 3.0
"""No attention's time or memory grows faster than n³ (exact attention's grow as n²): a
steeper slope is noise or an overhead that changed between lengths."""
DOUBTFUL = "?"
"""The mark after a doubtful exponent in the tables; `DOUBTFUL_NOTE` says what it means."""
DOUBTFUL_NOTE = (
    f"{DOUBTFUL}: doubtful, do not read it as a scaling law: negative (neither time nor "
    f"memory shrinks as n grows: noise or a fixed overhead), above "
    f"{MAX_PLAUSIBLE_EXPONENT:g}, or a standard error above {UNCERTAIN_EXPONENT}; "
    f"measure more lengths"
)


def doubtful(fit: ScalingFit) -> bool:
    """Whether a fit's slope is implausible or too unsure to read: negative, above
    MAX_PLAUSIBLE_EXPONENT, or a standard error above UNCERTAIN_EXPONENT. A plausible
    two-point slope is not doubtful, only marked as a two-point slope."""
    unsure = fit.stderr is not None and fit.stderr > UNCERTAIN_EXPONENT
    return unsure or fit.exponent < 0 or fit.exponent > MAX_PLAUSIBLE_EXPONENT


def exponent_text(fit: ScalingFit | None) -> str:
    """A fit as the tables show it: `1.98 ± 0.02`, `1.90 (2-point slope)`,
    `-0.69 (2-point slope) ?`; "-" where fewer than two lengths were measured."""
    if fit is None:
        return "-"
    return fit.text() + (f" {DOUBTFUL}" if doubtful(fit) else "")


def exponents(rows: Iterable[Row]) -> tuple[float | None, float | None]:
    """Time and memory exponents of one (setup, pass) that can be shown as facts
    (figure legends): None from fewer than three lengths or when the fit is doubtful;
    the tables show those with their caveat."""

    def shown(fit: ScalingFit | None) -> float | None:
        if fit is None or fit.stderr is None or fit.lengths < 3 or doubtful(fit):
            return None
        return fit.exponent

    time_fit, memory_fit = scaling_fits(rows)
    return shown(time_fit), shown(memory_fit)


def row_flags(row: Row, efficiency: float | None) -> list[str]:
    """A cost row's flags: those it carries, less an efficiency flag (judged again on
    `efficiency`, the summary's), plus those its fields show (rows written before flags
    existed included)."""
    runs = row.get("timed_runs")
    time_ms, iqr_ms = row.get("time_ms"), row.get("time_iqr_ms")
    derived = cost_flags(
        time_s=time_ms,
        iqr_s=iqr_ms if runs is None or runs >= MIN_SPREAD_RUNS else None,
        runs=runs if time_ms is not None else None,
        efficiency=efficiency,
        load=row.get("load_average"),
        cores=row.get("cores"),
    )
    carried = [flag for flag in row.get("flags") or [] if flag != FLAG_EFFICIENCY_ABOVE_1]
    found = set(carried) | set(derived)
    ordered = [flag for flag in FLAGS if flag in found]
    return ordered + sorted(found - set(FLAGS))


Ceilings = dict[tuple[Any, Any, str], float]
"""(node, threads, rate) -> the best rate measured there (env.json's, for the runner):
rate "gemm_flops_per_s" (the GEMM ceiling) or "bandwidth_bytes_per_s" (decode steps')."""
Rate = Literal["gemm_flops_per_s", "bandwidth_bytes_per_s"]
"""A row's rate that an efficiency is against."""
RATES: dict[Rate, tuple[Literal["efficiency", "bandwidth_efficiency"], str]] = {
    "gemm_flops_per_s": ("efficiency", "gemm_flops_per_s"),
    "bandwidth_bytes_per_s": ("bandwidth_efficiency", "memory_bandwidth_bytes_per_s"),
}
"""A row's rate -> (the efficiency measured against it, env.json's best of it)."""


def best_efficiency(
    row: Row, ceilings: Ceilings | None, rate: Rate = "gemm_flops_per_s"
) -> float | None:
    """The row's efficiency against `rate` (RATES), restated against the best rate known
    for its node and threads; the row's own when none is better (or known)."""
    efficiency = row.get(RATES[rate][0])
    own = row.get(rate)
    best = (ceilings or {}).get((row.get("node"), row.get("threads"), rate))
    if efficiency is None or not own or not best or best <= own:
        return efficiency
    return efficiency * own / best


def run_ceilings(store: RunStore) -> Ceilings:
    """The runner's best GEMM ceiling from env.json, keyed by its node and threads; empty
    when env.json is missing or unreadable (the rows' own ceilings then stand)."""
    try:
        env = store.read_json(ENV)
    except DamagedRun:
        return {}
    return ceilings_from_env(env)


def ceilings_from_env(env: dict[str, Any]) -> Ceilings:
    """run_ceilings of an env.json already read (the report's `RunData.env`)."""
    ceilings: Ceilings = {}
    for rate, (_, env_key) in RATES.items():
        best = env.get(env_key)
        if isinstance(best, (int, float)) and not isinstance(best, bool) and best > 0:
            ceilings[(env.get("node"), env.get("threads"), rate)] = float(best)
    return ceilings


def spec_baseline(store: RunStore) -> str | None:
    """The baseline spec.toml names (before --variants could drop it); None without one."""
    try:
        named = tomllib.loads(store.path(SPEC).read_text(encoding="utf-8")).get("baseline")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return named if isinstance(named, str) else None


def summarize(
    rows: list[Row],
    baseline: str | None = None,
    ceilings: Ceilings | None = None,
) -> list[Line]:
    """The lines of a run's measurement rows; speed-ups against the setup
    labelled `baseline` (the spec's), none without one (and `baseline_missing` set on
    every line when it has no timed row: it was not run). `ceilings` (run_ceilings):
    efficiencies are restated against the best GEMM measured on a row's node."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        if "task" in row:
            continue  # accuracy rows: accuracy_table()
        groups.setdefault((row["label"], row["pass"]), []).append(row)
    baseline_times = {
        (row["pass"], row["seq_len"]): measured_ms
        for row in rows
        if "task" not in row
        and row["label"] == baseline
        and row["status"] == "ok"
        and (measured_ms := row.get("time_ms"))
    }
    timed = any(row.get("time_ms") for row in rows if "task" not in row)
    missing = baseline if baseline and timed and not baseline_times else None
    # A forward slower than forward+backward of the same point and n is impossible: both
    # lines get a flag.
    times = {
        (row["label"], row["pass"], row["seq_len"]): measured_ms
        for row in rows
        if "task" not in row and row["status"] == OK and (measured_ms := row.get("time_ms"))
    }
    inverted = {
        (label, n)
        for (label, pass_name, n), time_ms in times.items()
        if pass_name == "forward" and time_ms > times.get((label, "forward_backward", n), math.inf)
    }
    lines = []
    for (label, pass_name), group in groups.items():
        time_fit, memory_fit = scaling_fits(group)
        for row in sorted(group, key=lambda r: r["seq_len"]):
            time_ms = row.get("time_ms")
            reference = baseline_times.get((pass_name, row["seq_len"]))
            memory = row.get("peak_memory_bytes")
            state = row.get("state_bytes")
            efficiency = best_efficiency(row, ceilings)
            bandwidth_efficiency = best_efficiency(row, ceilings, "bandwidth_bytes_per_s")
            runs = row.get("timed_runs")
            # A row timed fewer times than a spread needs (rows from before the minimum)
            # recorded an IQR of 0: that is no spread, not an exact time.
            iqr = row.get("time_iqr_ms") if runs is None or runs >= MIN_SPREAD_RUNS else None
            lines.append(
                Line(
                    label=label,
                    variant=row["variant"],
                    pass_name=pass_name,
                    seq_len=row["seq_len"],
                    status=row["status"],
                    time_ms=time_ms,
                    time_iqr_ms=iqr,
                    peak_memory_mib=None if memory is None else memory / 2**20,
                    efficiency=efficiency,
                    speedup_vs_baseline=reference / time_ms if reference and time_ms else None,
                    fidelity_rel_error=row.get("fidelity_rel_error"),
                    fidelity_local_rel_error=row.get("fidelity_local_rel_error"),
                    fidelity_cosine=row.get("fidelity_cosine"),
                    fidelity_local_attention_distance=row.get("fidelity_local_attention_distance"),
                    time_exponent=None if time_fit is None else time_fit.exponent,
                    memory_exponent=None if memory_fit is None else memory_fit.exponent,
                    error=row.get("error"),
                    time_exponent_stderr=None if time_fit is None else time_fit.stderr,
                    memory_exponent_stderr=None if memory_fit is None else memory_fit.stderr,
                    exponent_lengths=max(
                        (fit.lengths for fit in (time_fit, memory_fit) if fit), default=0
                    ),
                    timed_runs=runs,
                    load_average=row.get("load_average"),
                    flags="; ".join(
                        row_flags(row, bandwidth_efficiency if efficiency is None else efficiency)
                        + ([FLAG_PASS_ORDER] if (label, row["seq_len"]) in inverted else [])
                    )
                    if row["status"] == OK
                    else "",
                    baseline_missing=missing,
                    fidelity_reference=row.get("fidelity_reference"),
                    time_fit=time_fit,
                    memory_fit=memory_fit,
                    state_mib=None if state is None else state / 2**20,
                    bandwidth_efficiency=bandwidth_efficiency,
                )
            )
    return lines


CSV_EXCLUDED = ("time_fit", "memory_fit")
"""Line fields summary.csv leaves out: the fits are in its exponent columns already."""


def baseline_note(lines: list[Line]) -> str | None:
    """What to say when the spec's baseline was not run; None when it was (or none)."""
    missing = next((line.baseline_missing for line in lines if line.baseline_missing), None)
    if missing is None:
        return None
    return (
        f"no speed-ups: the spec's baseline {missing!r} was not run (not among the variants "
        "measured, or no timed row of it); run without --no-baseline, or name it in "
        "--variants, to compare against it"
    )


ACCURACY_COLUMNS = (
    "label",
    "variant",
    "task_label",
    "status",
    "accuracy_mean",
    "accuracy_ci95",
    "accuracy_std",
    "accuracy_per_seed",
    "chance",
    "steps",
    "train_time_s",
    "error",
)


def natural_key(text: str) -> list[Any]:
    """`text` ordered as a reader counts: "at n=64" before "at n=128"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def accuracy_rows(rows: list[Row]) -> list[dict[str, object]]:
    """The accuracy rows, reduced to ACCURACY_COLUMNS, task by task."""
    selected = [row for row in rows if is_accuracy_row(row)]
    selected.sort(key=lambda row: natural_key(str(row["task_label"])))
    return [{column: row.get(column) for column in ACCURACY_COLUMNS} for row in selected]


def _csv(columns: list[str], rows: Iterable[dict[str, Any]]) -> str:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def write_summary(store: RunStore, baseline: str | None = None) -> list[Line]:
    """Derive summary.csv (costs), accuracy.csv (accuracy tasks) and lm_summary.csv
    (language models) from results.jsonl (again: they are always recomputable).
    MixedCorpora, once the others are written, when a language task's rows were scored
    on different text."""
    rows = store.rows()
    lines = summarize(rows, baseline or spec_baseline(store), run_ceilings(store))
    columns = [name for name in Line.__dataclass_fields__ if name not in CSV_EXCLUDED]
    records = [
        {key: value for key, value in asdict(line).items() if key not in CSV_EXCLUDED}
        for line in lines
    ]
    store.write_text(SUMMARY, _csv(columns, records))
    accuracy = accuracy_rows(rows)
    if accuracy:
        store.write_text(ACCURACY, _csv(list(ACCURACY_COLUMNS), accuracy))
    language = language_records(rows)
    if language:
        store.write_text(LANGUAGE_SUMMARY, _csv(list(LANGUAGE_COLUMNS), language))
    return lines
