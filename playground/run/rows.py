"""What a line of results.jsonl must be to count as a row: its status among STATUSES,
its identifying keys present, and each field it holds of the type `row_schema.Row`
declares; and results.jsonl's bytes parsed into rows and bad lines.

The field checks are made from the schema's annotations (`field_check`), not restated:
a field declared there is checked here. A key the schema does not declare is allowed, of
any type, so that a run written by an older or newer version still loads."""

from __future__ import annotations

import json
import reprlib
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

from playground.run.row_schema import Row

STATUSES = ("ok", "unsupported", "oom", "error", "invalid")
"""A row's status; only `ok` rows are measurements."""


@dataclass(frozen=True)
class BadLine:
    """A line of results.jsonl that is not a row."""

    number: int
    raw: bytes
    reason: str


FieldCheck = Callable[[object], bool]
"""Whether a decoded JSON value is of one declared type."""

_EXACT_TYPES: dict[Any, frozenset[type]] = {
    str: frozenset({str}),
    int: frozenset({int}),  # not bool: True is no count
    float: frozenset({int, float}),  # JSON may write a whole float as an int
    bool: frozenset({bool}),
    type(None): frozenset({type(None)}),
}


def _instance_of(exact: frozenset[type]) -> FieldCheck:
    """A value of a subclass of a declared scalar type is one too, as for mypy (a row
    being written may hold a GemmRate, a float); a bool is no number even so."""
    kinds = tuple(exact)
    return lambda value: isinstance(value, kinds) and not isinstance(value, bool)


def _split(annotation: Any) -> tuple[frozenset[type], FieldCheck]:
    """(the exact types a decoded value of `annotation` may have, the check of any other
    value: a subclass of one of them, or a container it may be): most fields are scalars,
    whose check is one set lookup."""
    if annotation in _EXACT_TYPES:
        exact = _EXACT_TYPES[annotation]
        return exact, _instance_of(exact)
    if get_origin(annotation) not in (Union, types.UnionType):
        return frozenset(), _container_check(annotation)
    parts = [_split(argument) for argument in get_args(annotation)]
    exact = frozenset().union(*(types_ for types_, _ in parts))
    others = [check for _, check in parts]
    return exact, lambda value: any(check(value) for check in others)


def _container_check(annotation: Any) -> FieldCheck:
    if annotation is Any:
        return lambda value: True
    if is_typeddict(annotation):
        checks = {key: field_check(hint) for key, hint in get_type_hints(annotation).items()}
        required = annotation.__required_keys__
        return lambda value: (
            isinstance(value, dict)
            and required <= value.keys()
            and all(check(value[key]) for key, check in checks.items() if key in value)
        )
    origin, arguments = get_origin(annotation), get_args(annotation)
    if origin is list:
        item = field_check(arguments[0])
        return lambda value: isinstance(value, list) and all(item(each) for each in value)
    if origin is dict and arguments[0] is str:  # a JSON object's keys are strings
        if arguments[1] is Any:
            return lambda value: isinstance(value, dict)
        entry = field_check(arguments[1])
        return lambda value: isinstance(value, dict) and all(map(entry, value.values()))
    raise TypeError(f"a row field of type {annotation!r} has no check; declare it otherwise")


def field_check(annotation: Any) -> FieldCheck:
    """The check of a decoded JSON value against a type of the schema: str, int, float (an
    int too), bool, None, Any, unions of them, list[...], dict[str, ...] and TypedDicts
    (their required keys present, their declared keys checked, others allowed).
    TypeError for a form the schema does not use."""
    exact, other = _split(annotation)
    return lambda value: type(value) in exact or other(value)


def type_text(annotation: Any) -> str:
    """A schema type as a reader writes it: `float | None`, `list[float]`, `Sample`."""
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "Any"
    origin, arguments = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(argument) for argument in arguments)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_text(argument) for argument in arguments)}]"
    return str(annotation.__name__)


FIELD_CHECKS = {key: (*_split(hint), type_text(hint)) for key, hint in get_type_hints(Row).items()}
"""Each field `Row` declares -> (the exact types its value may have, the check of any
other value, its type as text)."""

_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother = 60, 60


def field_problem(row: dict[str, Any]) -> str | None:
    """Why a field of `row` is not of its declared type (the first such, naming the key,
    the type it must have and the value it has); None when each declared one is."""
    for key, value in row.items():
        declared = FIELD_CHECKS.get(key)
        if declared is None or type(value) in declared[0] or declared[1](value):
            continue
        kind = "None" if value is None else type(value).__name__
        return f"has {key!r} = {_SHOWN.repr(value)} (a {kind}), not {declared[2]}"
    return None


def row_problem(row: Any) -> str | None:
    """Why a decoded line is not a row of results.jsonl (the schema's `Row`); None when it
    is one. Keys `Row` does not declare are allowed (forward compatibility)."""
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
    return field_problem(row)


def parse_lines(data: bytes) -> tuple[list[Row], list[BadLine], bool]:
    """(rows, bad lines, whether the last line is cut short) of results.jsonl's bytes.

    A last line without its newline is what a crash mid-write leaves: kept when it is a
    whole row, else reported as cut (a resume measures that cell again)."""
    pieces = data.split(b"\n")
    cut = pieces.pop()  # b"" when the file ends with a newline
    rows: list[Row] = []
    bad: list[BadLine] = []
    first_line_of: dict[str, int] = {}

    def decode(raw: bytes) -> tuple[Row | None, str | None]:
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
