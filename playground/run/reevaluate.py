"""`playground eval RUN --eval-lengths ...`: the language models a run kept (spec key
`save_weights = true`, or `--save-weights`) scored again at new evaluation lengths, without
training, each new length appended to the same results.jsonl as a row of its own.

A length a cell already has a row for is skipped, so an interrupted evaluation is finished
by running the same command again. The lengths asked for are kept in the run
(evaluations.json) before the first row is written, so `playground run --resume` scores
again any of them a kept model lacks a row at (an interrupted evaluation, a row cut by a
crash or set aside by `playground repair`): `recorded_lengths`, `missing_evaluations`. Only cells whose training row is `ok` and on the run's
corpus are scored (a cell the runner marked as trained on other text is skipped, said). The
corpus here must be the one the models trained on: a cell whose fingerprint differs is
skipped with a message naming both, and when no cell is left the command is refused. A
weights file that cannot be read is a DamagedRun naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from playground.errors import ConfigError, PlaygroundError
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry
from playground.run.instruments import using_threads
from playground.run.language_scores import (
    EVAL_LENGTH_TAG,
    baseline_fields,
    corpus_conflict,
    eval_cell_id,
    length_fields,
    length_row,
    score_length,
)
from playground.run.model_settings import build_model
from playground.run.resume import resume
from playground.run.row_schema import LengthFields, Row
from playground.run.store import ENV, EVALUATIONS, REJECTED, ROWS, RunStore
from playground.tasks import LanguageTask


@dataclass(frozen=True)
class Evaluation:
    """One trained cell to score at one new length."""

    row: Row
    """The cell's row at its training length (with its "weights")."""
    length: int


def trained_rows(
    store: RunStore, command: str = "eval", purpose: str = "scores the models such a run trained"
) -> list[Row]:
    """The language cells' rows at their training length that kept weights, for
    `playground COMMAND` (which `purpose`); PlaygroundError saying what to do when the run
    has no language cells, or none kept its weights."""
    rows = [
        row
        for row in store.rows()
        if row.get("metric") == "bits_per_byte"
        and row.get("eval_length") == row.get("train_length")
    ]
    if not rows:
        raise PlaygroundError(
            f"{store.directory} has no language-model cells (a task like lm); "
            f"`playground {command}` {purpose}"
        )
    kept = [row for row in rows if row.get("weights") and row.get("status") == "ok"]
    if not kept:
        raise PlaygroundError(
            f"{store.directory} kept no trained weights, so `playground {command}` has no "
            f"model to use; run the spec with save_weights = true (the spec key; or "
            f"--save-weights), then `playground {command}` that run"
        )
    return kept


EVAL_LENGTH_IN_CELL = re.compile(rf"\|{EVAL_LENGTH_TAG}=([0-9]+)\"")
"""A row's cell id at an evaluation length, as a line set aside holds it (cut or not)."""


def recorded_lengths(store: RunStore) -> list[int]:
    """The lengths `playground eval` was asked for in this run: evaluations.json, the rows
    it wrote (a run evaluated before that file), and the evaluation lengths of lines set
    aside in results.rejected.jsonl (a length the spec asked for is there already, so
    scoring it again is skipped)."""
    lengths = set()
    if store.path(EVALUATIONS).exists():
        lengths.update(store.read_json(EVALUATIONS).get("eval_lengths", []))
    lengths.update(row["eval_length"] for row in store.rows() if "evaluated_at" in row)
    rejected = store.path(REJECTED)
    if rejected.is_file():
        for line in rejected.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError):  # a line of another kind
                text = json.loads(line)["text"]
                lengths.update(int(match) for match in EVAL_LENGTH_IN_CELL.findall(text))
    return sorted(length for length in lengths if isinstance(length, int) and length > 0)


def missing_evaluations(store: RunStore) -> list[Evaluation]:
    """What `playground eval` was asked for in this run that has no row now (none in a
    run that kept no weights)."""
    lengths = recorded_lengths(store)
    try:
        return planned(store, lengths) if lengths else []
    except PlaygroundError:  # no language rows, or none kept its weights: nothing to score
        return []


def record_lengths(store: RunStore, lengths: Sequence[int]) -> None:
    """Add `lengths` to the run's evaluations.json (see the module docstring)."""
    known = (
        store.read_json(EVALUATIONS).get("eval_lengths", [])
        if store.path(EVALUATIONS).exists()
        else []
    )
    store.write_json(EVALUATIONS, {"eval_lengths": sorted({*known, *lengths})})


def planned(store: RunStore, lengths: Sequence[int]) -> list[Evaluation]:
    """Every (trained cell, new length) without a row yet, cell by cell."""
    done = {row["cell"] for row in store.rows()}
    return [
        Evaluation(row, length)
        for row in trained_rows(store)
        for length in sorted(set(lengths))
        if length != row["train_length"] and eval_cell_id(row["cell"], length) not in done
    ]


