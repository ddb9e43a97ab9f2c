"""A run directory read for plotting: its rows split by kind, its environment, its spec,
and the series (one per setup) that every figure draws.

Measurement rows come from `playground.run.measurer` (one per setup × n × pass); task
rows have a "task" key: accuracy rows (one per setup × task) and language-model rows (one
per setup × task × evaluation length), told apart by `report.language`. A series is
named by its variant plus the options that vary between that variant's setups in this
run (`linformer k=64`), so legends stay short while fixed options (`seq_len=2048`) are
left to the report's tables.
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.colors import is_color_like

from playground.errors import PlaygroundError
from playground.registry import default_registry
from playground.report.sweeps import Choice, choices, chosen_rows
from playground.report.task_rows import is_accuracy_row, is_language_row
from playground.run.row_schema import Row
from playground.run.store import ENV, ROWS, SPEC, RunStore

OK = "ok"
_MISSING = "<not set>"


class PlotError(PlaygroundError):
    """A results directory cannot be plotted (missing, or no rows yet)."""


@dataclass(frozen=True)
class Series:
    """One setup: every row with this label, in the order they were measured."""

    label: str
    variant: str
    options: dict[str, Any]
    legend: str
    """The variant and its swept options only, e.g. `linformer k=64`."""
    point: int
    """Index of this point among the variant's points (0 when not swept)."""
    points: int
    """How many points the variant has in this run."""


@dataclass
class RunData:
    """Everything in one run directory that a figure or the report needs."""

    directory: Path
    rows: list[Row]
    env: dict[str, Any]
    spec_text: str
    spec: dict[str, Any]
    measurements: list[Row] = field(init=False)
    accuracy: list[Row] = field(init=False)
    """The accuracy rows; of a sweep, the chosen point's (report.sweeps.chosen_rows)."""
    language: list[Row] = field(init=False)
    """The language-model rows (bits per byte), every evaluation length; of a sweep, the
    chosen point's."""
    sweeps: list[Choice] = field(init=False)
    """Every setup's sweep of every task, each grid point with its scores."""
    series: dict[str, Series] = field(init=False)
    """label -> Series, for measurement and accuracy rows alike."""

    def __post_init__(self) -> None:
        self.measurements = [row for row in self.rows if "task" not in row]
        chosen = chosen_rows(self.rows)  # of a sweep, the point chosen on validation
        self.accuracy = [row for row in chosen if is_accuracy_row(row)]
        self.language = [row for row in chosen if is_language_row(row)]
        self.sweeps = choices(self.rows)
        self.series = make_series(self.rows)

    @property
    def passes(self) -> list[str]:
        """The passes measured, forward first."""
        found = {row.get("pass") for row in self.measurements}
        order = ["forward", "forward_backward"]
        return [p for p in order if p in found] + sorted(p for p in found - set(order) if p)

    @property
    def failed(self) -> list[Row]:
        """Every row whose status is not ok, of every kind."""
        return [row for row in self.rows if row.get("status", OK) != OK]

    def labels(self, rows: Iterable[Row] | None = None) -> list[str]:
        """Series labels in a stable order: the spec's baseline first, then by variant
        name, then by point."""
        chosen = {row["label"] for row in (self.rows if rows is None else rows)}

        def order(label: str) -> tuple[bool, str, int]:
            series = self.series[label]
            return (label != self.spec.get("baseline"), series.variant, series.point)

        return sorted(chosen, key=order)

    def environment_note(self) -> str:
        """One line naming what produced the numbers, for every figure's foot."""
        env = self.env
        first = self.rows[0]
        parts = [
            f"{env.get('device_name') or '?'} ({env.get('device') or first.get('device', '?')})",
            str(env.get("dtype") or first.get("dtype", "?")),
            f"torch {env.get('torch_version', '?')}",
            f"{env.get('threads', '?')} threads",
        ]
        if "d_model" in first:
            parts.append(
                f"batch {first.get('batch_size', '?')}, d_model {first['d_model']}, "
                f"{first.get('num_heads', '?')} heads"
            )
        experiment = env.get("experiment") or self.spec.get("name")
        if experiment:
            parts.append(f"run {experiment} {env.get('started_at', '')}".rstrip())
        return " · ".join(parts)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def swept_options(rows: Iterable[Row]) -> dict[str, list[str]]:
    """variant -> the option names whose value differs between its points in `rows` (an
    option set in some points only counts as differing)."""
    options_by_label: dict[str, dict[str, Any]] = {}
    variant_of: dict[str, str] = {}
    for row in rows:
        options_by_label.setdefault(row["label"], row.get("options") or {})
        variant_of.setdefault(row["label"], row["variant"])
    swept: dict[str, list[str]] = {}
    for variant in dict.fromkeys(variant_of.values()):
        points = [options_by_label[label] for label, v in variant_of.items() if v == variant]
        names = sorted({name for options in points for name in options})
        swept[variant] = [
            name
            for name in names
            if len({_key(options.get(name, _MISSING)) for options in points}) > 1
        ]
    return swept


