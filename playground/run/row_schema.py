"""The declared fields of a row of results.jsonl, as TypedDicts: a row stays a plain JSON
object, and mypy holds every writer and reader to these names and types.

A row is one `Row`: the fields every row has (`RowIdentity`, `PlacementFields`), then those
of its kind. A cost cell's row adds `CostCell` and what its pass measured (`CostFields`
for forward and forward+backward, `DecodeFields` for a decode step); a task cell's adds
`TaskFields` and, scored by accuracy, `AccuracyFields` (its `AccuracyScores`), or, a
language model, `LanguageFields`; scored at several lengths, either holds
`EvaluatedFields`. Writers build the group they fill (`measure_decode` returns
`DecodeFields`), readers take `Row`, so a misspelt key is a type error.

A group that may carry a status of its own (a failed evaluation length) is declared apart
from `Row` (`LengthFields`, `TaskOutcome`): `Row` requires its status.

`playground.run.rows.row_problem` checks each declared field a parsed row holds against its
type here (a float field takes an int, as JSON writes 2.0 as 2.0 but a hand-made file may
not); keys declared nowhere are allowed, so rows of older and newer versions still load.
A number a cell measured may be None or absent: not measured (older rows wrote None).
"""

from __future__ import annotations

from typing import Any, TypedDict


class RowIdentity(TypedDict):
    """What makes a line a row: its cell id, setup and status (rows.STATUSES)."""

    cell: str
    """Unique in the run: `label|n=512|forward`, `label|task=...`, `...|eval_len=4096`."""
    variant: str
    label: str
    """The setup's label: the variant with the options that are not its defaults."""
    status: str


class GemmFields(TypedDict, total=False):
    """The GEMM ceiling a row's efficiency is against (`instruments.gemm_fields`)."""

    gemm_flops_per_s: float | None
    gemm_matmul_flops_per_s: float | None
    gemm_onednn_flops_per_s: float | None
    gemm_library: str | None


class PlacementFields(RowIdentity, GemmFields, total=False):
    """What every row holds besides its identity (`Measurer.row`): where and on what it
    ran, when, its error, and the model's shape (a cost cell's: the spec's)."""

    options: dict[str, Any]
    device: str
    node: str
    node_id: str
    """The Ray node that ran a cost cell (ray executor only)."""
    threads: int
    dtype: str
    error: str | None
    started_at: float
    finished_at: float
    wall_s: float
    d_model: int
    num_heads: int
    batch_size: int


CostCell = TypedDict("CostCell", {"seq_len": int, "pass": str}, total=False)
"""A cost cell's length and pass (a functional TypedDict: "pass" is a Python keyword)."""


class TimingFields(TypedDict, total=False):
    """How a timed pass or decode step was timed, and how sure it is (`cost_flags`)."""

    time_ms: float | None
    time_iqr_ms: float | None
    timed_runs: int
    load_average: float | None
    cores: int
    flags: list[str]


class FidelityFields(TypedDict, total=False):
    """Error against exact attention (`fidelity.measure_fidelity`)."""

    fidelity_reference: str
    fidelity_rel_error: float
    fidelity_cosine: float
    fidelity_max_abs_error: float
    fidelity_local_attention_distance: float
    fidelity_local_rel_error: float
    fidelity_local_cosine: float
    fidelity_local_max_abs_error: float


class CostFields(CostCell, TimingFields, FidelityFields, total=False):
    """What `Measurer` measures of a forward or forward+backward cell."""

    score_mod_path: str
    flops: float | None
    flops_note: str
    gflops_per_s: float | None
    efficiency: float | None
    peak_memory_bytes: int
    cpu_kernel: str
    fidelity_note: str


class StateFields(TypedDict, total=False):
    """The decoding state per sequence: a decode cell's at its context, a trained model's
    at its task's length (`state_size.state_fields`; None for a task that is not causal)."""

    state_bytes: float | None
    state_source: str | None


class DecodeFields(CostCell, TimingFields, StateFields, total=False):
    """A decode step timed at a context length (`decode_cost.measure_decode`)."""

    steps_per_run: int
    steps_from: int
    steps_to: int
    state_type: str
    weight_bytes: int
    bandwidth_bytes_per_s: float
    read_limit_ms: float
    bandwidth_efficiency: float


class TaskIdentity(TypedDict, total=False):
    """Which task a row scores (a curriculum stage's row: the stage's)."""

    task: str
    task_label: str
    task_options: dict[str, Any]
    grid: dict[str, Any]
    """The row's point of a sweep (none outside a sweep)."""
    sweep: str