def task_of(registry: Registry, row: Row) -> LanguageTask:
    """The row's task, rebuilt on this machine; ConfigError when its corpus here is not
    the one the row's models trained on, or the task cannot be made here."""
    task = registry.get_task(row["task"])(**row["task_options"])
    if not isinstance(task, LanguageTask):
        raise ConfigError(f"task {row['task']!r} of cell {row['cell']!r} is not a language task")
    if task.fingerprint != row.get("corpus_fingerprint"):
        recorded = str(row.get("corpus_fingerprint"))[:12]
        raise ConfigError(
            f"the corpus {task.options.corpus!r} here (fingerprint {task.fingerprint[:12]}) is "
            f"not the one cell {row['cell']!r} trained on ({recorded}, read from "
            f"{row.get('corpus', {}).get('root')}); bits per byte on other text would not be "
            f"comparable. Evaluate where that corpus is, or train again on this one"
        )
    return task


def length_problem(task: LanguageTask, length: int) -> str | None:
    """Why the kept models cannot be scored at `length` (the run's held-out set is fixed,
    so a longer length needs a new run); None when they can."""
    try:
        task.check_eval_length(length)
    except ConfigError as error:
        return (
            f"{error}. The held-out set of a finished run is fixed: train a new run with a "
            "larger eval_bytes for that length"
        )
    return None


def models(
    store: RunStore, registry: Registry, row: Row, device: str, dtype: torch.dtype
) -> Iterator[tuple[int, TransformerClassifier]]:
    """(seed, trained model) for every seed the row kept weights for."""
    fields = {field.name for field in dataclasses.fields(ModelConfig)}
    config = ModelConfig(**{k: v for k, v in row["model"].items() if k in fields})
    for seed, relative in sorted(row["weights"].items(), key=lambda item: int(item[0])):
        model = build_model(config, registry).to(device, dtype)
        try:
            model.load_state_dict(store.load_weights(relative))
        except RuntimeError as error:  # the state dict does not fit the row's model
            raise ConfigError(
                f"{store.path(relative)} does not fit the model its row describes "
                f"({str(error).splitlines()[0]}); the file was replaced or the variant changed"
            ) from None
        yield int(seed), model


def evaluate_again(
    directory: str | os.PathLike[str],
    registry: Registry,
    lengths: Sequence[int],
    plugins_dirs: Sequence[str] = (),
    announce: Callable[[str], None] = print,
) -> int:
    """Score the run's kept models at `lengths` and append a row per (cell, new length);
    returns the rows written."""
    resumed = resume(directory, registry, plugins_dirs)
    store, spec, registry = resumed.store, resumed.spec, resumed.registry
    if not lengths or min(lengths) < 1:
        raise ConfigError(f"give positive evaluation lengths, like 4096,8192; got {list(lengths)}")
    threads = store.read_json(ENV).get("threads") if store.path(ENV).exists() else None
    written = 0
    command = f"`playground eval {store.directory} --eval-lengths {','.join(map(str, lengths))}`"
    with store.lock(then=command), using_threads(threads):
        cut = store.set_aside_cut_line()  # under the lock: no writer is mid-line now
        if cut is not None:
            announce(
                f"{store.path(ROWS)} line {cut.number} was cut short (a crash while it was "
                f"written); it is set aside in {REJECTED}, and `playground run --resume "
                f"{store.directory}` measures its row again"
            )
        corpora: dict[str, str] = {}
        for earlier in store.rows():
            corpus_conflict(earlier, corpora)
        work = planned(store, lengths)
        if not work:
            announce("nothing to evaluate: every kept model has a row at each of those lengths")
        cells = list({id(each.row): each.row for each in work}.values())  # in work's order
        tasks: dict[str, LanguageTask] = {}
        skipped: list[str] = []
        for row in cells:
            try:
                task = task_of(registry, row)
            except ConfigError as error:
                skipped.append(str(error))
                announce(f"skipped: {error}")
                continue
            problem = next(filter(None, (length_problem(task, n) for n in lengths)), None)
            if problem:
                raise ConfigError(problem)
            tasks[row["cell"]] = task
        if skipped and not tasks:
            raise ConfigError(skipped[0])
        if tasks:  # before the first row: a resume then finishes what this one leaves
            record_lengths(store, lengths)
        for row in cells:
            if row["cell"] not in tasks:
                continue
            task = tasks[row["cell"]]
            todo = [each.length for each in work if each.row is row]
            scores: dict[int, list] = {length: [] for length in todo}
            seeds = []
            for seed, model in models(store, registry, row, spec.device, spec.torch_dtype):
                seeds.append(seed)
                for length in todo:
                    announce(f"{row['cell']}: seed {seed} at {length}")
                    scores[length].append(score_length(model, task, length, spec.device))
            for length in todo:
                fields: LengthFields = {
                    **length_fields(length, seeds, scores[length]),
                    **baseline_fields(task, length),
                }
                new: Row = {**length_row(row, fields), "evaluated_at": time.time()}
                conflict = corpus_conflict(new, corpora)
                if conflict and new.get("status") == "ok":
                    new["status"], new["error"] = "error", conflict  # its numbers stay in the row
                store.append(new)
                written += 1
    return written
