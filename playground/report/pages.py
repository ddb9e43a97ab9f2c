"""A run's report, in two files next to its results:

    report.html   self-contained: the summary tables, the language models' greedy
                  continuations, every figure embedded as a base64 data URI, the failed
                  cells with their errors, the environment and the spec; one file to mail
                  or attach
    report.md     the same tables in Markdown, figures linked by relative file name, for
                  pasting into issues and papers

    write_report(run_dir, figures) -> (report.html, report.md)

Every piece of text from the run (labels, errors, the spec, a model's continuation) is
HTML-escaped in the HTML, and `|` is escaped in Markdown table entries; a continuation's
control characters are written as escapes (`report.language.visible`).
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from playground.report.learned import LEARNED_COLUMNS, LEARNED_TITLE, learned_entries
from playground.report.plots.data import OK, RunData, load_run
from playground.report.suite_tables import (
    SWEEP_NOTE,
    SWEEP_TABLE_COLUMNS,
    SWEEP_TITLE,
    TASK_GRID_TITLE,
    sweep_entries,
    task_grid_entries,
)
from playground.report.summary import Line, ceilings_from_env, summarize
from playground.report.tables import (
    EXPONENT_COLUMNS,
    LANGUAGE_TABLE_COLUMNS,
    LANGUAGE_TITLE,
    SCALING_TITLE,
    SUMMARY_COLUMNS,
    exponent_entries,
    exponent_note,
    language_entries,
    summary_entries,
    summary_title,
)
from playground.report.task_rows import Continuation, continuations
from playground.run.row_schema import Row
from playground.run.stats import accuracy_bounds, format_interval

HTML_REPORT = "report.html"
MARKDOWN_REPORT = "report.md"
EMBEDDED_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}
"""Figure formats a browser shows inline; a PDF is linked, not embedded."""

Table = tuple[list[str], list[list[str]]]
"""(header, rows), every entry already a string."""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child, td.text { text-align: left; }
td.failed { color: #b00020; font-weight: bold; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
pre .prompt { color: #888; }
"""
LEARNED_NOTE = (
    "Each variant's learned_summary hook names what it learned (a value per head is a list, "
    "head 0 first); layers that hold equal values in every seed (a table shared across the "
    "stack) are one entry."
)
CONTINUATIONS = "Continuations"
CONTINUATIONS_NOTE = (
    "Each setup's greedy continuation of the task's prompt, by its first seed's model at the "
    "training length: what the bits per byte mean. Control characters are written as escapes."
)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(lines: Sequence[Line]) -> Table:
    """One row per (setup, pass, n), as `report.summary` condenses them."""
    return list(SUMMARY_COLUMNS), [summary_entries(line) for line in lines]


def exponent_table(lines: Sequence[Line]) -> Table:
    """Fitted log-log exponents of time and memory per (setup, pass)."""
    return list(EXPONENT_COLUMNS), exponent_entries(list(lines))


def accuracy_table(rows: Iterable[Row]) -> Table:
    """One row per (setup, task)."""
    header = [
        "variant",
        "task",
        "accuracy (mean [95% interval])",
        "per seed",
        "chance",
        "steps",
        "train s",
        "status",
    ]
    table = []
    for row in rows:
        mean = row.get("accuracy_mean")
        accuracy = "-" if mean is None else format_interval(mean, accuracy_bounds(row))
        table.append(
            [
                row["label"],
                str(row.get("task_label") or row["task"]),
                accuracy,
                ", ".join(f"{a:.3f}" for a in row.get("accuracy_per_seed") or []) or "-",
                _number(row.get("chance"), ".3f"),
                str(row.get("steps", "-")),
                _number(row.get("train_time_s"), ".1f"),
                str(row.get("status", OK)),
            ]
        )
    return header, table


def language_table(rows: list[Row]) -> Table:
    """One row per (setup, task, evaluation length): bits per byte and the baselines."""
    return list(LANGUAGE_TABLE_COLUMNS), language_entries(rows)


def _continuation_heading(sample: Continuation, samples: Sequence[Continuation]) -> str:
    """The setup, with its task when the run has several, and the seed."""
    several_tasks = len({each.task for each in samples}) > 1
    task = f" on {sample.task}" if several_tasks else ""
    return f"{sample.setup}{task} (seed {sample.seed})"


