"""A language model's scores: bits per byte at its training length and at longer ones, the
n-gram baselines beside them, a continuation to read, and the rows they become.

A trained model is scored on the task's fixed held-out set at every evaluation length
(`LanguageTask.held_out`); a length the variant cannot run at (its declared `max_seq_len`,
an UnsupportedFeature raised at that length) is recorded as `unsupported` for that length
alone, naming why, and any other failure there as that length's `error`: the model and
its other lengths stand.

The seeds' scores become one row per evaluation length (`length_fields`): the row at the
training length is the cell's own, the others are recorded under `<cell>|eval_len=<n>`
(`eval_cell_id`). `playground eval` appends rows for new lengths to a run from the
weights it kept (playground.run.reevaluate).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from playground.errors import ConfigError, FailureFields, failure_fields, first_seed_failure
from playground.model.sampling import continue_bytes
from playground.model.training import bits_by_position, bits_per_byte
from playground.model.transformer import TransformerClassifier
from playground.run.model_settings import refuse_beyond_limit
from playground.run.passkey_scores import PasskeyScore, chance_log_likelihood, score_passkey
from playground.run.row_schema import LengthFields, LengthScores, Row, TaskOutcome
from playground.run.stats import interval_half_width
from playground.tasks import LanguageTask

EVAL_LENGTH_TAG = "eval_len"


def eval_cell_id(cell_id: str, length: int) -> str:
    """The id of a cell's row at evaluation length `length` (not its training length)."""
    return f"{cell_id}|{EVAL_LENGTH_TAG}={length}"


LENGTH_FIELDS = (
    "eval_length",
    "status",
    "error",
    "scored_bytes",
    "unigram_bits_per_byte",
    "bigram_bits_per_byte",
)
"""What a cell's row at one evaluation length has of its own, beside PER_LENGTH_PREFIXES."""
PER_LENGTH_PREFIXES = (
    "bits_per_byte",
    "accuracy_",
    "majority_",
    "state_",
    "passkey_",
    "evaluations",
)
"""The fields of the training length's row that another length's row never inherits: its
scores (bits per byte and the passkey probe's, or an accuracy task's), and the decoding
state at that length."""


def length_row(row: Row, fields: LengthFields) -> Row:
    """The row of `row`'s cell at another evaluation length: everything the lengths share
    (the training, the corpus) from `row`, then that length's `fields`."""
    shared = {
        key: value
        for key, value in row.items()
        if key not in LENGTH_FIELDS and not key.startswith(PER_LENGTH_PREFIXES)
    }
    return cast(Row, {**shared, **fields, "cell": eval_cell_id(row["cell"], fields["eval_length"])})


def corpus_conflict(row: Row, known: dict[str, str]) -> str | None:
    """Why `row` cannot sit beside the run's rows of its task (`known`: the task and its
    options -> corpus fingerprint, updated with `row`'s when there is none yet; model
    settings such as NoPE do not make another task); None when it can."""
    fingerprint = row.get("corpus_fingerprint")
    if not isinstance(fingerprint, str):
        return None
    task = json.dumps([row.get("task"), row.get("task_options")], sort_keys=True, default=str)
    first = known.setdefault(task, fingerprint)
    if first == fingerprint:
        return None
    return (
        f"this cell was measured on a different corpus (fingerprint {fingerprint[:12]}) from "
        f"the run's other rows of task {row.get('task')!r} with these options ({first[:12]}); "
        f"bits per byte on different text are not comparable, so it is not reported beside "
        f"them. Measure it where the corpus is the one the run started with (its source and "
        f"root are in the row), or start a new run"
    )


def evaluation_lengths(train_length: int, requested: Iterable[int]) -> tuple[int, ...]:
    """The training length first, then the other requested lengths, ascending, once each."""
    return (train_length, *sorted(set(requested) - {train_length}))


@dataclass(frozen=True)
class LengthScore:
    """One seed's model at one evaluation length."""

    length: int
    bits_per_byte: float | None = None
    scored_bytes: int = 0
    failure: FailureFields | None = None
    """`failure_fields` of why it was not scored (None when it was)."""
    passkey: PasskeyScore | None = None
    """The passkey probe at this length (None: the task has none)."""
    by_position: tuple[float, ...] = ()
    """Bits per byte over each bucket of positions ([0, B), [B, 2B), …; the last one
    may be shorter), B the task's `position_bucket`."""


@dataclass(frozen=True)
class LanguageScores:
    """One seed's language model scored."""

    lengths: tuple[LengthScore, ...]
    validation_bits_per_byte: float
    continuation: str
    """The greedy continuation of the task's prompt, decoded with replacement characters."""
    fingerprint: str
    tokens_per_s: float
    """Training throughput: positions trained on per second of optimisation."""


def score_length(
    model: TransformerClassifier, task: LanguageTask, length: int, device: str
) -> LengthScore:
    """Bits per byte of `model` on the held-out set in windows of `length`."""
    try:
        refuse_beyond_limit(model, length)
        data = task.held_out(length)
        totals, counts = bits_by_position(model, data, device=device)
        bucket = task.position_bucket
        by_position = tuple(
            float(totals[start : start + bucket].sum() / counts[start : start + bucket].sum())
            for start in range(0, length, bucket)
        )
        return LengthScore(
            length,
            float(totals.sum()) / float(counts.sum()),
            data.tokens.numel(),
            passkey=score_passkey(model, task, length, device=device),
            by_position=by_position,
        )
    except Exception as error:  # one length's failure is its row's, not the model's
        return LengthScore(length, failure=failure_fields(error))


