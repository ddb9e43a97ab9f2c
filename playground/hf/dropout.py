"""The model's attention dropout, carried into a swapped variant.

HF's attention modules drop attention weights in training with a probability of their own
(GPT-2's `attn_pdrop`, BERT's `attention_probs_dropout_prob`, Llama's `attention_dropout`).
`dropout_plan` decides once, for the report and the swapped modules, how a variant takes
it:

- `OPTION`: the variant has a `dropout` option (dropout on its attention weights): it is
  built with the model's probability, unless the user gave one;
- `HEADS`: its attention also runs on heads projected by its own projections
  (`attend_heads`, which takes a dropout), and a probe shows that this gives its forward's
  outputs: in training the swapped module runs that composition with the probability;
- `NOT_APPLIED`: neither: the probability is lost, and the swap warns by name;
- `NONE`: the model drops no attention weight.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Any, cast

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.heads import project_output, split_heads
from playground.masks import allowed_keys, empty_query_rows

OPTION_NAME = "dropout"
"""A variant option of this name drops attention weights with that probability."""
PROBE_HEAD_WIDTH = 8
PROBE_TOLERANCE = 1e-5
"""float32: how close the composition must come to the probe's forward, relative."""


class DropoutPath(enum.Enum):
    NONE = "none"
    OPTION = "the variant's dropout option"
    HEADS = "its attention on projected heads (attend_heads) in training"
    NOT_APPLIED = "not applied"


@dataclasses.dataclass(frozen=True)
class DropoutPlan:
    probability: float
    path: DropoutPath
    reason: str = ""

    def __str__(self) -> str:
        if self.path is DropoutPath.NONE:
            return f"none{self.reason or ' (the model drops no attention weight)'}"
        if self.path is DropoutPath.NOT_APPLIED:
            return f"the model's {self.probability} is NOT applied: {self.reason}"
        return f"{self.probability}, through {self.path.value}{self.reason}"


def model_attention_dropout(kind: str, module: Any) -> float:
    """The probability with which HF's attention module `module` of family `kind` drops
    attention weights in training."""
    if kind == "gpt2":
        return float(module.attn_dropout.p)
    if kind == "bert":
        return float(module.dropout.p)
    return float(getattr(module, "attention_dropout", 0.0))


def dropout_plan(
    cls: type[AttentionVariant],
    options: dict[str, Any],
    probability: float,
    num_heads: int,
    is_causal: bool,
) -> DropoutPlan:
    """How variant `cls`, built with `options`, takes a model's attention dropout."""
    has_option = OPTION_NAME in {f.name for f in dataclasses.fields(cls.Config)}
    if has_option and OPTION_NAME in options:
        given = float(options[OPTION_NAME])
        yours = f" (yours; the model's is {probability})" if given != probability else ""
        return DropoutPlan(given, DropoutPath.OPTION if given else DropoutPath.NONE, yours)
    if probability == 0:
        return DropoutPlan(0.0, DropoutPath.NONE)
    if has_option:
        return DropoutPlan(probability, DropoutPath.OPTION)
    why_not = heads_mismatch(cls, options, num_heads, is_causal)
    if why_not is None:
        return DropoutPlan(probability, DropoutPath.HEADS)
    reason = (
        f"{cls.name} has no dropout option, and its attention does not run on projected "
        f"heads ({why_not}); train without attention dropout, or give the variant a "
        "dropout option"
    )
    warnings.warn(
        f"swap_attention: the model's attention dropout ({probability}) is not applied by "
        f"{cls.name!r}: {reason}",
        UserWarning,
        stacklevel=3,
    )
    return DropoutPlan(probability, DropoutPath.NOT_APPLIED, reason)


def heads_forward(
    variant: AttentionVariant,
    hidden: torch.Tensor,
    real: torch.Tensor | None,
    is_causal: bool,
    dropout: float,
) -> torch.Tensor:
    """The variant's forward on hidden (B, N, d_model) as its projections around
    `attend_heads` (B, N, d_model), attention weights dropped with probability `dropout`;
    `real` (B, N) bool, the real tokens (None: all)."""
    # Keys and values in as many heads as their projections give: grouped ones (fewer
    # key/value heads than query heads) reach attend_heads as HF's own grouped heads do.
    q_proj, k_proj, v_proj = (
        cast(nn.Linear, getattr(variant, name)) for name in ("q_proj", "k_proj", "v_proj")
    )
    q = split_heads(q_proj(hidden), variant.num_heads)  # (B, H, N, d)
    kv_heads = k_proj.out_features // variant.head_dim
    k = split_heads(k_proj(hidden), kv_heads)  # (B, H_kv, N, d)
    v = split_heads(v_proj(hidden), kv_heads)
    n = hidden.shape[1]
    allowed = allowed_keys(real, n, n, is_causal, hidden.device)  # (B, 1, N, N)
    positions = torch.arange(n, device=hidden.device)
    context = variant.attend_heads(
        q,
        k,
        v,
        allowed,
        scale=variant.head_dim**-0.5,
        q_idx=positions,
        kv_idx=positions,
        dropout=dropout,
    )
    return project_output(variant, context, empty_query_rows(allowed))


def heads_mismatch(
    cls: type[AttentionVariant], options: dict[str, Any], num_heads: int, is_causal: bool
) -> str | None:
    """None when `heads_forward` gives a variant's forward (a small float32 copy, every
    parameter moved off its initial value so that each one counts, on a left-padded
    batch where it takes padding), or why not."""
    generator = torch.Generator().manual_seed(0)
    width = PROBE_HEAD_WIDTH * num_heads
    try:
        probe = cls(width, num_heads, **options).float().eval()
        with torch.no_grad():
            for parameter in probe.parameters():
                noise = torch.randn(parameter.shape, generator=generator)
                parameter.add_(0.1 * noise.to(parameter.dtype))
            hidden = torch.randn(2, 6, width, generator=generator)
            real = torch.ones(2, 6, dtype=torch.bool)
            real[1, :2] = not probe.capabilities_for(probe.config).padding_mask  # padded if allowed
            mask = None if bool(real.all()) else real
            expected = probe(hidden, attention_mask=mask, is_causal=is_causal).output
            composed = heads_forward(probe, hidden, mask, is_causal, dropout=0.0)
    except Exception as error:  # any refusal or missing part means "not on heads"
        return f"{type(error).__name__}: {str(error).split(';')[0]}"
    difference = float((composed - expected)[real].abs().max())
    if difference > PROBE_TOLERANCE * max(1.0, float(expected.abs().max())):
        return f"its projections around attend_heads differ from its forward by {difference:.2g}"
    return None