def _continuations_html(samples: Sequence[Continuation]) -> list[str]:
    parts = [
        f"<h2>{CONTINUATIONS}</h2>",
        f"<p>{html.escape(CONTINUATIONS_NOTE)} The prompt is grey.</p>",
    ]
    for sample in samples:
        parts += [
            f"<h3>{html.escape(_continuation_heading(sample, samples))}</h3>",
            f'<pre><span class="prompt">{html.escape(sample.prompt)}</span>'
            f"{html.escape(sample.continuation)}</pre>",
        ]
    return parts


def _continuations_markdown(samples: Sequence[Continuation]) -> list[str]:
    parts = [f"## {CONTINUATIONS}", "", CONTINUATIONS_NOTE, ""]
    for sample in samples:
        text = sample.prompt + sample.continuation
        fence = "`" * max(3, _longest_run(text, "`") + 1)  # no backtick in the text closes it
        parts += [
            f"### {_continuation_heading(sample, samples)}",
            "",
            f"The first {len(sample.prompt)} characters are the prompt.",
            "",
            f"{fence}text",
            text,
            fence,
            "",
        ]
    return parts


def _longest_run(text: str, character: str) -> int:
    longest = current = 0
    for each in text:
        current = current + 1 if each == character else 0
        longest = max(longest, current)
    return longest


def failure_table(rows: Iterable[Row]) -> Table:
    """Every cell that did not finish ok, with its full error."""
    table = []
    for row in rows:
        where = row.get("cell") or row["label"]
        if (task := row.get("task")) and task not in str(where):
            where = f"{where} | {row.get('task_label') or row['task']}"
        table.append([str(where), str(row.get("status")), str(row.get("error") or "")])
    return ["cell", "status", "error"], table


def load_error_table(env: dict[str, Any]) -> Table:
    """Plugins that failed to load when the run started (env.json's
    `plugin_load_errors`, absent in older runs): their variants are missing from every
    table, and the report must say why rather than leave them out without a word."""
    entries = env.get("plugin_load_errors") or []
    if not isinstance(entries, list):
        entries = [entries]
    table = []
    for entry in entries:
        if isinstance(entry, dict):
            table.append([str(entry.get("source", "?")), str(entry.get("error", ""))])
        else:
            table.append(["?", str(entry)])
    return ["plugin", "error"], table


def environment_table(env: dict[str, Any]) -> Table:
    rows = [
        [key, value if isinstance(value, str) else json.dumps(value)]
        for key, value in sorted(env.items())
    ]
    return ["key", "value"], rows


def _chosen_figures(figures: Sequence[Path]) -> list[tuple[Path, list[Path]]]:
    """(the file to show, every file of that figure) per figure stem, in the given order:
    PNG before SVG before anything else."""
    stems: dict[str, list[Path]] = {}
    for path in figures:
        stems.setdefault(path.stem, []).append(Path(path))
    preference = [".png", ".svg"]

    def rank(path: Path) -> int:
        return preference.index(path.suffix) if path.suffix in preference else len(preference)

    return [(min(paths, key=rank), paths) for paths in stems.values()]


