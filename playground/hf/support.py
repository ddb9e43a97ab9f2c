"""Which transformers bridges a variant supports, in words (`playground info NAME`), read
from the same checks the bridges make, so the two cannot disagree."""

from __future__ import annotations

from playground.contract import AttentionVariant
from playground.errors import PlaygroundError
from playground.hf.kernel import check_kernel_level
from playground.hf.swap import SUPPORTED

CAUSAL_FAMILIES = ("llama", "mistral", "qwen2", "gpt2")
"""The supported families whose attention is causal (BERT's is not)."""


def bridges(cls: type[AttentionVariant]) -> list[str]:
    """One line per bridge: whether `cls` (at its default options) works there, and
    where; with generation through its decoding state when it has one."""
    try:
        check_kernel_level(cls, {})
        kernel = "kernel level (playground.hf.register): yes, on the model's projections"
    except PlaygroundError as refused:
        why = str(refused).split("; ", 1)[-1]  # the refusal's reason, not its preamble
        kernel = f"kernel level: no: {why}"
    caps = cls.capabilities_for(cls.Config())  # at its default options
    families = [f for f in SUPPORTED if caps.causal or f not in CAUSAL_FAMILIES]
    generates = caps.causal and caps.decoding
    module = (
        f"module level (playground.hf.swap_attention): {', '.join(families)}"
        f"{'; generate() through its decoding state' if generates else ''}"
    )
    return [kernel, module]
