"""What a run's rows say, condensed: one line per (variant point, pass, n) with the
speed-up over the spec's baseline variant point at the same n, and the fitted log-log exponents of time and memory
over n per (variant point, pass). Written to summary.csv and printed as tables."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from playground.measure import fit_exponent
from playground.results import ACCURACY, SUMMARY, RunStore
from playground.stats import accuracy_interval, format_interval

OK = "ok"
PASS_TITLES = {"forward": "forward", "forward_backward": "forward + backward"}
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


def exponents(rows: Iterable[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Time and memory exponents over the ok rows of one (variant point, pass); None
    where fewer than two lengths were measured."""
    rows = [r for r in rows if r["status"] == "ok"]

    def fit(key: str) -> float | None:
        points = [(r["seq_len"], r[key]) for r in rows if r.get(key)]
        if len({n for n, _ in points}) < 2:
            return None
        return fit_exponent([n for n, _ in points], [v for _, v in points])

    return fit("time_ms"), fit("peak_memory_bytes")


def summarize(rows: list[dict[str, Any]], baseline: str | None = None) -> list[Line]:
    """The lines of a run's measurement rows; speed-ups against the variant point
    labelled `baseline` (the spec's), none without one."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if "task" in row:
            continue  # accuracy rows: accuracy_table()
        groups.setdefault((row["label"], row["pass"]), []).append(row)
    baseline = {
        (row["pass"], row["seq_len"]): row["time_ms"]
        for row in rows
        if "task" not in row
        and row["label"] == baseline
        and row["status"] == "ok"
        and row.get("time_ms")
    }
    lines = []
    for (label, pass_name), group in groups.items():
        time_exponent, memory_exponent = exponents(group)
        for row in sorted(group, key=lambda r: r["seq_len"]):
            time_ms = row.get("time_ms")
            reference = baseline.get((pass_name, row["seq_len"]))
            memory = row.get("peak_memory_bytes")
            lines.append(
                Line(
                    label=label,
                    variant=row["variant"],
                    pass_name=pass_name,
                    seq_len=row["seq_len"],
                    status=row["status"],
                    time_ms=time_ms,
                    time_iqr_ms=row.get("time_iqr_ms"),
                    peak_memory_mib=None if memory is None else memory / 2**20,
                    efficiency=row.get("efficiency"),
                    speedup_vs_baseline=reference / time_ms if reference and time_ms else None,
                    fidelity_rel_error=row.get("fidelity_rel_error"),
                    fidelity_local_rel_error=row.get("fidelity_local_rel_error"),
                    fidelity_cosine=row.get("fidelity_cosine"),
                    fidelity_local_attention_distance=row.get("fidelity_local_attention_distance"),
                    time_exponent=time_exponent,
                    memory_exponent=memory_exponent,
                    error=row.get("error"),
                )
            )
    return lines


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


def accuracy_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The accuracy rows, reduced to ACCURACY_COLUMNS, task by task."""
    selected = [row for row in rows if "task" in row]
    selected.sort(key=lambda row: row["task_label"])
    return [{column: row.get(column) for column in ACCURACY_COLUMNS} for row in selected]


def _csv(columns: list[str], rows: Iterable[dict[str, Any]]) -> str:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def write_summary(store: RunStore, baseline: str | None = None) -> list[Line]:
    """Derive summary.csv (costs) and accuracy.csv (tasks) from results.jsonl (again:
    they are always recomputable)."""
    rows = store.rows()
    lines = summarize(rows, baseline)
    store.write_text(SUMMARY, _csv(list(Line.__dataclass_fields__), map(asdict, lines)))
    accuracy = accuracy_rows(rows)
    if accuracy:
        store.write_text(ACCURACY, _csv(list(ACCURACY_COLUMNS), accuracy))
    return lines