def score_language(
    model: TransformerClassifier,
    task: LanguageTask,
    lengths: Sequence[int],
    *,
    tokens_per_s: float,
    device: str = "cpu",
) -> LanguageScores:
    """Score a trained model at every length of `lengths` (the training length first)."""
    train_length = task.seq_len
    continuation = continue_bytes(model, task.prompt, task.sample_bytes, device=device)
    return LanguageScores(
        lengths=tuple(score_length(model, task, length, device) for length in lengths),
        validation_bits_per_byte=bits_per_byte(model, task.validation(train_length), device=device),
        continuation=continuation.decode("utf-8", errors="replace"),
        fingerprint=task.fingerprint,
        tokens_per_s=tokens_per_s,
    )


def length_fields(length: int, seeds: Sequence[int], scores: Sequence[LengthScore]) -> LengthFields:
    """The fields of the row at one evaluation length from every seed's score there: the
    mean with its 95 % Student-t interval over seeds, or the first seed's failure."""
    fields: dict[str, Any] = {"eval_length": length}
    failure = first_seed_failure(zip(seeds, (score.failure for score in scores), strict=True))
    if failure is not None:
        fields.update(failure)
        return cast(LengthFields, fields)
    values = [score.bits_per_byte for score in scores if score.bits_per_byte is not None]
    mean = statistics.fmean(values)
    buckets = list(zip(*(score.by_position for score in scores), strict=True))
    half = interval_half_width(values)
    fields.update(
        status="ok",
        error=None,
        bits_per_byte_mean=mean,
        bits_per_byte_ci95=half,
        bits_per_byte_ci95_low=None if half is None else mean - half,
        bits_per_byte_ci95_high=None if half is None else mean + half,
        bits_per_byte_std=statistics.stdev(values) if len(values) > 1 else 0.0,
        bits_per_byte_per_seed=values,
        scored_bytes=scores[0].scored_bytes,
        bits_per_byte_by_position=[statistics.fmean(bucket) for bucket in buckets],
        bits_per_byte_by_position_ci95=[interval_half_width(bucket) for bucket in buckets],
    )
    probes = [score.passkey for score in scores if score.passkey is not None]
    if probes:
        fields.update(passkey_fields(probes))
    return cast(LengthFields, fields)


def passkey_fields(probes: Sequence[PasskeyScore]) -> LengthScores:
    """The passkey probe's fields of a row at one length: per depth, exact match and the
    key's log-likelihood in bits, the mean over seeds, and each seed's exact matches."""
    first = probes[0]
    return {
        "passkey_depths": list(first.depths),
        "passkey_exact": [
            statistics.fmean(each) for each in zip(*(p.exact for p in probes), strict=True)
        ],
        "passkey_exact_per_seed": [list(probe.exact) for probe in probes],
        "passkey_log_likelihood": [
            statistics.fmean(each) for each in zip(*(p.log_likelihood for p in probes), strict=True)
        ],
        "passkey_chance_log_likelihood": chance_log_likelihood(first.digits),
        "passkey_trials": first.trials,
    }


def baseline_fields(task: LanguageTask, length: int) -> LengthScores:
    """The n-gram baselines on the bytes scored at `length` (none where that length has no
    held-out set: its row says why)."""
    try:
        baselines = task.baselines(length)
    except ConfigError:
        return {}
    return cast(LengthScores, {f"{name}_bits_per_byte": value for name, value in baselines.items()})


def language_fields(
    task: LanguageTask, seeds: Sequence[int], results: Sequence[LanguageScores]
) -> TaskOutcome:
    """The row fields of a language-model cell: what every length's row shares (the
    corpus, baselines, throughput, samples), the training length's scores, and
    "evaluations", the other lengths' fields, each a row of its own."""
    per_length: list[LengthFields] = [
        {
            **length_fields(scores[0].length, seeds, scores),
            **baseline_fields(task, scores[0].length),
        }
        for scores in zip(*(result.lengths for result in results), strict=True)
    ]
    fingerprints = {result.fingerprint for result in results}
    if len(fingerprints) > 1:  # seeds trained on nodes holding different text
        problem: FailureFields = {
            "status": "error",
            "error": f"the seeds trained on different corpora (fingerprints "
            f"{', '.join(sorted(f[:12] for f in fingerprints))}): the nodes that ran them hold "
            f"different text for corpus {task.options.corpus!r}; give every node the same corpus",
        }
        per_length = [{**fields, **problem} for fields in per_length]
    first, *others = per_length
    return {
        "metric": task.metric,
        "train_length": task.seq_len,
        "position_bucket": task.position_bucket,
        **first,
        "validation_bits_per_byte": statistics.fmean(
            result.validation_bits_per_byte for result in results
        ),
        "tokens_per_s": statistics.fmean(result.tokens_per_s for result in results),
        "samples": [
            {
                "seed": seed,
                "prompt": task.prompt.decode("utf-8", errors="replace"),
                "continuation": result.continuation,
            }
            for seed, result in zip(seeds, results, strict=True)
        ],
        "corpus": task.describe_data(),
        "corpus_fingerprint": task.fingerprint,
        "evaluations": others,
    }
