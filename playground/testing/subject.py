"""What a contract check receives: a variant class at contract-suite size, with seeded
builds, inputs and the mask combinations it declares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from playground.contract import AttentionVariant, Capabilities


@dataclass
class Subject:
    """A variant under test at contract-suite size, with seeded builds and inputs."""

    cls: type[AttentionVariant]
    impl: str = "fast"
    options: dict[str, Any] = field(default_factory=dict)
    d_model: int = 32
    num_heads: int = 4
    batch: int = 2
    seq_len: int = 16

    def __post_init__(self) -> None:
        # An instance's capabilities may depend on its options (Linformer's max_seq_len is
        # its seq_len), so read them from one built with the options the checks use.
        self.caps: Capabilities = self.build().capabilities
        if self.caps.max_seq_len is not None:
            self.seq_len = min(self.seq_len, self.caps.max_seq_len)

    def build(self, dtype: torch.dtype = torch.float32, **overrides: Any) -> AttentionVariant:
        torch.manual_seed(0)
        options = {**self.cls.check_options, **self.options, "impl": self.impl, **overrides}
        module = self.cls(d_model=self.d_model, num_heads=self.num_heads, **options)
        return module.to(dtype).eval()

    def tokens(self, n: int | None = None, batch: int | None = None, seed: int = 1) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch or self.batch, n or self.seq_len, self.d_model)
        return torch.randn(shape, generator=generator)

    def padding_mask(self, n: int | None = None) -> torch.Tensor:
        """(B, N) bool: element 0 all real; the others lose the last 4 keys and one in
        the middle, so padding is tested both at the end and inside the sequence."""
        n = n or self.seq_len
        mask = torch.ones(self.batch, n, dtype=torch.bool)
        mask[1:, n - 4 :] = False
        mask[1:, n // 4] = False
        return mask

    def mask_cases(self) -> list[dict[str, Any]]:
        """Every (attention_mask, is_causal) combination the variant declares."""
        cases: list[dict[str, Any]] = [{}]
        if self.caps.padding_mask:
            cases.append({"attention_mask": self.padding_mask()})
        if self.caps.causal:
            cases.append({"is_causal": True})
            if self.caps.padding_mask:
                cases.append({"attention_mask": self.padding_mask(), "is_causal": True})
        return cases
