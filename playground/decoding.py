"""Decoding state: what a causal variant keeps between generated tokens, and the shared
parts variants build theirs from.

A causal variant decodes in two calls (`AttentionVariant.prefill`, then
`AttentionVariant.decode_step` once per token). Between them it keeps a `DecodingState`:

- `RecomputeState`: the inputs so far, for the default that re-runs the causal forward
  over them at every step (exact for every causal variant, O(n) work per token);
- `TokenCache`: tensors kept per token (keys and values, or what they are made from),
  (B, heads, slots, width) each, that grow with the tokens, or, given a window, a rolling
  buffer of the last `window` tokens (Mistral's sliding-window cache);
- a variant's own subclass for a fixed-size recurrent state (linear attention's S and z).

The core stamps every state with its owner, batch, dtype, device, length (the next
token's position) and maximum length, and checks them at every step. `nbytes` counts the
storage of every tensor the state holds, so `playground info`, the runner's decode pass and
the contract suite read one number.

Prompts in a batch may be padded on either side: the core moves each sequence's real
tokens to the end (left padding) before a variant sees them, so a state only ever holds
left-padded sequences, whose positions are those of the padded batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any, overload

import torch
import torch.nn.functional as F

from playground.errors import HookError, InvalidInput, UnsupportedFeature

MIN_CAPACITY = 16
"""Slots a growing `TokenCache` starts with; it doubles when full (amortised O(1))."""


class DecodingState:
    """What a variant keeps between decoding steps, for one batch of sequences.

    Subclass it and keep every tensor in an attribute (directly, or in a list, tuple or
    dict, or in a state held by it): `tensors()` finds them there, `nbytes` counts them,
    and the contract suite checks that the state holds no tensor it does not count.
    """

    def __init__(self) -> None:
        self.length = 0
        """Tokens decoded so far, the prompt's padding included: the next token's position."""
        self.max_length: int | None = None
        """The most tokens the state may hold (given to `prefill`); None: no limit."""
        self.batch = 0
        self.dtype: torch.dtype | None = None
        self.device: torch.device | None = None
        self._owner: weakref.ReferenceType[Any] | None = None

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds, each once."""
        found: dict[int, torch.Tensor] = {}
        for tensor in _tensors_in(vars(self), seen=set()):
            found.setdefault(id(tensor), tensor)
        return list(found.values())

    @property
    def nbytes(self) -> int:
        """Bytes of memory the state's tensors hold (each storage once, the unused slots
        of a preallocated buffer included: they are memory the state keeps)."""
        storages: dict[tuple[torch.device, int], int] = {}
        for tensor in self.tensors():
            storage = tensor.untyped_storage()
            storages[(tensor.device, storage.data_ptr())] = storage.nbytes()
        return sum(storages.values())

    def bind(
        self,
        owner: Any,
        like: torch.Tensor,
        max_length: int | None,
        length: int,
    ) -> None:
        """Stamp the state with what the core checks at every step (called by the core)."""
        self._owner = weakref.ref(owner)
        self.batch, self.dtype, self.device = like.shape[0], like.dtype, like.device
        self.max_length, self.length = max_length, length

    def owned_by(self, module: Any) -> bool:
        return self._owner is not None and self._owner() is module

    def select_sequences(self, indices: torch.Tensor) -> None:
        """Keep the sequences at `indices` (B',) int64, in that order, one possibly more
        than once: beam search's reordering between steps (transformers'
        `Cache.reorder_cache`), a batch repeated or trimmed. The default indexes every
        tensor the state holds along its first dimension, which is the batch (a state's
        tensors are per sequence, batch first, as TokenCache's are; an empty one is left
        as it is). Override it for a state that holds a tensor shared by the sequences."""
        _select_rows(self, indices, self.batch, self, seen=set())
        self.batch = indices.shape[0]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch={self.batch}, length={self.length}, "
            f"max_length={self.max_length}, nbytes={self.nbytes})"
        )


def _select_rows(
    value: Any, indices: torch.Tensor, batch: int, state: DecodingState, seen: set[int]
) -> Any:
    """`value` with every tensor in it indexed by `indices` along its batch dimension;
    containers rebuilt, states changed in place (`DecodingState.select_sequences`)."""
    if isinstance(value, torch.Tensor):
        if value.dim() and value.shape[0] == batch:
            return value.index_select(0, indices.to(value.device))
        if value.numel() == 0:
            return value
        owner = state._owner() if state._owner is not None else None
        raise HookError(
            getattr(owner, "name", type(owner).__name__),
            type(state).__module__,
            f"{type(state).__name__}.select_sequences()",
            f"is the default, which takes every tensor of a state to be per sequence, batch "
            f"({batch}) first; this state holds one of {tuple(value.shape)}: override "
            "select_sequences to say which of its tensors follow the sequences",
        )
    if isinstance(value, dict):
        return {k: _select_rows(v, indices, batch, state, seen) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_select_rows(v, indices, batch, state, seen) for v in value]
        return value._make(items) if hasattr(value, "_make") else type(value)(items)
    if isinstance(value, DecodingState) and id(value) not in seen:
        seen.add(id(value))
        for name, item in vars(value).items():
            setattr(value, name, _select_rows(item, indices, batch, state, seen))
    return value


