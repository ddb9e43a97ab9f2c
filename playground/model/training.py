"""Training and evaluation of a classifier on a task's data, on a fixed step budget.

AdamW (Loshchilov & Hutter 2019) with linear warm-up and cosine decay to zero (the
schedule of most small Transformer recipes), gradient clipping at 1.0, batches drawn from
shuffled epochs of the training set, cross-entropy over the scored positions only.

A loss that is not finite ends the training with InvalidOutput (the row is `invalid`): a
diverged model scores at or below chance, and that score is not a measurement of the
variant's accuracy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from rich.progress import Progress

from playground.errors import ConfigError, InvalidOutput
from playground.kernels import native
from playground.model.transformer import TransformerClassifier
from playground.tasks import IGNORE, TaskData


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    """Optimizer steps (the whole budget; no early stopping)."""
    batch_size: int = 32
    learning_rate: float = 3e-3
    """Peak learning rate, reached at the end of the warm-up."""
    weight_decay: float = 0.01
    """AdamW decoupled decay, on weight matrices only (not biases, norms, embeddings)."""
    warmup_fraction: float = 0.1
    """Share of the steps spent ramping the learning rate up linearly from 0."""
    gradient_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"steps and batch_size must be positive; got {self.steps}, {self.batch_size}"
            )
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction must be in [0, 1); got {self.warmup_fraction}")


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    """Training loss at every step."""
    train_time_s: float = 0.0
    """Wall time of the optimisation steps (data generation and evaluation excluded)."""


def learning_rate_factor(step: int, steps: int, warmup_fraction: float) -> float:
    """Multiplier of the peak rate at `step`: linear warm-up, then cosine decay to 0."""
    warmup = max(1, round(steps * warmup_fraction))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, parameter in model.named_parameters():  # a shared Parameter is listed once
        is_matrix = parameter.dim() >= 2 and "embedding" not in name
        (decay if is_matrix else no_decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy; logits (B, L, C) with labels (B, L) (IGNORE skipped) or (B, C), (B,)."""
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE)


def scored_logits(
    model: TransformerClassifier,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of the scored examples and their labels: for a per-token target, only
    the positions with a label (the model skips the last sublayer's work elsewhere);
    for a sequence target, every sequence."""
    if labels.dim() == 2:  # per-token labels (B, L)
        scored = labels != IGNORE
        return model(tokens, mask, positions=scored), labels[scored]  # (P, C), (P,)
    return model(tokens, mask), labels  # (B, C), (B,)


def _batch(
    data: TaskData, index: torch.Tensor, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    mask = None if data.attention_mask is None else data.attention_mask[index].to(device)
    return data.tokens[index].to(device), data.labels[index].to(device), mask


def _fused_optimizer(model: torch.nn.Module) -> bool:
    """Whether torch's fused AdamW takes these parameters (floating, on CPU or CUDA)."""
    return all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in model.parameters()
    )


def train(
    model: TransformerClassifier,
    data: TaskData,
    config: TrainConfig,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    description: str = "training",
) -> TrainResult:
    """Run `config.steps` AdamW steps on `data`; batches are shuffled with `seed`.
    InvalidOutput at the first step whose loss is not finite (NaN or inf): the run diverged."""
    if config.batch_size > len(data):  # the spec refuses this; a direct caller may not
        raise ConfigError(
            f"batch_size {config.batch_size} is more than the {len(data)} training examples "
            f"({description}), so every step would train on all of them and record a batch "
            f"size it never used; use a batch_size of at most {len(data)}"
        )
    if torch.device(device).type == "cpu":
        native.build_state()  # a first build of the native kernels is not training time
    model.train()
    # Fused AdamW (one kernel for all parameters) and a foreach gradient norm: the
    # per-parameter loops cost about a fifth of a step at the playground's model sizes.
    optimizer = torch.optim.AdamW(
        _parameter_groups(model, config.weight_decay),
        lr=config.learning_rate,
        fused=_fused_optimizer(model),
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(step, config.steps, config.warmup_fraction)
    )
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=generator)
    cursor, result = 0, TrainResult()
    bar = None if progress is None else progress.add_task(description, total=config.steps)
    started = time.perf_counter()
    for step in range(config.steps):
        if cursor + config.batch_size > len(order):  # a new epoch, reshuffled
            order, cursor = torch.randperm(len(data), generator=generator), 0
        tokens, labels, mask = _batch(data, order[cursor : cursor + config.batch_size], device)
        cursor += config.batch_size
        loss = loss_of(*scored_logits(model, tokens, labels, mask))
        value = loss.item()
        if not math.isfinite(value):
            raise InvalidOutput(
                f"training diverged: the loss is {value} at step {step + 1} of "
                f"{config.steps} ({description}); the accuracy of a diverged model is not "
                f"recorded. Lower the learning rate, or check the variant for NaN outputs"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.gradient_clip, foreach=True)
        optimizer.step()
        schedule.step()
        result.losses.append(value)
        if progress is not None and bar is not None:
            progress.update(bar, advance=1, description=f"{description} loss {value:.3f}")
    result.train_time_s = time.perf_counter() - started
    if progress is not None and bar is not None:
        progress.remove_task(bar)
    return result


