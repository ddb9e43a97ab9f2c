"""What a variant can do (`Capabilities`): the features the core refuses unless a
variant declares them, with `UnsupportedFeature`. A variant declares them on its class for
its default options; `AttentionVariant.capabilities_for(config)` gives them for the
options it is built with."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Capabilities:
    """What a variant can do; the core refuses everything else with UnsupportedFeature."""

    causal: bool = False
    """`is_causal=True`: query i sees keys j <= i."""
    padding_mask: bool = False
    """`attention_mask` (B, Nk) bool, True = real token."""
    cross_attention: bool = False
    """`key`/`value` different from `query` (and possibly of another length)."""
    need_weights: bool = False
    """`need_weights=True` returns the (B, H, Nq, Nk) attention probabilities."""
    weights_sum_to_one: bool = True
    """With `need_weights`: each real query's weights sum to 1. False for weights that
    are not a distribution (sigmoid attention's, differential attention's)."""
    weights_nonnegative: bool = True
    """With `need_weights`: no weight is negative. False for differential attention,
    whose weights are a difference of two softmaxes."""
    deterministic_in_training: bool = True
    """Two training-mode calls on the same input give the same output. False for a
    variant that draws random numbers in training (Performer redrawing its features):
    the contract suite then gives every training call it compares the same seed."""
    max_seq_len: int | None = None
    """Longest key sequence the variant accepts; None = no limit."""
    max_seq_len_hint: str = ""
    """What to do about a longer sequence (which option lifts the limit), for the error."""
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    """Floating dtypes the variant computes in."""
    decoding: bool = True
    """A causal variant decodes one token at a time (`prefill`, `decode_step`); False for
    one whose outputs a later token changes, with the reason in `decoding_hint`. A variant
    that is not causal never decodes."""
    decoding_hint: str = ""

    def features(self) -> list[str]:
        """Short names of the declared features, for tables."""
        names = ["causal", "padding_mask", "cross_attention", "need_weights"]
        listed = [name for name in names if getattr(self, name)]
        if self.max_seq_len is not None:
            listed.append(f"max_seq_len={self.max_seq_len}")
        short = {
            torch.float32: "fp32",
            torch.float64: "fp64",
            torch.bfloat16: "bf16",
            torch.float16: "fp16",
        }
        listed.append("/".join(short.get(d, str(d)) for d in self.dtypes))
        return listed
