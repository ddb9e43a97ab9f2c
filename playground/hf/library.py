"""transformers, imported on first use: the bridge is optional, and a missing library is
an error that names the extra to install."""

from __future__ import annotations

from types import ModuleType

from playground.errors import PlaygroundError

INSTALL_HINT = "pip install 'attention-playground[hf]' (or pip install 'transformers>=5')"
MIN_MAJOR = 5
"""AttentionInterface, AttentionMaskInterface and the `cache` argument of attention modules
are those of transformers 5."""


def require() -> ModuleType:
    """The transformers package, at a version the bridge supports."""
    try:
        import transformers
    except ImportError:
        raise PlaygroundError(
            f"the transformers bridge needs transformers, which is not installed: {INSTALL_HINT}"
        ) from None
    major = int(transformers.__version__.split(".")[0])
    if major < MIN_MAJOR:
        raise PlaygroundError(
            f"the transformers bridge needs transformers {MIN_MAJOR} or later; this is "
            f"{transformers.__version__}: {INSTALL_HINT}"
        )
    return transformers
