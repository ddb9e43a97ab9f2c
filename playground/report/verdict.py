"""The verdict of a run: for every setup and every quality metric, its difference from the
baseline setup with a 95 % interval, a mark (better, worse or indistinguishable), and the
cost at the same length beside it; written to verdict.csv and printed as a rich table.

Quality metrics are the accuracy of each task (higher is better) and the bits per byte of
each language task at each evaluation length (lower is better).

Paired or not: a seed fixes a task's data (`Task.split(seed)` draws train and test from
generators seeded by it; a language task's text is its corpus), so seed k of a setup and
seed k of the baseline saw the same examples when both rows hold the same seeds of the
same task (same task options, same corpus). The interval is then the Student-t interval
of the per-seed differences, which removes the between-seed spread of the data; otherwise
Welch's interval of the difference of the means (degrees of freedom rounded down, so
wider). The table says which.

The mark: the interval must exclude 0 *and* the difference must have that sign on a
strict majority of seeds (paired: the per-seed differences; unpaired: the setup's seeds
against the baseline's mean). The interval alone lets a minority of seeds decide: a few
seeds far ahead and most slightly behind give a mean whose interval can clear 0. A
leave-one-seed-out check was not chosen: with the usual three seeds it leaves two, where
t is 12.7, and would mark almost nothing.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from playground.errors import PlaygroundError
from playground.report.summary import Ceilings, Line, run_ceilings, spec_baseline, summarize
from playground.report.sweeps import at_point, chosen_rows
from playground.report.task_rows import is_accuracy_row, is_language_row, setup_name, task_base
from playground.run.row_schema import Row
from playground.run.stats import CONFIDENCE, t_quantile
from playground.run.store import RunStore

VERDICT = "verdict.csv"
BETTER, WORSE, SAME = "better", "worse", "indistinguishable"
PAIRED, UNPAIRED = "paired", "unpaired (Welch)"
NOT_MEASURED = "not measured"
COST_PASSES = ("forward_backward", "forward")
"""The pass whose time and efficiency stand beside a quality metric: training's first."""


class MissingBaseline(PlaygroundError, LookupError):
    """The verdict's baseline setup has no quality rows in the run."""


@dataclass(frozen=True)
class Metric:
    """One quality measurement, task by task: `direction` is +1 where higher is better."""

    name: str
    """What the table shows: `accuracy on <task>` or `bits/byte on <task> at n=<length>`."""
    direction: int
    length: int | None
    """The sequence length the metric is measured at (the cost is looked up there)."""


@dataclass(frozen=True)
class Score:
    setup: str
    label: str
    """The row's label, which the cost rows share."""
    metric: Metric
    seeds: tuple[Any, ...]
    values: tuple[float, ...]
    data: str
    """What fixes the data besides the seed: the task's options, or the corpus."""
    state_bytes: float | None = None
    """The trained model's decoding state per sequence at the task's length, where the
    row carries it (run.state_size): the cost beside a run that timed no decode pass."""


@dataclass(frozen=True)
class Verdict:
    setup: str
    metric: str
    difference: float
    low: float | None
    high: float | None
    pairing: str
    seeds: int
    mark: str
    cost_length: int | None
    efficiency: float | None
    time_ratio: float | None
    """The setup's time over the baseline's, same pass and length (below 1: faster)."""
    state_bytes: float | None
    direction: int = 1
    """+1 where higher is better (accuracy), -1 where lower is (bits per byte)."""

    @property
    def effect(self) -> float:
        """The difference signed so that better is positive."""
        return self.direction * self.difference


def _metric(row: Row) -> Metric:
    if is_language_row(row):
        length = row.get("eval_length")
        return Metric(f"bits/byte on {task_base(row)} at n={length}", -1, length)
    options = row.get("task_options") or {}
    return Metric(f"accuracy on {row.get('task_label') or row['task']}", 1, options.get("seq_len"))


