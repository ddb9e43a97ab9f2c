"""The module-level bridge: a variant's own attention module inside a transformers model.

`swap_attention(model, name, **options)` replaces every self-attention module of a Llama,
Mistral or Qwen2 (one attention), GPT-2 or BERT model with `SwappedAttention`
(swapped.py), the variant's module wrapped to HF's calling convention: hidden states and
HF's mask in, the output (with the output projection, as the replaced module returned it)
and no weights out. It fits every variant, those that own their projections included.

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
- **Caches.** Given HF's cache (in `generate`, beam search included, or any forward with
  `use_cache`), the first call prefills the variant's own decoding state and later calls
  step it, one token at a time however many they bring. The state lives in the layer's
  slot of the cache, which reorders, repeats and trims it with the batch (cache.py).
  A variant that cannot decode runs its forward on the first call and refuses a step,
  with its reason.
- **Dropout.** The model's attention dropout goes to the variant's `dropout` option, or
  through its attention on projected heads, or, where neither exists, is reported and
  warned about as not applied (dropout.py).
- **Saving.** The swap is recorded in the model's config, so that `from_pretrained` of a
  saved swapped model followed by `swap_attention` loads the saved attention weights
  (checkpoint.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.errors import InvalidInput, PlaygroundError, UnsupportedFeature
from playground.hf.checkpoint import load_swapped_weights, record_swap, saved_options, saved_swap
from playground.hf.dropout import (
    OPTION_NAME,
    DropoutPath,
    DropoutPlan,
    dropout_plan,
    model_attention_dropout,
)
from playground.hf.kernel import PROJECTIONS, variant_class
from playground.hf.library import require
from playground.hf.swapped import SwappedAttention

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
ROTATED = ("q_proj", "k_proj")
"""The variant's layers whose outputs the model's rotation is applied to."""


@dataclass
class SwapReport:
    """What `swap_attention` did, for a person to read (`str(report)`)."""

    architecture: str
    variant: str
    layers: int = 0
    ported: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    positions: str = ""
    dropout: DropoutPlan = field(default_factory=lambda: DropoutPlan(0.0, DropoutPath.NONE))
    """How the model's attention dropout reaches the variant (dropout.py)."""
    loaded_from: str = ""
    """The checkpoint the swapped modules' weights were loaded from (checkpoint.py)."""

    def __str__(self) -> str:
        ported = ", ".join(self.ported) or "nothing"
        new = ", ".join(self.new) or "none"
        loaded = f"\nattention weights loaded from {self.loaded_from}" if self.loaded_from else ""
        return (
            f"{self.variant} in {self.layers} {self.architecture} layers\n"
            f"ported from the model: {ported}\n"
            f"new parameters: {new}\n"
            f"positions: {self.positions}\n"
            f"attention dropout: {self.dropout}{loaded}"
        )


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
def _architecture(model: nn.Module, variant: str) -> str:
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in SUPPORTED:
        raise UnsupportedFeature(
            variant,
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
    caps = cls.capabilities_for(cls.Config())  # the options that matter here come later
    if causal and not caps.causal:
        raise UnsupportedFeature(
            cls.name,
            f"causal attention, which a {kind} model needs",
            caps.decoding_hint or "use a causal variant",
        )


def swap_attention(
    model: nn.Module, name: str | type[AttentionVariant], **options: Any
) -> SwapReport:
    """Replace every self-attention module of `model` (Llama, Mistral, Qwen2, GPT-2, BERT)
    by variant `name` (or a variant class) built with `options` (d_model and heads from the
    model's config), porting the weights it shares with the model, or, for a model loaded
    from a saved swapped model, loading the saved ones. Returns what was ported, what is
    new, what happened to the model's positions and attention dropout; the model is changed
    in place."""
    require()
    cls = variant_class(name)
    name = cls.name
    kind = _architecture(model, name)
    config: Any = model.config
    if any(isinstance(module, SwappedAttention) for module in model.modules()):
        raise InvalidInput(
            "this model's attention is already swapped; build the model again (or from a "
            "copy made before the swap) to swap in another variant"
        )
    _refuse_model_features(config, kind, cls)
    saved = saved_swap(model)
    given = saved_options(*saved, name, options) if saved else options
    options = _options(cls, config, kind, given)
    targets = [
        (parent, child_name, child)
        for parent in model.modules()
        for child_name, child in parent.named_children()
        if type(child).__name__ == SUPPORTED[kind]
    ]
    if not targets:
        raise UnsupportedFeature(name, f"this {kind} model: no {SUPPORTED[kind]} module found")
    first = targets[0][2]
    is_causal = bool(getattr(first, "is_causal", kind != "bert"))
    probability = model_attention_dropout(kind, first)
    plan = dropout_plan(cls, options, probability, config.num_attention_heads, is_causal)
    if plan.path is DropoutPath.OPTION:
        options = {OPTION_NAME: plan.probability, **options}
    report = SwapReport(architecture=kind, variant=name, dropout=plan)
    report.positions = _positions_note(kind, cls)
    parent: Any
    for layer, (parent, child_name, module) in enumerate(targets):
        if getattr(module, "is_cross_attention", False):
            raise UnsupportedFeature(name, "cross-attention layers in a swapped model")
        variant = cls(config.hidden_size, config.num_attention_heads, **options)
        variant.to(next(module.parameters()).dtype).to(next(module.parameters()).device)
        ported = _port_all(kind, variant, module, parent)
        swapped = SwappedAttention(
            variant,
            layer_idx=getattr(module, "layer_idx", layer),
            is_causal=is_causal,
            rotate=_rotation(kind, cls, variant, module, config, check=layer == 0),
            output_dropout=getattr(module, "resid_dropout", None),
            attention_dropout=plan.probability if plan.path is DropoutPath.HEADS else 0.0,
        )
        setattr(parent, child_name, swapped.train(module.training))  # eval stays eval
        report.layers += 1
        if layer == 0:
            report.ported = ported
            report.new = [n for n, _ in variant.named_parameters() if n.split(".")[0] not in ported]
    if saved:
        modules = {p: m for p, m in model.named_modules() if isinstance(m, SwappedAttention)}
        load_swapped_weights(model, modules, saved[0])
        report.loaded_from = saved[0]
    record_swap(config, name, given)
    return report


def _port_all(kind: str, variant: AttentionVariant, module: Any, parent: Any) -> list[str]:
    """Port the model's q, k, v and output projections into the variant where they fit;
    the names of those ported. BERT's output projection, applied after the replaced
    module, moves into the variant."""
    sources = _model_projections(kind, module, parent)
    ported = [
        target
        for target, (weight, bias) in zip(PROJECTIONS, sources, strict=True)
        if _port(variant, target, weight, bias)
    ]
    if kind == "bert" and "out_proj" in ported:
        parent.output.dense = nn.Identity().train(parent.training)
    return ported


def _rotation(
    kind: str,
    cls: type[AttentionVariant],
    variant: AttentionVariant,
    module: Any,
    config: Any,
    check: bool,
) -> Any:
    """The model's `apply_rotary_pos_emb` where the swapped layer keeps it, else None;
    `check`: make sure first that the variant calls the projections it is applied to."""
    if kind not in ROTARY or cls.encodes_positions:
        return None
    width = config.hidden_size // config.num_attention_heads
    feature = f"keeping a {kind} model's rotary positions"
    if not all(_rotatable(getattr(variant, p, None), width) for p in ROTATED):
        raise UnsupportedFeature(
            cls.name,
            feature,
            "its queries and keys do not come from q_proj and k_proj layers of whole "
            f"heads of {width}, where the rotation is applied",
        )
    bypassed = _paths_bypassing_projections(variant) if check else []
    if bypassed:
        impl = "" if variant.config.impl == "reference" else " (try impl='reference')"
        raise UnsupportedFeature(
            cls.name,
            feature,
            f"its {' and '.join(bypassed)} computes queries or keys without calling q_proj "
            f"and k_proj (reading their weights), so the rotation, applied to what those "
            f"layers return, would miss them{impl}",
        )
    return sys.modules[type(module).__module__].apply_rotary_pos_emb


def _paths_bypassing_projections(variant: AttentionVariant) -> list[str]:
    """The paths of `variant` (forward, and prefill and a decoding step where it decodes)
    in which q_proj or k_proj is not called, on three tokens of its dtype."""
    calls = dict.fromkeys(ROTATED, 0)

    def counted(name: str) -> Any:
        return lambda *_: calls.__setitem__(name, calls[name] + 1)

    handles = [getattr(variant, name).register_forward_hook(counted(name)) for name in ROTATED]
    parameter = next(variant.parameters())
    x = torch.randn(1, 3, variant.d_model, dtype=parameter.dtype, device=parameter.device)
    paths: dict[str, Any] = {"forward": lambda: variant(x, is_causal=True)}
    state: list[Any] = []
    if variant.capabilities_for(variant.config).decoding:
        paths["prefill"] = lambda: state.append(variant.prefill(x[:, :2])[1])
        paths["decoding step"] = lambda: variant.decode_step(x[:, 2:], state[0])
    bypassed = []
    training = variant.training
    try:
        variant.eval()
        with torch.no_grad():
            for path, run in paths.items():
                calls.update(dict.fromkeys(ROTATED, 0))
                try:
                    run()
                except PlaygroundError:  # refused at this size: its own error comes later
                    break
                if min(calls.values()) == 0:
                    bypassed.append(path)
    finally:
        variant.train(training)
        for handle in handles:
            handle.remove()
    return bypassed


def _positions_note(kind: str, cls: type[AttentionVariant]) -> str:
    if kind not in ROTARY:
        return f"the model's learned positions, added to its embeddings, are kept ({kind})"
    if cls.encodes_positions:
        return (
            f"the model's rotary positions are turned off for attention: {cls.name} encodes "
            "positions itself"
        )
    return "the model's rotary positions are kept, applied to the variant's q and k"