@torch.no_grad()
def evaluate(
    model: TransformerClassifier,
    data: TaskData,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> float:
    """Accuracy over the scored positions (per-token) or the sequences of `data`."""
    model.eval()
    correct, total = 0, 0
    for start in range(0, len(data), batch_size):
        index = torch.arange(start, min(start + batch_size, len(data)))
        tokens, labels, mask = _batch(data, index, device)
        logits, scored_labels = scored_logits(model, tokens, labels, mask)
        correct += int((logits.argmax(dim=-1) == scored_labels).sum())
        total += scored_labels.numel()
    return correct / max(total, 1)


EVAL_TOKENS_PER_BATCH = 16384
"""Positions per evaluation batch of bits_per_byte: long windows go a few at a time."""


@torch.no_grad()
def bits_by_position(
    model: TransformerClassifier, data: TaskData, *, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy in bits summed at each position of `data`'s windows (next-byte
    labels), and how many labels each position scored: two (L,) float64 tensors. Their
    ratio is the loss at each position; the sums' total over the counts' total is
    `bits_per_byte`."""
    model.eval()
    length = data.tokens.shape[1]
    batch_size = max(1, EVAL_TOKENS_PER_BATCH // length)
    totals = torch.zeros(length, dtype=torch.float64)
    counts = torch.zeros(length, dtype=torch.float64)
    for start in range(0, len(data), batch_size):
        index = torch.arange(start, min(start + batch_size, len(data)))
        tokens, labels, mask = _batch(data, index, device)
        logits, scored_labels = scored_logits(model, tokens, labels, mask)
        nats = F.cross_entropy(logits.double(), scored_labels, reduction="none")
        if not bool(torch.isfinite(nats).all()):
            bad = float(nats[~torch.isfinite(nats)][0])
            raise InvalidOutput(
                f"the model's loss is {bad} on held-out windows of {length} tokens: its "
                f"outputs are not finite there"
            )
        scored = (labels != IGNORE).cpu()  # (B, L): the positions `nats` holds, row-major
        position = torch.arange(length).expand_as(scored)[scored]
        totals.index_add_(0, position, nats.cpu())
        counts.index_add_(0, position, torch.ones_like(position, dtype=torch.float64))
    return totals / math.log(2), counts


def bits_per_byte(
    model: TransformerClassifier, data: TaskData, *, device: torch.device | str = "cpu"
) -> float:
    """Cross-entropy in bits over every scored position of `data` (next-byte labels),
    averaged per position: the total over all of them divided by their number."""
    totals, counts = bits_by_position(model, data, device=device)
    return float(totals.sum()) / max(float(counts.sum()), 1.0)


def majority_rate(data: TaskData) -> float:
    """Accuracy of always answering the most frequent label of `data` (a baseline)."""
    labels = data.labels[data.labels != IGNORE]
    if labels.numel() == 0:
        return 0.0
    return int(labels.bincount().max()) / labels.numel()
