"""What a line of results.jsonl must be to count as a row: its status among STATUSES,
its identifying keys present; and results.jsonl's bytes parsed into rows and bad lines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

STATUSES = ("ok", "unsupported", "oom", "error", "invalid")
"""A row's status; only `ok` rows are measurements."""


@dataclass(frozen=True)
class BadLine:
    """A line of results.jsonl that is not a row."""

    number: int
    raw: bytes
    reason: str


def row_problem(row: Any) -> str | None:
    """Why a decoded line is not a row of results.jsonl; None when it is one."""
    if not isinstance(row, dict):
        return f"is a JSON {type(row).__name__}, not an object"
    for key in ("cell", "variant", "label", "status"):
        if not isinstance(row.get(key), str):
            return f"has no {key!r} string"
    if row["status"] not in STATUSES:
        return f"has status {row['status']!r}, not one of {', '.join(STATUSES)}"
    is_cost = "task" not in row
    if is_cost and not (isinstance(row.get("seq_len"), int) and isinstance(row.get("pass"), str)):
        return "is a cost row without an integer 'seq_len' and a 'pass'"
    return None


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], list[BadLine], bool]:
    """(rows, bad lines, whether the last line is cut short) of results.jsonl's bytes.

    A last line without its newline is what a crash mid-write leaves: kept when it is a
    whole row, else reported as cut (a resume measures that cell again)."""
    pieces = data.split(b"\n")
    cut = pieces.pop()  # b"" when the file ends with a newline
    rows: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    first_line_of: dict[str, int] = {}

    def decode(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
        if not raw.strip():
            return None, "is blank"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            return None, f"is not UTF-8 text (byte {error.start + 1})"
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            return None, f"is not JSON ({error.msg} at column {error.colno})"
        reason = row_problem(row)
        if reason is None and row["cell"] in first_line_of:
            reason = f"repeats cell {row['cell']!r} of line {first_line_of[row['cell']]}"
        return (row, None) if reason is None else (None, reason)

    for number, raw in enumerate(pieces, start=1):
        row, reason = decode(raw)
        if row is None:
            bad.append(BadLine(number, raw, str(reason)))
        else:
            first_line_of[row["cell"]] = number
            rows.append(row)
    cut_short = False
    if cut:
        row, _ = decode(cut)
        if row is None:
            cut_short = True
        else:
            rows.append(row)
    return rows, bad, cut_short
