"""A swapped layer's decoding state on transformers' cache, following what the cache does.

HF's `DynamicCache` is a list of layers, one per model layer, and every batch operation
generation makes on the cache it makes layer by layer: beam search reorders the beams
after each step (`reorder_cache`), other strategies repeat or trim the batch
(`batch_repeat_interleave`, `batch_select_indices`), roll tokens back (`crop`) or start
again (`reset`). A swapped attention module keeps its variant's own decoding state
(`playground.decoding`) in its layer of the cache, a `DynamicLayer` that applies each of
these operations to the state as well (`DecodingState.select_sequences`), so the state
always follows the sequences HF's cache holds. A state cannot be rolled back, so a crop is
refused. The layer's own keys and values are one number per token (swap.py), from which
HF sizes its masks and positions.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from playground.decoding import DecodingState
from playground.errors import InvalidInput, UnsupportedFeature


@functools.cache
def state_layer_class() -> type[Any]:
    """transformers' `DynamicLayer`, holding a swapped module's decoding state (built on
    first use: transformers is optional)."""
    from transformers.cache_utils import DynamicLayer

    class SwappedLayer(DynamicLayer):
        """A `DynamicLayer` whose batch operations apply to `state` too."""

        def __init__(self, variant: str) -> None:
            super().__init__()
            self.variant = variant
            # A variant that cannot decode leaves its refusal here, raised at the first
            # step rather than at the prompt (which a plain forward serves).
            self.state: DecodingState | UnsupportedFeature | None = None

        def _select(self, indices: torch.Tensor) -> None:
            if isinstance(self.state, DecodingState):
                if indices.dtype == torch.bool:  # a mask over the batch
                    indices = indices.nonzero().flatten()
                self.state.select_sequences(indices.long())

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            super().reorder_cache(beam_idx)
            self._select(beam_idx)

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            super().batch_select_indices(indices)
            self._select(indices)

        def batch_repeat_interleave(self, repeats: int) -> None:
            super().batch_repeat_interleave(repeats)
            if isinstance(self.state, DecodingState):
                rows = torch.arange(self.state.batch).repeat_interleave(repeats)
                self._select(rows)

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove and self.state is not None:
                raise UnsupportedFeature(
                    self.variant,
                    "rolling a swapped layer's decoding state back (the cache's crop(), as "
                    "assisted generation and prompt lookup use it)",
                    "a state (a recurrent sum, a rolling window) cannot forget its last tokens; "
                    "generate without an assistant model or prompt_lookup_num_tokens",
                )
            super().crop(tokens_to_remove)

        def reset(self) -> None:
            super().reset()
            self.state = None

    return SwappedLayer


def state_layer(cache: Any, layer_idx: int, variant: str) -> Any:
    """The layer of `cache` (a DynamicCache) that holds model layer `layer_idx`'s state:
    installed in place of HF's own empty layer on the first call."""
    layers, replicated = cache.layers, cache.layer_class_to_replicate
    while replicated is not None and len(layers) < layer_idx:  # a cache that grows lazily
        layers.append(replicated())
    cls = state_layer_class()
    if len(layers) == layer_idx:
        layers.append(cls(variant))
    layer = layers[layer_idx]
    if isinstance(layer, cls):
        return layer
    if layer.get_seq_length():
        raise InvalidInput(
            "this cache holds tokens that a swapped layer did not see (it was filled before "
            "the swap, or by another model): start with a fresh cache"
        )
    if type(layer).__name__ != "DynamicLayer":
        raise InvalidInput(
            f"a swapped attention module keeps its own decoding state in a full-attention "
            f"layer of HF's DynamicCache; layer {layer_idx} of this cache is a "
            f"{type(layer).__name__}: build the cache without sliding or other layer types"
        )
    layers[layer_idx] = cls(variant)
    return layers[layer_idx]
