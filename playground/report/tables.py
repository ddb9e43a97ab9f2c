"""The run's summary as terminal tables (rich): the lines of `report.summary` one block per
setup, the fitted exponents, the accuracy rows, the language-model rows, and the nodes of
a distributed run. `summary_entries`, `exponent_entries` and `language_entries` are the
text of each table entry, shared with report.html and report.md (`report.pages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from playground.report.learned import LEARNED_COLUMNS, LEARNED_TITLE, learned_entries
from playground.report.summary import (
    DOUBTFUL,
    DOUBTFUL_NOTE,
    OK,
    PASS_TITLES,
    Line,
    baseline_note,
    exponent_text,
    natural_key,
)
from playground.report.sweeps import chosen_rows
from playground.report.task_rows import is_accuracy_row, is_language_row, language_rows, setup_name
from playground.run.fidelity import CAUSAL_REFERENCE
from playground.run.instruments import FLAG_MEANINGS
from playground.run.row_schema import Row
from playground.run.stats import accuracy_bounds, format_interval


def _format(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_accuracy(rows: list[Row], console: Console) -> None:
    """variant × task: accuracy mean [95% interval] over seeds, each seed, chance; of a
    sweep, the point chosen on validation (print_sweeps shows the grid). The interval is
    the report's (`accuracy_bounds` of the whole row: its recorded bounds)."""
    accuracy = [row for row in chosen_rows(rows) if is_accuracy_row(row)]
    if not accuracy:
        return
    table = Table(title="Accuracy on held-out examples (mean [95% interval over seeds])")
    for column in ("task", "variant", "accuracy", "seeds", "chance", "train s/seed", "status"):
        table.add_column(column)
    for row in sorted(accuracy, key=lambda row: natural_key(row["task_label"])):  # as accuracy.csv
        mean = row.get("accuracy_mean")
        ok = row["status"] == "ok"
        table.add_row(
            row["task_label"],
            row["label"],
            format_interval(mean, accuracy_bounds(row)) if ok and mean is not None else "-",
            ", ".join(f"{a:.3f}" for a in row.get("accuracy_per_seed", [])) if ok else "-",
            _format(row.get("chance"), ".3f"),
            _format(row.get("train_time_s"), ".1f"),
            row["status"] if ok else f"[red]{row['status']}[/red]: {escape(str(row.get('error')))}",
        )
    console.print(table)
    print_learned([row for row in rows if is_accuracy_row(row)], console)


def print_learned(rows: list[Row], console: Console) -> None:
    """What the rows' trained attention layers learned (`learned_entries`), under the
    table of their scores; nothing when no layer learned anything."""
    entries = learned_entries(rows)
    if not entries:
        return
    table = compact_table(LEARNED_TITLE)
    for column in LEARNED_COLUMNS:
        table.add_column(
            column,
            justify="right" if column == "mean over seeds" else "left",
            overflow="fold",  # a setup's label is one word: fold it, never cut it
        )
    for entry in entries:
        table.add_row(*map(escape, entry))
    console.print(table)


LANGUAGE_TITLE = (
    "Language modelling: bits per byte on held-out text (mean [95% interval over seeds]; "
    "lower is better)"
)
LANGUAGE_TABLE_COLUMNS = (
    "setup",
    "task",
    "train length",
    "eval length",
    "bits per byte",
    "unigram",
    "bigram",
    "tokens/s",
    "train s/seed",
    "status",
)


def _bits_per_byte(row: Row) -> str:
    mean = row.get("bits_per_byte_mean")
    if mean is None:
        return "-"
    low, high = row.get("bits_per_byte_ci95_low"), row.get("bits_per_byte_ci95_high")
    bounds = (low, high) if low is not None and high is not None else None
    return format_interval(mean, bounds or row.get("bits_per_byte_ci95"))