def format_value(value: Any) -> str:
    """An option value as a legend shows it: lists as tuples, no quotes on strings."""
    if isinstance(value, (list, tuple)):
        return (
            "(" + ", ".join(format_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
        )
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def declared(variant: str, attribute: str) -> Any:
    """What the variant's class declares for a display ClassVar (`display_name`,
    `colour`); None when it declares nothing or is no longer registered (an old run)."""
    info = default_registry().variants.get(variant)
    if info is None:
        return None
    try:
        value = getattr(info.cls, attribute, None)
    except Exception as exc:  # a hostile property must cost only this declaration
        warn_hook(variant, attribute, f"raised {type(exc).__name__}: {exc}")
        return None
    if value is None:
        return None
    if attribute == "colour" and not is_color_like(value):
        warn_hook(variant, attribute, f"{value!r} is not a matplotlib colour; using the default")
        return None
    if attribute == "display_name" and (
        not isinstance(value, str) or not value.strip() or "\n" in value
    ):
        warn_hook(variant, attribute, f"{value!r} is not a one-line name; using {variant!r}")
        return None
    return value


_WARNED: set[tuple[str, str]] = set()


def warn_hook(variant: str, hook: str, problem: str) -> None:
    """One line on stderr, once per (variant, hook) and process, for a display hook whose
    value the figures cannot use: the figures go on with a default, and the author learns
    which plugin and hook to fix."""
    if (variant, hook) in _WARNED:
        return
    _WARNED.add((variant, hook))
    print(f"warning: variant {variant!r}: {hook} {problem}", file=sys.stderr)


def make_series(rows: list[Row]) -> dict[str, Series]:
    """label -> Series for every label in `rows`, points ordered by their swept values."""
    swept = swept_options(rows)
    first: dict[str, Row] = {}
    for row in rows:
        first.setdefault(row["label"], row)
    by_variant: dict[str, list[str]] = {}
    for label, row in first.items():
        by_variant.setdefault(row["variant"], []).append(label)
    series = {}
    for variant, labels in by_variant.items():
        names = swept.get(variant, [])

        def order(label: str, names: list[str] = names) -> tuple:
            options = first[label].get("options") or {}
            return (*(_sortable(options.get(name)) for name in names), label)

        labels.sort(key=order)
        for point, label in enumerate(labels):
            options = dict(first[label].get("options") or {})
            shown = [f"{name}={format_value(options[name])}" for name in names if name in options]
            # Points that differ in nothing the options show keep their full label.
            name = declared(variant, "display_name") or variant
            legend = " ".join([name, *shown]) if shown or len(labels) == 1 else label
            series[label] = Series(label, variant, options, legend, point, len(labels))
    return series


def _sortable(value: Any) -> tuple[int, Any]:
    """Numbers sort numerically and before everything else, which sorts as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, _key(value))


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; PlotError when it is not one or holds no rows yet."""
    directory = Path(run_dir)
    if not directory.is_dir():
        raise PlotError(
            f"{directory} is not a directory; give a run directory such as "
            f"results/quick/<timestamp>/"
        )
    store = RunStore(directory)
    rows = store.rows()  # DamagedRun names the bad line and the way out
    if not rows:
        found = "is empty" if store.path(ROWS).is_file() else "does not exist"
        raise PlotError(
            f"nothing to plot in {directory}: {ROWS} {found}. Plot a run directory that has "
            f"finished at least one cell (results/<experiment>/<timestamp>/), or resume it "
            f"with `playground run --resume {directory}`"
        )
    env = store.read_json(ENV) if store.path(ENV).exists() else {}
    spec_text = store.path(SPEC).read_text(errors="replace") if store.path(SPEC).is_file() else ""
    try:
        spec = tomllib.loads(spec_text)
    except tomllib.TOMLDecodeError:
        spec = {}
    return RunData(directory, rows, env, spec_text, spec)