def quality_scores(rows: Sequence[Row]) -> list[Score]:
    """The ok quality rows with per-seed values, as Scores; of a sweep, the point chosen
    on validation (report.sweeps), scored on test."""
    scores = []
    for row in chosen_rows(rows):
        if row.get("status") != "ok":
            continue
        if is_accuracy_row(row):
            values, data = row.get("accuracy_per_seed"), repr(row.get("task_options"))
        elif is_language_row(row):
            values = row.get("bits_per_byte_per_seed")
            data = f"{row.get('task_options')!r} {row.get('corpus_fingerprint')}"
        else:
            continue
        if not values:
            continue
        seeds = tuple(row.get("seeds") or ())
        setup = setup_name(row) if is_language_row(row) else str(row["label"])
        scores.append(
            Score(
                setup,
                str(row["label"]),
                _metric(row),
                seeds,
                tuple(map(float, values)),
                data,
                row.get("state_bytes"),
            )
        )
        probe = row.get("passkey_exact_per_seed")
        if is_language_row(row) and probe and len(probe) == len(values):
            # each seed's passkey retrieval: its exact matches averaged over the depths
            length = row.get("eval_length")
            name = f"passkey exact on {task_base(row)} at n={length}"
            retrieved = tuple(statistics.fmean(depths) for depths in probe)
            scores.append(
                Score(setup, str(row["label"]), Metric(name, 1, length), seeds, retrieved, data)
            )
    return scores


def _quantile(df: int) -> float:
    return t_quantile(0.5 + CONFIDENCE / 2, df)


def difference_interval(
    setup: Score, baseline: Score
) -> tuple[float, float | None, float | None, str, list[float]]:
    """(setup − baseline mean difference, low, high, pairing, per-seed signed evidence):
    paired by seed when both saw the same data, else Welch; no interval from one seed.
    The evidence is what the majority rule counts: the per-seed differences, or (unpaired)
    each of the setup's seeds less the baseline's mean."""
    paired = (
        setup.seeds == baseline.seeds
        and len(setup.seeds) == len(setup.values) == len(baseline.values) >= 2
        and len(set(setup.seeds)) == len(setup.seeds)
        and setup.data == baseline.data
    )
    if paired:
        differences = [a - b for a, b in zip(setup.values, baseline.values, strict=True)]
        mean = statistics.fmean(differences)
        half = _quantile(len(differences) - 1) * statistics.stdev(differences)
        half /= math.sqrt(len(differences))
        return mean, mean - half, mean + half, PAIRED, differences
    reference = statistics.fmean(baseline.values)
    mean = statistics.fmean(setup.values) - reference
    evidence = [value - reference for value in setup.values]
    if len(setup.values) < 2 or len(baseline.values) < 2:
        return mean, None, None, UNPAIRED, evidence
    a = statistics.variance(setup.values) / len(setup.values)
    b = statistics.variance(baseline.values) / len(baseline.values)
    if a + b == 0:
        return mean, mean, mean, UNPAIRED, evidence
    df = (a + b) ** 2 / (a**2 / (len(setup.values) - 1) + b**2 / (len(baseline.values) - 1))
    half = _quantile(max(1, math.floor(df))) * math.sqrt(a + b)
    return mean, mean - half, mean + half, UNPAIRED, evidence


def mark(low: float | None, high: float | None, evidence: Sequence[float], direction: int) -> str:
    """BETTER or WORSE when the interval excludes 0 and a strict majority of the seeds'
    evidence has that sign (module docstring), with the metric's direction; else SAME."""
    if low is None or high is None:
        return SAME
    if low > 0:
        sign = 1
    elif high < 0:
        sign = -1
    else:
        return SAME
    agreeing = sum(1 for value in evidence if value * sign > 0)
    if 2 * agreeing <= len(evidence):
        return SAME
    return BETTER if sign * direction > 0 else WORSE


def _cost(
    lines: Sequence[Line], label: str, baseline_label: str, length: int | None
) -> tuple[int | None, float | None, float | None, float | None]:
    """(the length the cost is from, efficiency, time ratio, decoding state bytes) of
    `label`'s cost lines at `length`, else at the nearest length measured."""
    own = [line for line in lines if line.label == label and line.status == "ok"]
    timed = [line for name in COST_PASSES for line in own if line.pass_name == name]
    if not own:
        return None, None, None, None
    lengths = sorted({line.seq_len for line in own})
    at = lengths[0] if length is None else min(lengths, key=lambda n: (abs(n - length), n))
    found = next((line for line in timed if line.seq_len == at), None)
    ratio = None
    if found is not None and found.speedup_vs_baseline and baseline_label != label:
        ratio = 1 / found.speedup_vs_baseline
    elif found is not None and baseline_label == label:
        ratio = 1.0
    decode = next((line for line in own if line.pass_name == "decode" and line.seq_len == at), None)
    state = None if decode is None or decode.state_mib is None else decode.state_mib * 2**20
    return at, None if found is None else found.efficiency, ratio, state


