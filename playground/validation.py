"""Validation of what reaches a variant: the contract's inputs, flags and options, what the
variant's declared capabilities allow, the decoding calls, and what a variant's hooks
return. `AttentionVariant` calls these before any path runs, so that a variant never
re-checks its inputs and a bad call fails with a message that says what to do.

Every refusal is an exception of `playground.errors`: InvalidInput for a malformed call,
UnsupportedFeature for a feature the variant does not declare, ConfigError for bad sizes,
HookError (`hook_error`) for a hook that returned the wrong thing, naming the plugin's
file and the hook.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import torch
from torch import nn

from playground.capabilities import Capabilities
from playground.decoding import DecodingState, shifted
from playground.errors import ConfigError, HookError, InvalidInput, UnsupportedFeature


def hook_source(variant: object) -> str:
    """The file that defines a variant's class (its plugin), or its module's name; `variant`
    is the class or an instance."""
    cls = variant if isinstance(variant, type) else type(variant)
    module = sys.modules.get(cls.__module__)
    return str(getattr(module, "__file__", None) or cls.__module__)


def hook_error(variant: object, hook: str, problem: str) -> HookError:
    """A HookError naming the variant (class or instance), its file and `hook`."""
    cls = variant if isinstance(variant, type) else type(variant)
    name = getattr(cls, "name", cls.__name__)
    return HookError(name, hook_source(cls), hook, problem)


def check_sizes(d_model: object, num_heads: object) -> None:
    """d_model and num_heads positive integers, and heads that split d_model evenly."""
    for label, value in (("d_model", d_model), ("num_heads", num_heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{label} must be a positive integer; got {value!r}")
    assert isinstance(d_model, int) and isinstance(num_heads, int)
    if d_model % num_heads:
        raise ConfigError(
            f"d_model ({d_model}) must be divisible by num_heads ({num_heads}) so every "
            f"head gets d_model / num_heads features; try num_heads in "
            f"{[h for h in range(1, min(d_model, 64) + 1) if d_model % h == 0][-6:]}"
        )


def check_tensors(
    name: str,
    d_model: int,
    forward_kwargs: tuple[str, ...],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    extra: dict[str, Any],
) -> None:
    """query, key and value (B, N, d_model) floating tensors that agree, a (B, Nk) bool
    padding mask, and only the extra forward arguments the variant `name` declares."""
    for label, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise InvalidInput(f"{label} must be a torch.Tensor; got {type(tensor).__name__}")
        if tensor.dim() != 3 or tensor.shape[-1] != d_model:
            raise InvalidInput(
                f"{label} must have shape (batch, seq_len, d_model={d_model}), "
                f"batch first; got {tuple(tensor.shape)}"
                + (" (add a batch dimension with .unsqueeze(0))" if tensor.dim() == 2 else "")
            )
        if not tensor.is_floating_point():
            raise InvalidInput(f"{label} must be a floating tensor; got {tensor.dtype}")
    if not (query.shape[0] == key.shape[0] == value.shape[0]):
        raise InvalidInput(
            f"query, key and value must have the same batch size; got "
            f"{query.shape[0]}, {key.shape[0]}, {value.shape[0]}"
        )
    if key.shape[1] != value.shape[1]:
        raise InvalidInput(
            f"key and value must have the same sequence length (one value per key); "
            f"got {key.shape[1]} and {value.shape[1]}"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise InvalidInput(
            f"query, key and value must share a dtype; got {query.dtype}, {key.dtype}, "
            f"{value.dtype}"
        )
    if attention_mask is not None:
        expected = (key.shape[0], key.shape[1])
        if (
            not isinstance(attention_mask, torch.Tensor)
            or tuple(attention_mask.shape) != expected
            or attention_mask.dtype != torch.bool
        ):
            got = (
                f"{tuple(attention_mask.shape)} {attention_mask.dtype}"
                if isinstance(attention_mask, torch.Tensor)
                else type(attention_mask).__name__
            )
            raise InvalidInput(
                f"attention_mask must be a bool tensor of shape (batch, key_len) = "
                f"{expected}, True for real tokens and False for padding; got {got}. "
                f"A 0/1 mask (HF style, 1 = keep) converts with `mask.bool()`."
            )
    unknown = sorted(set(extra) - set(forward_kwargs))
    if unknown:
        takes = ", ".join(forward_kwargs) or "none"
        raise UnsupportedFeature(
            name,
            f"forward argument {', '.join(repr(u) for u in unknown)}",
            f"its extra forward arguments are: {takes}",
        )


def check_flags(**flags: object) -> None:
    """Flags that are True or False, not a truthy string."""
    for label, flag in flags.items():
        if not isinstance(flag, bool):
            raise InvalidInput(
                f"{label} must be True or False; got {flag!r} ({type(flag).__name__}). "
                f"A string such as 'False' is truthy, so it is refused rather than guessed."
            )


def check_module_matches(
    module: nn.Module, name: str, query: torch.Tensor, attention_mask: torch.Tensor | None
) -> None:
    """The inputs live on the module's device and in its dtype (a raw matmul error
    otherwise names neither side)."""
    # Lazily: the first floating tensor ends the walk (a decoding step pays for it).
    tensors = itertools.chain(module.parameters(), module.buffers())
    state = next((t for t in tensors if t.is_floating_point()), None)
    if state is not None and state.dtype != query.dtype:
        raise InvalidInput(
            f"the input is {query.dtype} but the parameters of {name!r} are "
            f"{state.dtype}; "
            f"convert one to the other: `module.to({query.dtype})` or "
            f"`query.to({state.dtype})`"
        )
    for label, tensor in (("input", query), ("attention_mask", attention_mask)):
        if state is not None and tensor is not None and tensor.device != state.device:
            raise InvalidInput(
                f"the {label} is on {tensor.device} but the parameters of {name!r} are "
                f"on {state.device}; move one to the other: `module.to('{tensor.device}')` "
                f"or `{label}.to('{state.device}')`"
            )


def check_capabilities(
    name: str,
    caps: Capabilities,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    is_causal: bool,
    need_weights: bool,
    is_cross: bool,
) -> None:
    """UnsupportedFeature for any feature of the call that `caps` does not declare."""
    if is_causal and not caps.causal:
        raise UnsupportedFeature(name, "causal attention (is_causal=True)")
    if attention_mask is not None and not caps.padding_mask:
        raise UnsupportedFeature(name, "padding masks (attention_mask)")
    if is_cross and not caps.cross_attention:
        raise UnsupportedFeature(
            name,
            "cross-attention (key/value other than query)",
            "call it with the query alone for self-attention",
        )
    if need_weights and not caps.need_weights:
        raise UnsupportedFeature(name, "returning attention weights (need_weights)")
    if caps.max_seq_len is not None and key.shape[1] > caps.max_seq_len:
        raise UnsupportedFeature(
            name,
            f"sequences longer than {caps.max_seq_len} (got {key.shape[1]})",
            caps.max_seq_len_hint,
        )
    if query.dtype not in caps.dtypes:
        raise UnsupportedFeature(
            name,
            f"dtype {query.dtype}",
            f"declared dtypes: {', '.join(str(d) for d in caps.dtypes)}",
        )


def check_decodable(
    name: str, caps: Capabilities, prompt: torch.Tensor, attention_mask: torch.Tensor | None
) -> None:
    """UnsupportedFeature unless `caps` let the variant decode this prompt."""
    if not caps.decoding:
        raise UnsupportedFeature(name, "decoding one token at a time", caps.decoding_hint)
    if not caps.causal:
        raise UnsupportedFeature(
            name,
            "decoding one token at a time",
            "only a causal variant decodes (a later token must not change earlier outputs)",
        )
    if attention_mask is not None and not caps.padding_mask:
        raise UnsupportedFeature(
            name,
            "padded prompts (attention_mask) in decoding",
            "decode prompts of one length, or each on its own",
        )
    if isinstance(prompt, torch.Tensor) and prompt.dtype not in caps.dtypes:
        raise UnsupportedFeature(
            name,
            f"dtype {prompt.dtype}",
            f"declared dtypes: {', '.join(str(d) for d in caps.dtypes)}",
        )


def check_max_length(name: str, caps: Capabilities, length: int, max_length: object) -> None:
    """`max_length` None or an integer of at least the prompt's `length` (and 1), and
    neither past the variant's declared limit."""
    if max_length is not None:
        if isinstance(max_length, bool) or not isinstance(max_length, int):
            raise InvalidInput(f"max_length must be an integer or None; got {max_length!r}")
        if max_length < max(length, 1):
            raise InvalidInput(
                f"max_length ({max_length}) must be at least the prompt's length ({length}) "
                f"and 1; it counts the prompt and every token to decode after it"
            )
    longest = max(length, max_length or 0)
    if caps.max_seq_len is not None and longest > caps.max_seq_len:
        raise UnsupportedFeature(
            name,
            f"decoding more than {caps.max_seq_len} tokens (asked for {longest})",
            caps.max_seq_len_hint,
        )