def _tensors_in(value: Any, seen: set[int]) -> Iterator[torch.Tensor]:
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item, seen)
    elif isinstance(value, DecodingState):
        yield from _tensors_in(vars(value), seen)


class TokenCache(DecodingState):
    """Tensors kept per token along dimension 2, (B, heads, slots, width) each (keys and
    values), with each kept token's position and whether it is a real token.

    Without a window the slots grow with the tokens, up to `max_length` when one is
    given (then they are allocated once, as HF's StaticCache is); with a window only the
    last `window` tokens are kept, in a rolling buffer (slot = position mod window), so the
    state stops growing there. Attention is order-free, so the slots need not be in order:
    `kept_positions()` says where each came from (computed, not stored).
    """

    window: int | None
    """Keep only the last `window` tokens (a rolling buffer); None: every token."""

    def __init__(self, window: int | None = None, max_length: int | None = None) -> None:
        super().__init__()
        if window is not None and window < 1:
            raise InvalidInput(f"a TokenCache window must be a positive integer; got {window}")
        self.window = window
        self.capacity_limit = max_length if window is None else min(window, max_length or window)
        self.entries: dict[str, torch.Tensor] = {}
        self.slot_real = torch.empty(0, 0, dtype=torch.bool)  # (B, slots)
        self.count = 0  # tokens appended so far

    @classmethod
    def of_prompt(
        cls,
        prompt: torch.Tensor,
        attention_mask: torch.Tensor | None,
        max_length: int | None,
        window: int | None = None,
        **entries: torch.Tensor,
    ) -> TokenCache:
        """A cache holding a prompt's entries, (B, heads, P, width) each, with the prompt's
        padding (B, P) marked as not real."""
        cache = cls(window=window, max_length=max_length)
        cache.append(real_tokens(prompt, attention_mask), **entries)
        return cache

    @property
    def slots(self) -> int:
        """Slots allocated."""
        return self.slot_real.shape[1]

    @property
    def kept(self) -> int:
        """Slots holding a token."""
        return min(self.count, self.slots)

    def append(self, real: torch.Tensor | None = None, **entries: torch.Tensor) -> None:
        """Keep n more tokens: each entry (B, heads, n, width), the same names at every
        call, and `real` (B, n) bool, which are real tokens (None: all of them)."""
        if real is None:
            like = next(iter(entries.values()))
            real = torch.ones(like.shape[0], like.shape[2], dtype=torch.bool, device=like.device)
        if self.entries and set(entries) != set(self.entries):
            raise InvalidInput(f"a TokenCache keeps {sorted(self.entries)}; got {sorted(entries)}")
        n, needed = real.shape[1], self.count + real.shape[1]
        if not self.entries:
            limit = self.capacity_limit
            self._allocate(entries, real, max(needed, MIN_CAPACITY) if limit is None else limit)
        if self.window is None and needed > self.slots:
            if self.capacity_limit is not None:
                raise InvalidInput(
                    f"the cache holds at most {self.capacity_limit} tokens (the max_length it "
                    f"was started with); {needed} do not fit"
                )
            self._resize(max(needed, 2 * self.slots))
        keep = min(n, self.slots)  # a window keeps only the last `slots` of a long prompt
        first = needed - keep
        if self.window is None:
            slots: slice | torch.Tensor = slice(first, needed)
        else:
            slots = torch.arange(first, needed, device=real.device) % self.slots
        for name, tensor in entries.items():
            self.entries[name][:, :, slots] = tensor[:, :, n - keep :]
        self.slot_real[:, slots] = real[:, n - keep :]
        self.count = needed

    def _allocate(self, entries: dict[str, torch.Tensor], real: torch.Tensor, slots: int) -> None:
        device = real.device
        self.entries = {
            name: t.new_zeros(t.shape[0], t.shape[1], slots, t.shape[3])
            for name, t in entries.items()
        }
        self.slot_real = torch.zeros(real.shape[0], slots, dtype=torch.bool, device=device)

    def _resize(self, slots: int) -> None:
        kept = self.kept

        def grown(t: torch.Tensor, dim: int) -> torch.Tensor:
            shape = list(t.shape)
            shape[dim] = slots
            bigger = t.new_zeros(shape)
            bigger.narrow(dim, 0, kept).copy_(t.narrow(dim, 0, kept))
            return bigger

        self.entries = {name: grown(t, 2) for name, t in self.entries.items()}
        self.slot_real = grown(self.slot_real, 1)

    def kept_entries(self) -> dict[str, torch.Tensor]:
        """Each entry's kept tokens, (B, heads, kept, width): views, not copies."""
        return {name: t[:, :, : self.kept] for name, t in self.entries.items()}

    def kept_positions(self) -> torch.Tensor:
        """(kept,) int64: the position each kept slot holds. A rolling buffer's slot s
        holds the latest position ≡ s (mod slots)."""
        slots = torch.arange(self.kept, device=self.slot_real.device)
        if self.window is None or self.count <= self.slots:
            return slots
        return slots + self.slots * ((self.count - 1 - slots) // self.slots)

    def kept_real(self) -> torch.Tensor:
        """(B, kept) bool: which kept slots are real tokens (not padding)."""
        return self.slot_real[:, : self.kept]


class RecomputeState(DecodingState):
    """The default's state: every input so far, (B, 1, n, d_model), and which are real."""

    def __init__(self, max_length: int | None) -> None:
        super().__init__()
        self.inputs = TokenCache(max_length=max_length)

    def append(self, x: torch.Tensor, real: torch.Tensor) -> None:
        """x (B, n, d_model), real (B, n) bool."""
        self.inputs.append(real, x=x[:, None])

    def sequence(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every input so far (B, n, d_model), and the padding mask, None when all real."""
        real = self.inputs.kept_real()
        x = self.inputs.kept_entries()["x"][:, 0]
        return x, None if bool(real.all()) else real


def real_tokens(x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, n) bool: the padding mask of x (B, n, ·), all True when there is none."""
    if attention_mask is not None:
        return attention_mask
    return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)


def refuse_forward_arguments(variant: str, extra: dict[str, Any]) -> None:
    """The check a `prefill_state` whose state keeps no forward arguments starts with.
    `prefill` passes it those the variant declares (`forward_kwargs`), as the base class's
    signature says; a state that dropped them would decode later tokens without them."""
    if extra:
        raise UnsupportedFeature(
            variant,
            f"decoding with forward arguments ({', '.join(sorted(extra))})",
            "its decoding state keeps none of them; its prefill_state and step_state would "
            "need to keep what they change",
        )


# --- prompts padded on either side ------------------------------------------------------
def left_aligned(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B,) int64: how far each prompt must move right so that its padding is all on the
    left (its right padding), or None when it already is. Refuses a prompt whose real
    tokens are not one run (padding inside it), whose positions would be ambiguous."""
    if attention_mask is None or attention_mask.shape[1] == 0:
        return None
    real = attention_mask.long()
    runs = (real[:, 1:] > real[:, :-1]).sum(dim=1) + real[:, 0]  # starts of a real run
    if bool((runs > 1).any()):
        row = int((runs > 1).nonzero()[0, 0])
        raise InvalidInput(
            f"the prompt's attention_mask must pad on one side only (left or right): "
            f"sequence {row} has padding between its real tokens; remove it, or decode "
            f"that sequence on its own"
        )
    ends_padded = ~attention_mask[:, -1] & attention_mask.any(dim=1)
    if not bool(ends_padded.any()):
        return None
    last_real = attention_mask.shape[1] - 1 - attention_mask.flip(1).long().argmax(dim=1)
    return torch.where(attention_mask.any(dim=1), attention_mask.shape[1] - 1 - last_real, 0)


def shifted(x: torch.Tensor, shift: torch.Tensor, sign: int = 1) -> torch.Tensor:
    """x (B, N, ...) with row b rolled right by sign · shift[b] along dimension 1."""
    n = x.shape[1]
    index = (torch.arange(n, device=x.device)[None, :] - sign * shift[:, None].to(x.device)) % n
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


# --- attention of one query over a cache ----------------------------------------------------
# The rows that saw no key are None exactly when `allowed` is: a caller that gives a mask
# gets a tensor back, without a check of its own.
@overload
def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: None,
    scale: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]: ...
def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention of new queries over kept keys: q (B, H, n, d), k (B, G, L, d),
    v (B, G, L, dv) with G dividing H (query head h reads key/value head h // (H / G),
    without a copy), `allowed` (B or 1, H or 1, n or 1, L) bool or None. Returns the
    context (B, H, n, dv), zero for a head that saw no key, and (B or 1, n, 1) bool, True
    where a query saw no key in any head (its output is zero), or None when every query
    saw one. One fused SDPA call: a step reads the cache once. `dropout`: the probability
    of dropping a weight (training only)."""
    batch, heads, n, _ = q.shape
    groups = k.shape[1]
    shared, mask = q, allowed
    if groups != heads:  # each key/value head serves its H / G queries: one call per group
        shared = q.reshape(batch, groups, heads // groups * n, q.shape[-1])
        if allowed is not None:
            mask = allowed.expand(-1, heads, n, -1).reshape(
                allowed.shape[0], groups, -1, k.shape[2]
            )
    context = F.scaled_dot_product_attention(
        shared, k, v, attn_mask=mask, dropout_p=dropout, scale=scale
    )
    context = context.reshape(batch, heads, n, v.shape[-1])
    if allowed is None:
        return context, None
    seen = allowed.any(dim=-1, keepdim=True)  # (B or 1, H or 1, n or 1, 1)
    return context.masked_fill(~seen, 0.0), ~seen.any(dim=1)