def _html_table(table: Table) -> str:
    header, rows = table
    head = "".join(f"<th>{html.escape(name)}</th>" for name in header)
    body = []
    for row in rows:
        entries = []
        for name, entry in zip(header, row, strict=True):
            css = ""
            if name == "status" and entry != OK:
                css = ' class="failed"'
            elif name in ("error", "value", "task"):
                css = ' class="text"'
            entries.append(f"<td{css}>{html.escape(entry)}</td>")
        body.append("<tr>" + "".join(entries) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _markdown_entry(entry: str) -> str:
    return entry.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ") or " "


def _markdown_table(table: Table) -> str:
    header, rows = table
    lines = ["| " + " | ".join(_markdown_entry(c) for c in header) + " |"]
    lines.append("| " + " | ".join("---" for _ in header) + " |")
    lines.extend("| " + " | ".join(_markdown_entry(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def _sections(run: RunData) -> list[tuple[str, Table, str | None]]:
    """(title, table, note under it or None) of every table section that has rows."""
    sections: list[tuple[str, Table, str | None]] = []
    if run.measurements:
        lines = summarize(run.measurements, run.spec.get("baseline"), ceilings_from_env(run.env))
        sections.append((summary_title(lines), summary_table(lines), None))
        scaling = exponent_table(lines)
        sections.append((SCALING_TITLE, scaling, exponent_note(scaling[1])))
    if run.accuracy:
        accuracy = accuracy_table(run.accuracy)
        sections.append(("Accuracy (mean [95% interval over seeds])", accuracy, None))
    grid = task_grid_entries(run.rows)
    if grid[1]:
        sections.append((TASK_GRID_TITLE, grid, None))
    if run.sweeps:
        entries = sweep_entries(run.sweeps)
        sections.append((SWEEP_TITLE, (list(SWEEP_TABLE_COLUMNS), entries), SWEEP_NOTE))
    if run.language:
        sections.append((LANGUAGE_TITLE, language_table(run.language), None))
    learned = learned_entries([*run.accuracy, *run.language])
    if learned:
        sections.append((LEARNED_TITLE, (list(LEARNED_COLUMNS), learned), LEARNED_NOTE))
    if run.failed:
        sections.append(("Failed cells", failure_table(run.failed), None))
    load_errors = load_error_table(run.env)
    if load_errors[1]:
        heading = "Plugins that failed to load (their variants did not run)"
        sections.append((heading, load_errors, None))
    return sections


def _title(run: RunData) -> tuple[str, str]:
    name = run.env.get("experiment") or run.spec.get("name") or run.directory.name
    return f"Run {name} — {run.directory.name}", str(run.spec.get("description", ""))


def _image_tag(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    mime = EMBEDDED_TYPES[path.suffix]
    alt = html.escape(path.stem.replace("_", " "))
    return f'<img src="data:{mime};base64,{data}" alt="{alt}">'


def render_html(run: RunData, figures: Sequence[Path]) -> str:
    title, description = _title(run)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if description:
        parts.append(f"<p>{html.escape(description)}</p>")
    parts.append(f"<p>{html.escape(run.environment_note())}</p>")
    for heading, table, note in _sections(run):
        parts += [f"<h2>{html.escape(heading)}</h2>", _html_table(table)]
        if note:
            parts.append(f"<p>{html.escape(note)}</p>")
    samples = continuations(run.language)
    if samples:
        parts += _continuations_html(samples)
    chosen = _chosen_figures(figures)
    if chosen:
        parts.append("<h2>Figures</h2>")
    for shown, paths in chosen:
        caption = html.escape(shown.stem.replace("_", " "))
        others = ", ".join(html.escape(p.name) for p in paths if p != shown)
        if shown.suffix in EMBEDDED_TYPES:
            body = _image_tag(shown)
        else:
            body = f"<p>{html.escape(shown.name)} (not embeddable; next to this report)</p>"
        extra = f" (also written: {others})" if others else ""
        parts.append(f"<figure>{body}<figcaption>{caption}{extra}</figcaption></figure>")
    parts += [
        "<h2>Environment</h2>",
        _html_table(environment_table(run.env)),
        "<h2>Spec</h2>",
        f"<pre>{html.escape(run.spec_text)}</pre>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def render_markdown(run: RunData, figures: Sequence[Path], relative_to: Path) -> str:
    title, description = _title(run)
    parts = [f"# {title}", ""]
    if description:
        parts += [description, ""]
    parts += [run.environment_note(), ""]
    for heading, table, note in _sections(run):
        parts += [f"## {heading}", "", _markdown_table(table), ""]
        if note:
            parts += [note, ""]
    samples = continuations(run.language)
    if samples:
        parts += _continuations_markdown(samples)
    chosen = _chosen_figures(figures)
    if chosen:
        parts += ["## Figures", ""]
    for shown, _ in chosen:
        relative = Path(os.path.relpath(shown, relative_to)).as_posix()
        parts += [f"![{shown.stem.replace('_', ' ')}]({relative})", ""]
    parts += ["## Environment", "", _markdown_table(environment_table(run.env)), ""]
    parts += ["## Spec", "", "```toml", run.spec_text.rstrip(), "```", ""]
    return "\n".join(parts)


def write_report(run_dir: Path, figures: list[Path]) -> tuple[Path, Path]:
    """Write report.html (self-contained) and report.md into run_dir; returns both paths.

    `figures` are the files `playground.report.plots.plot_run` wrote (any formats); PNG or SVG
    are embedded, other formats are named. Raises PlotError when run_dir has no rows."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    html_path, markdown_path = run_dir / HTML_REPORT, run_dir / MARKDOWN_REPORT
    html_path.write_text(render_html(run, figures), encoding="utf-8")
    markdown_path.write_text(render_markdown(run, figures, run_dir), encoding="utf-8")
    return html_path, markdown_path
