"""Calling a variant's optional hooks from the core: a raise or a value of the wrong kind
becomes a HookError that names the plugin, its file and the hook, instead of a traceback
from deep inside a figure or a model builder. Each `checked_*` is one hook's call and the
check of what it returned."""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.errors import HookError
from playground.validation import hook_error

MAX_SPECIAL_SIZES = 256
"""At most this many sizes are read from `special_sizes()`: the suite tests lengths on both
sides of each, so more would never finish, and an endless iterator must not hang it."""


def call_hook(
    variant: type[AttentionVariant] | AttentionVariant, hook: str, *arguments: Any
) -> Any:
    """`variant.hook(*arguments)`, with an exception turned into a HookError naming the
    variant, its file and the hook (a raw traceback from deep inside a figure or a
    model builder names none of them)."""
    try:
        return getattr(variant, hook)(*arguments)
    except HookError:
        raise
    except Exception as error:
        raise hook_error(variant, f"{hook}()", f"raised {type(error).__name__}: {error}") from error


def checked_special_sizes(module: AttentionVariant) -> tuple[int, ...]:
    """`module.special_sizes()`, refused unless it is a finite collection of positive
    integers: a float such as 32.0 would otherwise be dropped and never tested, and an
    endless iterator would hang the suite (at most MAX_SPECIAL_SIZES items are read)."""
    value = call_hook(module, "special_sizes")
    expected = "it must return a tuple of positive integers (sequence lengths), like (32, 4)"
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise hook_error(module, "special_sizes()", f"returned {value!r}; {expected}")
    try:
        items = list(itertools.islice(iter(value), MAX_SPECIAL_SIZES + 1))
    except Exception as error:
        raise hook_error(
            module, "special_sizes()", f"raised {type(error).__name__}: {error} while iterated"
        ) from error
    if len(items) > MAX_SPECIAL_SIZES:
        raise hook_error(
            module,
            "special_sizes()",
            f"returned more than {MAX_SPECIAL_SIZES} sizes (an endless iterator?); {expected}",
        )
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Integral) or item < 1:
            hint = f" (write {int(item)})" if isinstance(item, float) and item.is_integer() else ""
            raise hook_error(
                module,
                "special_sizes()",
                f"returned {item!r} ({type(item).__name__}) among its sizes{hint}; {expected}",
            )
    return tuple(int(item) for item in items)


def checked_options_hook(
    variant: type[AttentionVariant], hook: str, options: dict[str, Any], seq_len: int
) -> dict[str, Any]:
    """`variant.fit_options(options, seq_len)` (or `picture_options`), refused unless it
    returns a mapping of option names."""
    value = call_hook(variant, hook, dict(options), seq_len)
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise hook_error(
            variant,
            f"{hook}()",
            f"returned {value!r}; it must return the options as a dict (option name -> value), "
            f"the given ones included (`return dict(options)` changes nothing)",
        )
    return dict(value)


def checked_share_with_first_layer(
    layer: AttentionVariant, first: AttentionVariant
) -> tuple[str, ...]:
    """`layer.share_with_first_layer(first)`, refused unless it returns names of the
    layer's own attributes (a string alone would be recorded as its characters)."""
    value = call_hook(layer, "share_with_first_layer", first)
    expected = (
        "it must return a tuple of the names of what is now shared (attributes of the layer), "
        "like ('bias_table',), or () for nothing"
    )
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise hook_error(layer, "share_with_first_layer()", f"returned {value!r}; {expected}")
    names = tuple(value)
    for name in names:  # names for the record: what is shared, not necessarily attributes
        if not isinstance(name, str) or not name.strip() or "\n" in name:
            raise hook_error(
                layer,
                "share_with_first_layer()",
                f"returned {name!r}, which is not a one-line name; {expected}",
            )
    return names


def checked_logit_bias(module: AttentionVariant, n_q: int, n_k: int) -> torch.Tensor | None:
    """`module.logit_bias(n_q, n_k)`, refused unless None or a (1, H, n_q, n_k) tensor."""
    value = call_hook(module, "logit_bias", n_q, n_k)
    expected = (1, module.num_heads, n_q, n_k)
    if value is not None and (
        not isinstance(value, torch.Tensor) or tuple(value.shape) != expected
    ):
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else repr(value)
        raise hook_error(
            module,
            "logit_bias()",
            f"returned {got} for n_q={n_q}, n_k={n_k}; it must return a tensor of shape "
            f"(1, num_heads, n_q, n_k) = {expected}, or None",
        )
    return value


def checked_pattern_weights(
    module: AttentionVariant, query: torch.Tensor
) -> tuple[torch.Tensor, str] | None:
    """`module.pattern_weights(query)`, refused unless None or ((B, H, Nq, M), label)."""
    value = call_hook(module, "pattern_weights", query)
    if value is None:
        return None
    batch, n_q = query.shape[:2]
    good = (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], torch.Tensor)
        and value[0].dim() == 4
        and tuple(value[0].shape[:3]) == (batch, module.num_heads, n_q)
        and isinstance(value[1], str)
    )
    if not good:
        shape = (
            tuple(value[0].shape)
            if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor)
            else None
        )
        raise hook_error(
            module,
            "pattern_weights()",
            f"returned {type(value).__name__}{f' with weights {shape}' if shape else ''}; it must "
            f"return None or (weights of shape (B, H, Nq, M) = ({batch}, {module.num_heads}, "
            f"{n_q}, M), a label of the M columns)",
        )
    return value


def checked_learned_summary(module: AttentionVariant) -> dict[str, float | list[float]]:
    """`module.learned_summary()`, refused unless {one-line name: a finite number or a
    list of finite numbers} (a 0-d or 1-d tensor is read as one)."""
    summary = call_hook(module, "learned_summary")
    expected = (
        "it must return a dict of one-line names to a finite number or a list of finite "
        "numbers, like {'slope': [0.5, 0.25]} (flatten a matrix)"
    )
    if not isinstance(summary, Mapping):
        raise hook_error(module, "learned_summary()", f"returned {summary!r}; {expected}")
    checked = {}
    for name, value in summary.items():
        read = _learned_numbers(value)
        if not isinstance(name, str) or not name.strip() or "\n" in name or read is None:
            raise hook_error(
                module, "learned_summary()", f"returned {name!r}: {value!r}; {expected}"
            )
        checked[name] = read
    return checked


def _learned_numbers(value: Any) -> float | list[float] | None:
    """A finite number, or a list of them, read from a number, a sequence or a tensor;
    None for anything else (a nested list, NaN, a string)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist()  # 0-d: a number; 1-d: a list
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        items = [_learned_numbers(item) for item in value]
        numbers_only = [item for item in items if isinstance(item, float)]
        return numbers_only if len(numbers_only) == len(items) else None
    return None


def learned_summaries(model: nn.Module) -> dict[str, dict[str, float | list[float]]]:
    """{"layer 1": learned_summary(), ...}: every attention layer of `model` in order,
    those that learned nothing left out."""
    layers = [module for module in model.modules() if isinstance(module, AttentionVariant)]
    found = {f"layer {i}": checked_learned_summary(layer) for i, layer in enumerate(layers, 1)}
    return {layer: summary for layer, summary in found.items() if summary}
