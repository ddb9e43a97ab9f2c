"""The module-level bridge: a variant's own attention module inside a transformers model.

`swap_attention(model, name, **options)` replaces every self-attention module of a Llama,
Mistral or Qwen2 (one attention), GPT-2 or BERT model with `SwappedAttention`, the
variant's module wrapped to HF's calling convention: hidden states and HF's mask in, the
output (with the output projection, as the replaced module returned it) and no weights
out. It fits every variant, those that own their projections included.

- **Weights.** The variant's q, k, v and output projections take the model's where their
  shapes allow (Llama's grouped k and v repeated per query head; GPT-2's fused c_attn
  split; BERT's output dense moved into the variant, the model's replaced by an identity);
  every other parameter of the variant is new, and the report names it.
- **Positions.** A Llama-family model rotates q and k by their positions: the rotation is
  kept, applied to the variant's q and k projections with the model's own function, unless
  the variant encodes positions itself (`encodes_positions`: rope, ALiBi, T5's bias), in
  which case the model's rotation is turned off for attention and the report says so.
  GPT-2's and BERT's learned positions are added to the embeddings and stay.
- **Masks.** The model's mask is read back into key padding and causality
  (`masks.padding_of`); any other pattern is refused, pointing to the kernel level.
- **Caches.** Given HF's cache (in `generate`, or any forward with `use_cache`), the first
  call prefills the variant's own decoding state and later calls step it one token at a
  time. The state lives on the cache object, per layer; HF's cache keeps one number per
  token and layer only, so that the lengths it sizes masks and positions from stay right.
  A variant that cannot decode runs its forward on the first call and refuses a step,
  with its reason.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.decoding import left_aligned
from playground.errors import InvalidInput, UnsupportedFeature
from playground.hf.kernel import variant_class
from playground.hf.library import require
from playground.hf.masks import allowed_pairs, padding_of

SUPPORTED = {
    "llama": "LlamaAttention",
    "mistral": "MistralAttention",
    "qwen2": "Qwen2Attention",
    "gpt2": "GPT2Attention",
    "bert": "BertSelfAttention",
}
"""config.model_type -> the class of its self-attention modules."""
ROTARY = {"llama", "mistral", "qwen2"}
"""The families whose attention rotates q and k by `position_embeddings`."""
STATES = "playground_states"
"""The attribute of HF's cache object that holds each swapped layer's decoding state."""


@dataclass
class SwapReport:
    """What `swap_attention` did, for a person to read (`str(report)`)."""

    architecture: str
    variant: str
    layers: int = 0
    ported: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    positions: str = ""

    def __str__(self) -> str:
        ported = ", ".join(self.ported) or "nothing"
        new = ", ".join(self.new) or "none"
        return (
            f"{self.variant} in {self.layers} {self.architecture} layers\n"
            f"ported from the model: {ported}\n"
            f"new parameters: {new}\n"
            f"positions: {self.positions}"
        )


class SwappedAttention(nn.Module):
    """A variant's module with HF's attention calling convention, for one layer."""

    def __init__(
        self,
        variant: AttentionVariant,
        layer_idx: int,
        is_causal: bool,
        rotate: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
        output_dropout: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.variant = variant
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.rotate = rotate
        self.output_dropout = output_dropout
        self.position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None
        if rotate is not None:
            for name in ("q_proj", "k_proj"):
                projection: nn.Module = getattr(variant, name)
                projection.register_forward_hook(self._rotated)

    def _rotated(self, projection: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        """The model's rotation of a projection's output (B, N, H·d) at this call's
        positions, with the model's own `apply_rotary_pos_emb`."""
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

    def _forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        real = self._real(attention_mask, hidden)
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
        states = cache.__dict__.setdefault(STATES, {})
        n = hidden.shape[1]
        if self.layer_idx not in states:
            if cache.get_seq_length(self.layer_idx):
                raise InvalidInput(
                    "this cache holds tokens that a swapped layer did not see (it was filled "
                    "before the swap, or by another model): start with a fresh cache"
                )
            output, states[self.layer_idx] = self._prefill(hidden, attention_mask)
        else:
            state = states[self.layer_idx]
            if isinstance(state, UnsupportedFeature):
                raise state
            steps = [self.variant.decode_step(hidden[:, t : t + 1], state)[0] for t in range(n)]
            output = torch.cat(steps, dim=1)
        # HF sizes its masks and positions from its cache's length: one number per token.
        length = hidden.new_zeros(hidden.shape[0], 1, n, 1)
        cache.update(length, length, self.layer_idx)
        return output

    def _prefill(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, Any]:
        caps = self.variant.capabilities
        if not (self.is_causal and caps.causal and caps.decoding):
            reason = caps.decoding_hint or "it has no causal form to decode from"
            refusal = UnsupportedFeature(self.variant.name, "decoding in this model", reason)
            return self._forward(hidden, attention_mask), refusal
        real = self._real(attention_mask, hidden)
        if self.rotate is not None and left_aligned(real) is not None:
            raise InvalidInput(
                "the prompt is padded on the right; with the model's rotary positions a "
                "swapped layer decodes left-padded prompts only (tokenizer.padding_side = "
                "'left', as HF's generate asks)"
            )
        return self.variant.prefill(hidden, attention_mask=real)


