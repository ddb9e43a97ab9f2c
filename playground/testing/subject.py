"""What a contract check receives: a variant class at contract-suite size, with seeded
builds and inputs, the lengths worth testing, and the mask combinations it declares; and
`resolve_variant`, which turns what a caller names (a registered name or a class) into
the class the Subject wraps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from playground.contract import AttentionVariant, Capabilities
from playground.errors import ConfigError
from playground.hook_calls import checked_special_sizes
from playground.registry import Registry, default_registry

LONG_LENGTH = 130
"""A length past 128 (and so past every power-of-two block up to it) that every variant
is tested at, unless its declared max_seq_len is shorter."""

BASE_LENGTHS = (1, 2, 16)

MAX_LENGTH = 2 * LONG_LENGTH
"""Special sizes past this are not tested (causality costs O(n²) calls' worth of work):
a variant's `suite_options` make its special sizes small, as the shipped ones do."""

TRAINING_SEED = 5
"""The seed of every training call of a variant declared random in training."""

Mode = Literal["eval", "train"]
MODES: tuple[Mode, ...] = ("eval", "train")


def resolve_variant(
    variant: str | type[AttentionVariant], registry: Registry | None = None
) -> type[AttentionVariant]:
    """The variant class of a registered name (or the class itself); ConfigError else."""
    if isinstance(variant, str):
        return (registry or default_registry()).get(variant)
    if isinstance(variant, type) and issubclass(variant, AttentionVariant):
        return variant
    raise ConfigError(
        f"the contract suite checks a registered variant name (a str) or "
        f"an AttentionVariant subclass; got {variant!r} ({type(variant).__name__})"
    )


def _seed_training_call(*_: Any) -> None:
    torch.manual_seed(TRAINING_SEED)


@dataclass
class Subject:
    """A variant under test at contract-suite size, with seeded builds and inputs.

    `seq_len` is the length of the checks that need one ordinary length; `lengths` are
    those the corner checks run at: 1, 2, 16, one past every size the instance's options
    make special (`AttentionVariant.special_sizes`, below MAX_LENGTH; the size itself too
    when it is at most 16), and LONG_LENGTH, all capped at the declared max_seq_len (which
    is included).
    """

    cls: type[AttentionVariant]
    impl: str = "fast"
    options: dict[str, Any] = field(default_factory=dict)
    d_model: int = 32
    num_heads: int = 4
    batch: int = 3
    seq_len: int = 16

    def __post_init__(self) -> None:
        # An instance's capabilities may depend on its options (Linformer's max_seq_len is
        # its seq_len), so read them for the options the checks use.
        probe = self.build()
        self.caps: Capabilities = probe.capabilities_for(probe.config)
        limit = self.caps.max_seq_len
        # A junk, endless or raising special_sizes() is a HookError naming the hook, never
        # a size silently left out (or a hang).
        sizes = {s for s in checked_special_sizes(probe) if s < MAX_LENGTH}
        # Just past every special size; the size itself too where that is cheap.
        candidates = {*BASE_LENGTHS, LONG_LENGTH, *(s + 1 for s in sizes)}
        candidates |= {s for s in sizes if s <= max(BASE_LENGTHS)}
        if limit is not None:
            self.seq_len = min(self.seq_len, limit)
            candidates = {n for n in candidates if n <= limit} | {limit}
        self.lengths: tuple[int, ...] = tuple(sorted(candidates))

    def build(
        self, dtype: torch.dtype = torch.float32, mode: Mode = "eval", **overrides: Any
    ) -> AttentionVariant:
        torch.manual_seed(0)
        options = {**self.cls.suite_options, **self.options, "impl": self.impl, **overrides}
        module = self.cls(d_model=self.d_model, num_heads=self.num_heads, **options)
        module = module.to(dtype)
        if mode == "train" and not module.capabilities_for(module.config).deterministic_in_training:
            # Declared random in training: every call draws the same numbers, so that
            # calls can be compared (the randomness itself is checked on its own).
            module.register_forward_pre_hook(_seed_training_call)
        return module.train() if mode == "train" else module.eval()

    def tokens(
        self,
        n: int | None = None,
        batch: int | None = None,
        seed: int = 1,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        shape = (self.batch if batch is None else batch, n or self.seq_len, self.d_model)
        return torch.randn(shape, generator=generator).to(dtype)

    def padding_mask(self, n: int | None = None) -> torch.Tensor:
        """(B, N) bool, a different pattern per element: element 0 all real; element 1
        loses its last quarter and one key in the middle (right padding and a hole);
        element 2 loses its first key and the one at N/2 (left padding: under causal
        masking its first query sees nothing). Every element keeps a real key."""
        n = n or self.seq_len
        mask = torch.ones(self.batch, n, dtype=torch.bool)
        if n >= 2 and self.batch > 1:
            mask[1, n - max(1, n // 4) :] = False
            if n >= 8:
                mask[1, n // 4] = False
        if n >= 2 and self.batch > 2:
            mask[2, 0] = False
            if n >= 4:
                mask[2, n // 2] = False
        return mask

    def mask_cases(self, n: int | None = None) -> list[dict[str, Any]]:
        """Every (attention_mask, is_causal) combination the variant declares."""
        cases: list[dict[str, Any]] = [{}]
        if self.caps.padding_mask:
            cases.append({"attention_mask": self.padding_mask(n)})
        if self.caps.causal:
            cases.append({"is_causal": True})
            if self.caps.padding_mask:
                cases.append({"attention_mask": self.padding_mask(n), "is_causal": True})
        return cases

    def corners(self) -> Iterator[tuple[int, Mode, dict[str, Any]]]:
        """(length, mode, mask case) for every length, both modes and every declared
        mask combination: where the corner checks look."""
        for n in self.lengths:
            for mode in MODES:
                for case in self.mask_cases(n):
                    yield n, mode, case


def describe(case: dict[str, Any]) -> str:
    """ "padding+causal", "causal", "no mask": which masks a case applies."""
    names = {"attention_mask": "padding", "is_causal": "causal"}
    return "+".join(names[key] for key in case if key in names) or "no mask"