def verdicts(rows: Sequence[Row], baseline: str, ceilings: Ceilings | None = None) -> list[Verdict]:
    """One Verdict per (setup other than the baseline, quality metric the baseline has);
    MissingBaseline, naming the setups there are, when the baseline has no quality row."""
    scores = quality_scores(rows)
    if not scores:
        return []
    reference = {score.metric: score for score in scores if score.setup == baseline}
    if not reference:
        setups = sorted({score.setup for score in scores})
        raise MissingBaseline(
            f"the baseline {baseline!r} has no quality rows in this run; the setups with "
            f"quality rows are: {', '.join(setups)}. Give one of them with --baseline NAME"
        )
    baseline_label = next(iter(reference.values())).label
    lines = summarize(list(rows), baseline_label, ceilings)
    found = []
    for score in scores:
        base = reference.get(score.metric)
        if score.setup == baseline or base is None:
            continue
        difference, low, high, pairing, evidence = difference_interval(score, base)
        at, efficiency, ratio, state = _cost(
            lines, score.label, baseline_label, score.metric.length
        )
        found.append(
            Verdict(
                setup=score.setup,
                metric=score.metric.name,
                difference=difference,
                low=low,
                high=high,
                pairing=pairing,
                seeds=len(score.values),
                mark=mark(low, high, evidence, score.metric.direction),
                cost_length=at,
                efficiency=efficiency,
                time_ratio=ratio,
                state_bytes=score.state_bytes if state is None else state,
                direction=score.metric.direction,
            )
        )
    return sorted(found, key=lambda verdict: (verdict.metric, verdict.setup))


def run_verdicts(
    store: RunStore, baseline: str | None = None, at: dict[str, str] | None = None
) -> list[Verdict]:
    """The verdicts of a run directory, against `baseline` or the spec's; written to
    verdict.csv when there are any. MissingBaseline without a baseline to use. `at`: hold
    every sweep at that grid point (sweeps.at_point); such verdicts are printed only, and
    verdict.csv keeps the run's own."""
    rows = at_point(store.rows(), at or {})
    if not quality_scores(rows):
        return []
    named = baseline or spec_baseline(store)
    if named is None:
        setups = sorted({score.setup for score in quality_scores(rows)})
        raise MissingBaseline(
            f"the spec names no baseline; give one with --baseline NAME, one of: "
            f"{', '.join(setups)}"
        )
    found = verdicts(rows, named, run_ceilings(store))
    if at:
        return found
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(Verdict.__dataclass_fields__))
    writer.writeheader()
    writer.writerows(asdict(verdict) for verdict in found)
    store.write_text(VERDICT, text.getvalue())
    return found


def _number(value: float | None, spec: str) -> str:
    return NOT_MEASURED if value is None else format(value, spec)


MARK_STYLES = {BETTER: "green", WORSE: "red", SAME: "dim"}


def print_verdicts(found: Sequence[Verdict], baseline: str, console: Console) -> None:
    """The scorecard: one line per (metric, setup)."""
    if not found:
        return
    table = Table(title=f"Verdict against {baseline} (difference, 95% interval)")
    for column in ("metric", "setup", "difference [95%]", "seeds", "mark"):
        table.add_column(column)
    for column in ("cost at n", "efficiency", "time ratio", "state bytes"):
        table.add_column(column, justify="right")
    for verdict in found:
        interval = "" if verdict.low is None else f" [{verdict.low:+.3f}, {verdict.high:+.3f}]"
        style = MARK_STYLES[verdict.mark]
        table.add_row(
            escape(verdict.metric),
            escape(verdict.setup),
            f"{verdict.difference:+.3f}{interval}",
            f"{verdict.seeds} {verdict.pairing}",
            f"[{style}]{verdict.mark}[/{style}]",
            "-" if verdict.cost_length is None else str(verdict.cost_length),
            _number(verdict.efficiency, ".3f"),
            _number(verdict.time_ratio, ".2f"),
            _number(verdict.state_bytes, ",.0f"),
        )
    console.print(table)