# --- porting weights ---------------------------------------------------------------------
def _copy(target: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """weight (out, in) and bias into `target`: a missing bias is zero."""
    with torch.no_grad():
        target.weight.copy_(weight)
        if target.bias is not None:
            target.bias.copy_(bias if bias is not None else torch.zeros_like(target.bias))


def _port(
    variant: AttentionVariant, name: str, weight: torch.Tensor, bias: torch.Tensor | None
) -> bool:
    """Copy (weight, bias) into the variant's Linear `name` when the shapes allow, key and
    value heads repeated when the model has fewer than the variant; whether it did."""
    target = getattr(variant, name, None)
    if not isinstance(target, nn.Linear):
        return False
    if bias is not None and target.bias is None:
        return False
    rows, wanted = weight.shape[0], target.weight.shape[0]
    if target.weight.shape[1] != weight.shape[1] or wanted % rows:
        return False
    if wanted != rows:  # G key/value heads -> H: each query head reads its group's
        width = variant.head_dim
        repeat = wanted // rows
        weight = weight.unflatten(0, (-1, width)).repeat_interleave(repeat, 0).flatten(0, 1)
        if bias is not None:
            bias = bias.unflatten(0, (-1, width)).repeat_interleave(repeat, 0).flatten()
    _copy(target, weight, bias)
    return True


def _linear_parts(module: Any, names: tuple[str, ...]) -> list[tuple[Any, Any]]:
    return [(getattr(module, n).weight, getattr(module, n).bias) for n in names]


def _model_projections(kind: str, module: Any, parent: Any) -> list[tuple[Any, Any]]:
    """(weight (out, in), bias or None) of the model's q, k, v and output projections."""
    if kind == "gpt2":  # Conv1D: y = x W + b, W (in, out); q, k, v fused along out
        q, k, v = module.c_attn.weight.T.chunk(3, dim=0)
        biases = module.c_attn.bias.chunk(3)
        return [
            (q, biases[0]),
            (k, biases[1]),
            (v, biases[2]),
            (module.c_proj.weight.T, module.c_proj.bias),
        ]
    if kind == "bert":
        output = parent.output.dense  # BertSelfOutput's, applied after this module
        return [*_linear_parts(module, ("query", "key", "value")), (output.weight, output.bias)]
    return _linear_parts(module, ("q_proj", "k_proj", "v_proj", "o_proj"))


def _rotatable(projection: Any, width: int) -> bool:
    """Whether a projection's output is whole heads of `width`, which a rotation acts on."""
    return isinstance(projection, nn.Linear) and projection.out_features % width == 0


# --- swapping ----------------------------------------------------------------------------
def _architecture(model: nn.Module) -> str:
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in SUPPORTED:
        raise UnsupportedFeature(
            "transformers bridge",
            f"swapping the attention of a {type(model).__name__} (model_type {kind!r})",
            f"supported: {', '.join(sorted(SUPPORTED))} (LlamaForCausalLM, MistralForCausalLM, "
            "Qwen2ForCausalLM, GPT2LMHeadModel, BertModel and their heads); for another model "
            "that dispatches through transformers' AttentionInterface, register the variant "
            "at kernel level (playground.hf.register)",
        )
    return kind


def _options(cls: type[AttentionVariant], config: Any, kind: str, options: dict) -> dict:
    """The user's options, and the variant's bias as the model has it unless given."""
    names = {f.name for f in fields(cls.Config)}
    if "bias" in names and "bias" not in options:
        has_bias = {"llama": getattr(config, "attention_bias", False), "mistral": False}
        options = {**options, "bias": has_bias.get(kind, True)}
    return options


def _refuse_model_features(config: Any, kind: str, cls: type[AttentionVariant]) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim * heads != config.hidden_size:
        raise UnsupportedFeature(
            cls.name,
            f"a model whose heads ({heads} of {head_dim}) do not span its width "
            f"({config.hidden_size})",
            "a variant's heads split d_model; register it at kernel level instead "
            "(playground.hf.register), which takes the model's own q, k and v",
        )
    if getattr(config, "sliding_window", None) is not None and (
        kind == "mistral" or getattr(config, "use_sliding_window", False)
    ):
        raise UnsupportedFeature(
            cls.name,
            "a swapped attention module in a model with a sliding window",
            "the swapped module takes padding and causality only: build the model with "
            "sliding_window=None, or register the variant at kernel level "
            "(playground.hf.register), which reads the window from the model's mask",
        )
    causal = kind != "bert" or bool(getattr(config, "is_decoder", False))
    if causal and not cls.capabilities.causal:
        raise UnsupportedFeature(
            cls.name,
            f"causal attention, which a {kind} model needs",
            cls.capabilities.decoding_hint or "use a causal variant",
        )


def swap_attention(
    model: nn.Module, name: str | type[AttentionVariant], **options: Any
) -> SwapReport:
    """Replace every self-attention module of `model` (Llama, Mistral, Qwen2, GPT-2, BERT)
    by variant `name` (or a variant class) built with `options` (d_model and heads from the model's config),
    porting the weights it shares with the model. Returns what was ported, what is new and
    what happened to the model's positions; the model is changed in place."""
    require()
    kind = _architecture(model)
    config: Any = model.config
    if any(isinstance(module, SwappedAttention) for module in model.modules()):
        raise InvalidInput(
            "this model's attention is already swapped; build the model again (or from a "
            "copy made before the swap) to swap in another variant"
        )
    cls = variant_class(name)
    name = cls.name
    _refuse_model_features(config, kind, cls)
    options = _options(cls, config, kind, options)
    report = SwapReport(architecture=kind, variant=name)
    rotate_positions = kind in ROTARY and not cls.encodes_positions
    report.positions = _positions_note(kind, cls)
    targets = [
        (parent, child_name, child)
        for parent in model.modules()
        for child_name, child in parent.named_children()
        if type(child).__name__ == SUPPORTED[kind]
    ]
    parent: Any
    for layer, (parent, child_name, module) in enumerate(targets):
        if getattr(module, "is_cross_attention", False):
            raise UnsupportedFeature(name, "cross-attention layers in a swapped model")
        variant = cls(config.hidden_size, config.num_attention_heads, **options)
        variant.to(next(module.parameters()).dtype).to(next(module.parameters()).device)
        sources = _model_projections(kind, module, parent)
        targets_named = ("q_proj", "k_proj", "v_proj", "out_proj")
        ported = [
            target
            for target, (weight, bias) in zip(targets_named, sources, strict=True)
            if _port(variant, target, weight, bias)
        ]
        if kind == "bert" and "out_proj" in ported:
            parent.output.dense = nn.Identity()  # moved into the variant
        rotate = None
        if rotate_positions:
            width = config.hidden_size // config.num_attention_heads
            if not all(_rotatable(getattr(variant, p, None), width) for p in ("q_proj", "k_proj")):
                raise UnsupportedFeature(
                    name,
                    f"keeping a {kind} model's rotary positions",
                    "its queries and keys do not come from q_proj and k_proj layers of whole "
                    f"heads of {width}, where the rotation is applied",
                )
            rotate = sys.modules[type(module).__module__].apply_rotary_pos_emb
        swapped = SwappedAttention(
            variant,
            layer_idx=getattr(module, "layer_idx", layer),
            is_causal=bool(getattr(module, "is_causal", kind != "bert")),
            rotate=rotate,
            output_dropout=getattr(module, "resid_dropout", None),
        )
        setattr(parent, child_name, swapped)
        report.layers += 1
        if layer == 0:
            report.ported = ported
            report.new = [n for n, _ in variant.named_parameters() if n.split(".")[0] not in ported]
    if not report.layers:
        raise UnsupportedFeature(name, f"this {kind} model: no {SUPPORTED[kind]} module found")
    return report


def _positions_note(kind: str, cls: type[AttentionVariant]) -> str:
    if kind not in ROTARY:
        return f"the model's learned positions, added to its embeddings, are kept ({kind})"
    if cls.encodes_positions:
        return (
            f"the model's rotary positions are turned off for attention: {cls.name} encodes "
            "positions itself"
        )
    return "the model's rotary positions are kept, applied to the variant's q and k"