class AccuracyScores(TaskIdentity, StateFields, total=False):
    """Accuracy over seeds on one task's test split: the row's, or a curriculum stage's."""

    accuracy_mean: float | None
    accuracy_ci95: float | None
    accuracy_ci95_low: float | None
    accuracy_ci95_high: float | None
    accuracy_scored: int | None
    accuracy_std: float | None
    accuracy_per_seed: list[float]
    chance: float
    majority_baseline: float
    steps: int
    batch_size: int


class TaskFields(TaskIdentity, total=False):
    """What every task row holds: the model trained, its training and its validation
    score (`accuracy.row_fields`), and where its seeds' weights are kept."""

    num_layers: int
    metric: str
    """What the task is scored by: "accuracy" (also a row without the field) or
    "bits_per_byte"."""
    setup_label: str
    seeds: list[int]
    final_train_loss: float
    train_time_s: float
    model: dict[str, Any]
    steps: int
    batch_size: int
    learned_per_seed: list[dict[str, dict[str, float | list[float]]]]
    validation_metric: str
    validation_mean: float
    validation_ci95: float | None
    validation_per_seed: list[float]
    weights: dict[str, str]
    """Seed -> where its trained weights are kept, relative to the run directory."""
    weights_note: str


class CurriculumPhase(TypedDict):
    """One phase of a curriculum's training, the task's own last."""

    task_label: str
    steps: int
    batch_size: int


class LengthScores(TypedDict, total=False):
    """A language model's scores at one evaluation length (`language_scores.length_fields`)."""

    eval_length: int
    bits_per_byte_mean: float
    bits_per_byte_ci95: float | None
    bits_per_byte_ci95_low: float | None
    bits_per_byte_ci95_high: float | None
    bits_per_byte_std: float
    bits_per_byte_per_seed: list[float]
    bits_per_byte_by_position: list[float]
    """The mean over seeds in each bucket of `position_bucket` positions."""
    bits_per_byte_by_position_ci95: list[float | None]
    scored_bytes: int
    unigram_bits_per_byte: float
    bigram_bits_per_byte: float
    passkey_depths: list[float]
    """The passkey probe (`passkey_fields`): where the key sits, 0 first, 1 last."""
    passkey_exact: list[float]
    """Per depth, the share of probes whose key the model reproduces, mean over seeds."""
    passkey_exact_per_seed: list[list[float]]
    passkey_log_likelihood: list[float]
    """Per depth, log2 P(key) in bits, mean over seeds."""
    passkey_chance_log_likelihood: float
    passkey_trials: int


class LengthFields(LengthScores, AccuracyScores, total=False):
    """One further evaluation length's fields with its own status (a length the variant
    cannot run at is `unsupported` while the others stand): a language model's bits per
    byte, or an accuracy task's scores on the task at that length (`accuracy.row_fields`)."""

    status: str
    error: str | None


class EvaluatedFields(TypedDict, total=False):
    """A task scored at several lengths (a language model; an accuracy task with
    `eval_lengths`): the row of each length holds these."""

    train_length: int
    eval_length: int
    evaluations: list[LengthFields]
    """The further lengths' fields; the runner writes each as a row of its own, so
    results.jsonl never holds this field (`cells.with_stage_rows`)."""


class AccuracyFields(TaskFields, AccuracyScores, EvaluatedFields, total=False):
    """A task row scored by accuracy."""

    curriculum: list[CurriculumPhase]
    stages: list[AccuracyScores]
    """Each curriculum stage's scores; the runner writes each as a row of its own, so
    results.jsonl never holds this field (`cells.with_stage_rows`)."""


class Sample(TypedDict):
    """A seed's greedy continuation of the task's prompt."""

    seed: int
    prompt: str
    continuation: str


class LanguageFields(TaskFields, LengthScores, EvaluatedFields, total=False):
    """A language-model row: one (setup, task, evaluation length) in bits per byte
    (`language_scores.language_fields`)."""

    position_bucket: int
    """The positions per bucket of `bits_per_byte_by_position`."""
    validation_bits_per_byte: float
    tokens_per_s: float
    samples: list[Sample]
    corpus: dict[str, Any]
    corpus_fingerprint: str
    evaluated_at: float
    """When `playground eval` scored this length from kept weights (its rows alone)."""


class TaskOutcome(AccuracyFields, LanguageFields, total=False):
    """A task cell's measured fields (`accuracy.row_fields`): a language model's carry its
    training length's status."""

    status: str
    error: str | None


class SweepChoiceFields(TypedDict, total=False):
    """What the report adds to a sweep's chosen row (`report.sweeps.chosen_rows`); never
    in results.jsonl."""

    chosen_from: int
    within_interval: int


class Row(
    PlacementFields,
    CostFields,
    DecodeFields,
    AccuracyFields,
    LanguageFields,
    SweepChoiceFields,
    total=False,
):
    """A row of results.jsonl, whatever its kind; what readers take."""
