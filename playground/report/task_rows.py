"""Which task rows are which, and the language-model rows as the report shows them.

A task row is scored by its "metric": accuracy (the synthetic tasks, and every row written
before the field existed) or bits per byte (the language-model task, one row per (setup,
task, evaluation length)); `is_accuracy_row` and `is_language_row` are the one place that
tells them apart. A language row's setup is its `setup_label` (the variant's label plus
the model settings that are not the default, `vanilla positional_encoding=none`).

Bits per byte are comparable only on the same text: `language_rows`, and through it every
table, CSV and figure of them, refuses (MixedCorpora) a task whose ok rows carry different
corpus fingerprints.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from playground.errors import PlaygroundError
from playground.run.row_schema import Row

OK = "ok"
LANGUAGE_SUMMARY = "lm_summary.csv"
LANGUAGE_COLUMNS = (
    "setup_label",
    "label",
    "variant",
    "task_label",
    "train_length",
    "eval_length",
    "status",
    "bits_per_byte_mean",
    "bits_per_byte_ci95_low",
    "bits_per_byte_ci95_high",
    "bits_per_byte_std",
    "bits_per_byte_per_seed",
    "scored_bytes",
    "unigram_bits_per_byte",
    "bigram_bits_per_byte",
    "validation_bits_per_byte",
    "tokens_per_s",
    "train_time_s",
    "corpus_fingerprint",
    "error",
)
"""The columns of lm_summary.csv."""


class MixedCorpora(PlaygroundError, ValueError):
    """A task's language-model rows were scored on different text: their bits per byte
    cannot stand in one table or figure."""


def is_accuracy_row(row: Row) -> bool:
    """A task row scored by accuracy (a row without "metric" is one: it predates the field)."""
    return "task" in row and row.get("metric", "accuracy") == "accuracy"


def is_language_row(row: Row) -> bool:
    """A language-model row: one (setup, task, evaluation length) scored in bits per byte."""
    return "task" in row and row.get("metric") == "bits_per_byte"


def setup_name(row: Row) -> str:
    """The setup a language row belongs to: its `setup_label`, else its label."""
    return str(row.get("setup_label") or row["label"])


def model_settings(row: Row) -> str:
    """What `setup_name` adds to the row's label: the model settings that are not the
    default (`positional_encoding=none`), "" when none."""
    return setup_name(row).removeprefix(str(row["label"])).strip()


def task_base(row: Row) -> str:
    """The row's task label less the model settings, so that `lm(seq_len=128)` and
    `lm(seq_len=128) positional_encoding=none` are one task, drawn in one panel."""
    label = str(row.get("task_label") or row["task"])
    settings = model_settings(row)
    return label.removesuffix(f" {settings}") if settings else label


def check_corpora(rows: Iterable[Row]) -> None:
    """MixedCorpora when the ok language rows of one task (`task_base`, so a setup's
    model settings do not hide it) carry different corpus fingerprints. A row the runner
    already refused for its corpus has status error and shows no numbers: it mixes nothing."""
    setups: dict[str, dict[str, set[str]]] = {}
    for row in rows:
        fingerprint = row.get("corpus_fingerprint")
        if is_language_row(row) and row.get("status") == OK and isinstance(fingerprint, str):
            found = setups.setdefault(task_base(row), {})
            found.setdefault(fingerprint, set()).add(setup_name(row))
    for task, by_fingerprint in setups.items():
        if len(by_fingerprint) < 2:
            continue
        each = "; ".join(
            f"corpus {fingerprint[:12]} ({', '.join(sorted(names))})"
            for fingerprint, names in sorted(by_fingerprint.items())
        )
        raise MixedCorpora(
            f"the language-model rows of {task} were measured on different corpora: {each}. "
            f"Bits per byte on different text are not comparable, so they are not shown side "
            f"by side. Evaluate every setup again on one corpus (`playground eval` from kept "
            f"weights on a machine that holds it, or a new run), or report the runs separately"
        )


def language_rows(rows: Iterable[Row]) -> list[Row]:
    """The language-model rows sorted by setup, then task, then evaluation length;
    MixedCorpora when a task's rows were scored on different text."""
    selected = [row for row in rows if is_language_row(row)]
    check_corpora(selected)
    return sorted(
        selected,
        key=lambda row: (
            setup_name(row),
            str(row.get("task_label")),
            row.get("train_length") or 0,
            row.get("eval_length") or 0,
        ),
    )


def language_records(rows: Iterable[Row]) -> list[dict[str, object]]:
    """`language_rows` reduced to LANGUAGE_COLUMNS (lm_summary.csv)."""
    return [
        {**{column: row.get(column) for column in LANGUAGE_COLUMNS}, "setup_label": setup_name(row)}
        for row in language_rows(rows)
    ]


def visible(text: str) -> str:
    """`text` with every control or otherwise invisible character but newline and tab
    written as its Python escape (`\\x00`, `\\r`, `\\u200b`), so a sample shows what the
    model produced rather than what a terminal or browser makes of it."""
    return "".join(
        character
        if character in "\n\t" or not unicodedata.category(character).startswith("C")
        else character.encode("unicode_escape").decode("ascii")
        for character in text
    )


@dataclass(frozen=True)
class Continuation:
    """A setup's greedy continuation of the task's prompt (its first seed's)."""

    setup: str
    task: str
    """`task_base`: the task less the model settings the setup carries."""
    seed: Any
    prompt: str
    continuation: str


def continuations(rows: Iterable[Row]) -> list[Continuation]:
    """One per ok (setup, task) row at the training length that holds samples, in the
    order of `language_rows`; prompt and continuation through `visible`."""
    found = []
    for row in language_rows(rows):
        samples = row.get("samples")
        at_training_length = row.get("eval_length") == row.get("train_length")
        if row.get("status") != OK or not at_training_length or not samples:
            continue
        first = samples[0] if isinstance(samples[0], dict) else {}
        found.append(
            Continuation(
                setup_name(row),
                task_base(row),
                first.get("seed"),
                visible(str(first.get("prompt", ""))),
                visible(str(first.get("continuation", ""))),
            )
        )
    return found
