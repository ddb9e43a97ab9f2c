"""`SwappedAttention`: a variant's module in the place of one layer's HF self-attention,
with HF's calling convention (hidden states, HF's mask, its cache and, in a Llama-family
model, the rotation's `position_embeddings` in; the output and no weights out).

- **Positions.** Where the model's rotation is kept (swap.py), it is applied to the
  outputs of the variant's q and k projections, at the positions of the tokens the
  variant is given: those of the whole call in a forward, those of the one token a
  decoding step takes.
- **Caches.** Given HF's cache, the first call prefills the variant's decoding state, and
  later calls step it one token at a time, however many tokens they bring (a chunked
  prefill, a conversation continued). The state lives in this layer's slot of the cache
  (cache.py), which reorders it with the beams; HF's own part of that slot keeps one
  number per token, so that the lengths it sizes masks and positions from stay right. A
  variant that cannot decode runs its forward on the first call and refuses a step.
- **Dropout.** In training, the attention dropout the variant cannot apply itself runs
  through its attention on projected heads (dropout.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.decoding import left_aligned
from playground.errors import InvalidInput, UnsupportedFeature
from playground.hf.cache import state_layer
from playground.hf.dropout import heads_forward
from playground.hf.masks import allowed_pairs, padding_of


class SwappedAttention(nn.Module):
    """A variant's module with HF's attention calling convention, for one layer.
    `attention_dropout`: the probability with which, in training, its attention weights
    are dropped through `heads_forward` (0: the variant drops them itself, or not)."""

    def __init__(
        self,
        variant: AttentionVariant,
        layer_idx: int,
        is_causal: bool,
        rotate: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
        output_dropout: nn.Module | None = None,
        attention_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.variant = variant
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.rotate = rotate
        self.output_dropout = output_dropout
        self.attention_dropout = attention_dropout
        self.position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None
        if rotate is not None:
            for name in ("q_proj", "k_proj"):
                projection: nn.Module = getattr(variant, name)
                projection.register_forward_hook(self._rotated)

    def _rotated(self, projection: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        """The model's rotation of a projection's output (B, N, H·d) at the positions of
        `position_embeddings` (one per token, N of them), with the model's own
        `apply_rotary_pos_emb`."""
        if self.position_embeddings is None or self.rotate is None:
            raise InvalidInput(
                "this swapped layer keeps the model's rotary positions, but the model gave it "
                "no position_embeddings: call it through the model"
            )
        cos, sin = self.position_embeddings
        heads = output.unflatten(-1, (-1, cos.shape[-1])).transpose(1, 2)  # (B, H, N, d)
        rotated, _ = self.rotate(heads, heads, cos, sin)
        return rotated.transpose(1, 2).flatten(2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        self.position_embeddings = position_embeddings
        if cache is None:
            output = self._forward(hidden_states, attention_mask)
        else:
            output = self._decode(hidden_states, attention_mask, cache)
        if self.output_dropout is not None:
            output = self.output_dropout(output)
        return output, None

    def _real(
        self, attention_mask: torch.Tensor | None, hidden: torch.Tensor
    ) -> torch.Tensor | None:
        """(B, N) bool, the real tokens of the model's square mask, or None for all."""
        n = hidden.shape[1]
        allowed = allowed_pairs(attention_mask, n, n, self.is_causal, hidden.device)
        return padding_of(allowed, self.is_causal)

    def _drops_through_heads(self) -> bool:
        return self.training and self.attention_dropout > 0

    def _forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        real = self._real(attention_mask, hidden)
        if self._drops_through_heads():
            return heads_forward(self.variant, hidden, real, self.is_causal, self.attention_dropout)
        return self.variant(hidden, attention_mask=real, is_causal=self.is_causal).output

    def _decode(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, cache: Any
    ) -> torch.Tensor:
        """The first call on `cache` prefills the variant's state; later ones step it."""
        if type(cache).__name__ != "DynamicCache":
            raise InvalidInput(
                f"a swapped attention module keeps its own decoding state and needs HF's "
                f"DynamicCache (the default of generate()); got a {type(cache).__name__}: "
                "leave cache_implementation unset"
            )
        layer = state_layer(cache, self.layer_idx, self.variant.name)
        if layer.state is None:
            output, layer.state = self._prefill(hidden, attention_mask)
        else:
            output = self._steps(hidden, attention_mask, layer)
        # HF sizes its masks and positions from its cache's length: one number per token.
        length = hidden.new_zeros(hidden.shape[0], 1, hidden.shape[1], 1)
        cache.update(length, length, self.layer_idx)
        return output

    def _prefill(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, Any]:
        caps = self.variant.capabilities_for(self.variant.config)
        if not (self.is_causal and caps.causal and caps.decoding):
            reason = caps.decoding_hint or "it has no causal form to decode from"
            refusal = UnsupportedFeature(self.variant.name, "decoding in this model", reason)
            return self._forward(hidden, attention_mask), refusal
        if self._drops_through_heads():  # a training forward: no step is to follow
            refusal = UnsupportedFeature(
                self.variant.name,
                "decoding in training mode with the model's attention dropout",
                "the dropout runs through its attention on projected heads, which has no "
                "decoding state; call model.eval() before generating",
            )
            return self._forward(hidden, attention_mask), refusal
        real = self._real(attention_mask, hidden)
        if self.rotate is not None and left_aligned(real) is not None:
            raise InvalidInput(
                "the prompt is padded on the right; with the model's rotary positions a "
                "swapped layer decodes left-padded prompts only (tokenizer.padding_side = "
                "'left', as HF's generate asks)"
            )
        return self.variant.prefill(hidden, attention_mask=real)

    def _steps(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, layer: Any
    ) -> torch.Tensor:
        """The outputs (B, n, d_model) of n tokens after those in the state, each a
        decoding step at its own position (the rotation of the whole call sliced to it)."""
        state = layer.state
        if isinstance(state, UnsupportedFeature):
            raise state
        n, past = hidden.shape[1], layer.get_seq_length()
        allowed = allowed_pairs(attention_mask, n, past + n, self.is_causal, hidden.device)
        if allowed is not None:
            new = torch.arange(n, device=hidden.device)
            if not bool(allowed[..., new, past + new].all()):
                raise InvalidInput(
                    "a cached call after the first marks some of its new tokens as padding; "
                    "a swapped layer's decoding state takes padding in the prompt only (the "
                    "first call on a cache): pad the prompt, not what follows it"
                )
        whole_call = self.position_embeddings
        steps = []
        for t in range(n):
            if whole_call is not None:
                cos, sin = whole_call  # (B or 1, n, d) each: token t's
                self.position_embeddings = (cos[..., t : t + 1, :], sin[..., t : t + 1, :])
            steps.append(self.variant.decode_step(hidden[:, t : t + 1], state)[0])
        self.position_embeddings = whole_call
        return torch.cat(steps, dim=1)