def _format(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_accuracy(rows: list[dict[str, Any]], console: Console) -> None:
    """variant × task: accuracy mean ± 95% interval over seeds, each seed, chance."""
    accuracy = accuracy_rows(rows)
    if not accuracy:
        return
    table = Table(title="Accuracy on held-out examples (mean ± 95% Student-t interval over seeds)")
    for column in ("task", "variant", "accuracy", "seeds", "chance", "train s/seed", "status"):
        table.add_column(column)
    for row in accuracy:
        ok = row["status"] == "ok"
        table.add_row(
            row["task_label"],
            row["label"],
            format_interval(row["accuracy_mean"], accuracy_interval(row)) if ok else "-",
            ", ".join(f"{a:.3f}" for a in row["accuracy_per_seed"]) if ok else "-",
            _format(row["chance"], ".3f"),
            _format(row["train_time_s"], ".1f"),
            row["status"] if ok else f"[red]{row['status']}[/red]: {escape(str(row['error']))}",
        )
    console.print(table)


def node_facts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per node that measured timing cells: hostname, Ray node id, threads, its GEMM
    throughput, its cells and their median efficiency. One entry per node of a
    distributed run; a slower node shows as a lower GEMM figure with an efficiency like
    the others' (the hardware), or a lower efficiency (something else on it)."""
    nodes: dict[str, dict[str, Any]] = {}
    for row in rows:
        if "pass" not in row or row.get("status") != "ok":
            continue
        key = row.get("node_id") or row.get("node") or "?"
        entry = nodes.setdefault(
            key,
            {
                "node": row.get("node"),
                "node_id": row.get("node_id"),
                "threads": row.get("threads"),
                "gemm_flops_per_s": row.get("gemm_flops_per_s"),
                "cells": 0,
                "efficiencies": [],
            },
        )
        entry["cells"] += 1
        if row.get("efficiency") is not None:
            entry["efficiencies"].append(row["efficiency"])
    for entry in nodes.values():
        found = sorted(entry.pop("efficiencies"))
        entry["median_efficiency"] = found[len(found) // 2] if found else None
    return list(nodes.values())


def print_nodes(rows: list[dict[str, Any]], console: Console) -> None:
    """The node table, when more than one node measured the run's timing cells."""
    nodes = node_facts(rows)
    if len(nodes) < 2:
        return
    table = compact_table("Nodes (efficiency is against each node's own GEMM throughput)")
    for column in ("node", "node id", "threads", "GEMM GFLOP/s", "cells", "median efficiency"):
        table.add_column(column)
    for node in nodes:
        gemm = node["gemm_flops_per_s"]
        table.add_row(
            str(node["node"]),
            (node["node_id"] or "-")[:12],
            str(node["threads"]),
            _format(None if gemm is None else gemm / 1e9, ".1f"),
            str(node["cells"]),
            _format(node["median_efficiency"], ".2f"),
        )
    console.print(table)


SUMMARY_COLUMNS = (
    "variant",
    "pass",
    "n",
    "time ms",
    "IQR ms",
    "peak MiB",
    "efficiency",
    "vs baseline",
    "rel err",
    "rel err local",
    "cosine",
    "status",
)
EXPONENT_COLUMNS = ("variant", "pass", "time exponent", "memory exponent")


def summary_cells(line: Line) -> list[str]:
    """One Line as the text of SUMMARY_COLUMNS (the terminal table and the report)."""
    speedup = line.speedup_vs_baseline
    return [
        line.label,
        line.pass_name,
        str(line.seq_len),
        _format(line.time_ms, ".1f"),
        _format(line.time_iqr_ms, ".1f"),
        _format(line.peak_memory_mib, ".1f"),
        _format(line.efficiency, ".2f"),
        _format(speedup, ".2f") + ("×" if speedup else ""),
        _format(line.fidelity_rel_error, ".3g"),
        _format(line.fidelity_local_rel_error, ".3g"),
        _format(line.fidelity_cosine, ".3f"),
        line.status,
    ]


def exponent_cells(lines: list[Line]) -> list[list[str]]:
    """EXPONENT_COLUMNS, one row per (variant point, pass)."""
    rows: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        rows.setdefault(
            (line.label, line.pass_name),
            [
                line.label,
                line.pass_name,
                _format(line.time_exponent, ".2f"),
                _format(line.memory_exponent, ".2f"),
            ],
        )
    return list(rows.values())


def compact_table(title: str | None = None) -> Table:
    """A table with one space between columns and no side borders, so that the summary's
    ten columns fit a 100-column terminal without cutting a cell."""
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
        title_justify="left",
        title_style="italic",
    )


def _table_without_empty_columns(header: list[str], rows: list[list[str]]) -> Table:
    """A table of `rows`, less the columns that are "-" in every row (fidelity is not
    measured on forward+backward, memory may not be measured at all)."""
    keep = [
        index
        for index, column in enumerate(header)
        if column in ("n", "status") or any(row[index] != "-" for row in rows)
    ]
    table = compact_table()
    for index in keep:
        table.add_column(header[index], justify="left" if header[index] == "status" else "right")
    for row in rows:
        *cells, status = (row[index] for index in keep)
        table.add_row(*map(escape, cells), status if status == OK else f"[red]{status}[/red]")
    return table


def print_summary(lines: list[Line], console: Console) -> None:
    """One block per variant point: its label on a line of its own (whole, however long),
    then a table per pass; then the fitted exponents. Fits a 100-column terminal."""
    if not lines:
        return
    console.print("[bold]Summary[/bold] (median time; peak memory above the inputs)")
    header = [column for column in SUMMARY_COLUMNS if column not in ("variant", "pass")]
    groups: dict[str, dict[str, list[list[str]]]] = {}
    for line in lines:
        _, pass_name, *cells = summary_cells(line)
        groups.setdefault(line.label, {}).setdefault(pass_name, []).append(cells)
    for label, passes in groups.items():
        console.print(f"\n[bold]{escape(label)}[/bold]", soft_wrap=True)
        for pass_name, rows in passes.items():
            table = _table_without_empty_columns(header, rows)
            table.title = PASS_TITLES.get(pass_name, pass_name)
            console.print(table)
    console.print(
        "\n[bold]Scaling[/bold]: fitted exponent of time and memory vs n (1: grows as n, 2: as n²)"
    )
    scaling = compact_table()
    scaling.add_column("variant", no_wrap=True)
    scaling.add_column("pass", no_wrap=True)
    scaling.add_column("time exponent", justify="right")
    scaling.add_column("memory exponent", justify="right")
    for row in exponent_cells(lines):
        scaling.add_row(*map(escape, row))
    console.print(scaling)
    for line in lines:
        if line.status != OK:
            console.print(
                f"[red]{line.status}[/red] {escape(line.label)} n={line.seq_len} {line.pass_name}: "
                f"{escape(str(line.error))}",
                soft_wrap=True,
            )