def language_entries(rows: list[Row]) -> list[list[str]]:
    """LANGUAGE_TABLE_COLUMNS, one row per (setup, task, evaluation length), sorted by
    setup then length; a row that did not finish ok shows its status and why.
    MixedCorpora when a task's rows were scored on different text."""
    entries = []
    for row in language_rows(chosen_rows(rows)):
        status = str(row.get("status", OK))
        entries.append(
            [
                setup_name(row),
                str(row.get("task_label") or row["task"]),
                str(row.get("train_length", "-")),
                str(row.get("eval_length", "-")),
                _bits_per_byte(row) if status == OK else "-",
                _format(row.get("unigram_bits_per_byte"), ".3f"),
                _format(row.get("bigram_bits_per_byte"), ".3f"),
                _format(row.get("tokens_per_s"), ",.0f"),
                _format(row.get("train_time_s"), ".1f"),
                f"{status}: {row['error']}" if status != OK and row.get("error") else status,
            ]
        )
    return entries


def print_language(rows: list[Row], console: Console) -> None:
    """The language-model table (`language_entries`); nothing without language rows."""
    entries = language_entries(rows)
    if not entries:
        return
    table = compact_table(LANGUAGE_TITLE)
    for column in LANGUAGE_TABLE_COLUMNS:
        table.add_column(
            column, justify="left" if column in ("setup", "task", "status") else "right"
        )
    for *values, status in entries:
        shown = status if status == OK else f"[red]{escape(status)}[/red]"
        table.add_row(*map(escape, values), shown)
    console.print(table)
    print_learned([row for row in rows if is_language_row(row)], console)