def check_step(
    module: nn.Module,
    name: str,
    d_model: int,
    caps: Capabilities,
    token: torch.Tensor,
    state: object,
) -> None:
    """A decoding step's state started by `module` and not full, and a token (B, 1, ·) of
    the state's batch, dtype and device (its width is `check_tensors`')."""
    if not isinstance(state, DecodingState) or not state.owned_by(module):
        raise InvalidInput(
            f"this decoding state was not started by this {name!r} module "
            f"(got {type(state).__name__}); start one with `module.prefill(prompt)`, and "
            f"give each layer its own"
        )
    if token.shape[:2] != (state.batch, 1):
        raise InvalidInput(
            f"decode_step takes one token per sequence, (batch={state.batch}, 1, "
            f"d_model={d_model}); got {tuple(token.shape)}"
        )
    if token.dtype != state.dtype or token.device != state.device:
        raise InvalidInput(
            f"the token is {token.dtype} on {token.device} but the state was started "
            f"with {state.dtype} on {state.device}; convert the token, or start again"
        )
    if state.max_length is not None and state.length >= state.max_length:
        raise InvalidInput(
            f"the state is full: it was started with max_length={state.max_length} and "
            f"holds {state.length} tokens; start it with a larger max_length"
        )
    if caps.max_seq_len is not None and state.length >= caps.max_seq_len:
        raise UnsupportedFeature(
            name, f"decoding past {caps.max_seq_len} tokens", caps.max_seq_len_hint
        )


def check_decoded(variant: object, output: object, shape: torch.Size, hook: str) -> None:
    """A decoding hook's output of the shape of its input, one per input."""
    if not isinstance(output, torch.Tensor) or output.shape != shape:
        got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise hook_error(
            variant, hook, f"returned an output of {got}; it must be {tuple(shape)}, one per input"
        )


def clear_non_finite_padding(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded tokens are don't-care, but a NaN or inf there would reach real outputs
    through 0 · NaN in the weighted sum, so such values become 0 before any path runs.
    Finite padded values pass through unchanged (the suite checks they never matter)."""
    padding = ~attention_mask[..., None]  # (B, Nk, 1)

    def cleared(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.masked_fill(padding & ~torch.isfinite(tensor), 0.0)

    cleared_key = cleared(key)
    cleared_value = cleared_key if value is key else cleared(value)
    # In self-attention the query is the key sequence and carries its padding too.
    cleared_query = cleared_key if query is key else query
    return cleared_query, cleared_key, cleared_value


def shifted_like(value: Any, shift: torch.Tensor, prompt: torch.Tensor) -> Any:
    """A forward argument laid out by token, (B, P, ...), moved with its prompt."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == prompt.shape[:2]:
        return shifted(value, shift)
    return value