def node_facts(rows: list[Row]) -> list[dict[str, Any]]:
    """Per node that measured cost cells: hostname, Ray node id, threads, its GEMM
    throughput, its cells and their median efficiency. One dict per node of a
    distributed run; a slower node shows as a lower GEMM figure with an efficiency like
    the others' (the hardware), or a lower efficiency (something else on it)."""
    nodes: dict[str, dict[str, Any]] = {}
    for row in rows:
        if "pass" not in row or row.get("status") != "ok":
            continue
        key = row.get("node_id") or row.get("node") or "?"
        facts = nodes.setdefault(
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
        facts["cells"] += 1
        if row.get("efficiency") is not None:
            facts["efficiencies"].append(row["efficiency"])
    for facts in nodes.values():
        found = sorted(facts.pop("efficiencies"))
        facts["median_efficiency"] = found[len(found) // 2] if found else None
    return list(nodes.values())


def print_nodes(rows: list[Row], console: Console) -> None:
    """The node table, when more than one node measured the run's cost cells."""
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
    "state MiB",
    "efficiency",
    "BW eff.",
    "vs baseline",
    "rel err",
    "rel err local",
    "cosine",
    "flags",
    "status",
)
EXPONENT_COLUMNS = ("variant", "pass", "time exponent", "memory exponent")
SCALING_TITLE = (
    "Scaling: fitted exponent of time and memory vs n (1: grows as n, 2: as n²), ± its "
    "standard error; from two lengths only a two-point slope"
)
SUMMARY_TITLE = "Summary (median time; peak memory above the inputs)"


def summary_title(lines: Sequence[Line]) -> str:
    """SUMMARY_TITLE, with what a decode line's numbers are when there is one."""
    if not any(line.pass_name == "decode" for line in lines):
        return SUMMARY_TITLE
    return (
        SUMMARY_TITLE[:-1] + "; a decode step: time per generated token at context n, its "
        "state per sequence, and BW eff. = the time to read that state once at the measured "
        "memory bandwidth over the step's)"
    )


def summary_entries(line: Line) -> list[str]:
    """One Line as the text of SUMMARY_COLUMNS (the terminal table and the report)."""
    speedup = line.speedup_vs_baseline
    return [
        line.label,
        line.pass_name,
        str(line.seq_len),
        _format(line.time_ms, ".1f" if line.time_ms is None or line.time_ms >= 10 else ".3g"),
        _format(
            line.time_iqr_ms, ".1f" if line.time_iqr_ms is None or line.time_iqr_ms >= 10 else ".2g"
        ),
        _format(line.peak_memory_mib, ".1f"),
        _format(line.state_mib, ".3g"),
        _format(line.efficiency, ".2f"),
        _format(line.bandwidth_efficiency, ".2f"),
        "no baseline run"
        if line.baseline_missing and line.time_ms is not None
        else _format(speedup, ".2f") + ("×" if speedup else ""),
        _format(line.fidelity_rel_error, ".3g"),
        _format(line.fidelity_local_rel_error, ".3g"),
        _format(line.fidelity_cosine, ".3f"),
        line.flags or "-",
        line.status,
    ]


def exponent_entries(lines: list[Line]) -> list[list[str]]:
    """EXPONENT_COLUMNS, one row per (setup, pass)."""
    rows: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        rows.setdefault(
            (line.label, line.pass_name),
            [
                line.label,
                line.pass_name,
                exponent_text(line.time_fit),
                exponent_text(line.memory_fit),
            ],
        )
    return list(rows.values())


def exponent_note(rows: list[list[str]]) -> str | None:
    """What the doubtful mark means, when one of the exponent rows carries it."""
    marked = any(entry.endswith(f" {DOUBTFUL}") for row in rows for entry in row[2:])
    return DOUBTFUL_NOTE if marked else None


def compact_table(title: str | None = None) -> Table:
    """A table with one space between columns and no side borders, so that the summary's
    ten columns fit a 100-column terminal without cutting an entry."""
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
        *entries, status = (row[index] for index in keep)
        table.add_row(*map(escape, entries), status if status == OK else f"[red]{status}[/red]")
    return table


def print_summary(lines: list[Line], console: Console) -> None:
    """One block per setup: its label on a line of its own (whole, however long),
    then a table per pass; then the fitted exponents. Fits a 100-column terminal."""
    if not lines:
        return
    console.print(
        escape(summary_title(lines)).replace("Summary", "[bold]Summary[/bold]", 1), soft_wrap=True
    )
    header = [column for column in SUMMARY_COLUMNS if column not in ("variant", "pass")]
    groups: dict[str, dict[str, list[list[str]]]] = {}
    for line in lines:
        _, pass_name, *entries = summary_entries(line)
        groups.setdefault(line.label, {}).setdefault(pass_name, []).append(entries)
    for label, passes in groups.items():
        console.print(f"\n[bold]{escape(label)}[/bold]", soft_wrap=True)
        for pass_name, rows in passes.items():
            table = _table_without_empty_columns(header, rows)
            table.title = PASS_TITLES.get(pass_name, pass_name)
            console.print(table)
    shown = {flag for line in lines for flag in line.flags.split("; ") if flag}
    for flag in (flag for flag in FLAG_MEANINGS if flag in shown):
        console.print(f"[yellow]{flag}[/yellow]: {FLAG_MEANINGS[flag]}", soft_wrap=True)
    causal = sorted({line.label for line in lines if line.fidelity_reference == CAUSAL_REFERENCE})
    if causal:
        console.print(
            f"fidelity of {escape(', '.join(causal))} is against causal exact attention: "
            f"they see no later tokens",
            soft_wrap=True,
        )
    note = baseline_note(lines)
    if note:
        console.print(f"[yellow]note[/yellow]: {escape(note)}", soft_wrap=True)
    console.print("\n" + escape(SCALING_TITLE).replace("Scaling", "[bold]Scaling[/bold]", 1))
    scaling = compact_table()
    scaling.add_column("variant", no_wrap=True)
    scaling.add_column("pass", no_wrap=True)
    scaling.add_column("time exponent", justify="right")
    scaling.add_column("memory exponent", justify="right")
    exponent_rows = exponent_entries(lines)
    for row in exponent_rows:
        scaling.add_row(*map(escape, row))
    console.print(scaling)
    note = exponent_note(exponent_rows)
    if note:
        console.print(f"[yellow]{DOUBTFUL}[/yellow]{escape(note[len(DOUBTFUL) :])}")
    for line in lines:
        if line.status != OK:
            console.print(
                f"[red]{line.status}[/red] {escape(line.label)} n={line.seq_len} {line.pass_name}: "
                f"{escape(str(line.error))}",
                soft_wrap=True,
            )
