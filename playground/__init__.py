"""Attention playground: attention variants as plugins, one contract, one comparison.

Public API (everything else is private and may change):

    build(name, d_model=512, num_heads=8, **options) -> AttentionVariant
    list_variants() -> list[str]
    get_variant(name) -> type[AttentionVariant]
    hookimpl                      decorator for plugin hooks
    AttentionVariant, AttentionOutput, Capabilities, VariantConfig
    SoftmaxAttention, SoftmaxConfig   softmax attention changed by score_mod / mask_mod
    require_positive, require_range   option validators for a config's __post_init__
    errors: PlaygroundError, UnsupportedFeature, UnknownVariant, ConfigError,
            InvalidInput, PluginLoadError, DuplicateVariant, VariantFailedToLoad, HookError
"""

from __future__ import annotations

from typing import Any

from playground.config import VariantConfig, picture_width, require_positive, require_range
from playground.contract import AttentionOutput, AttentionVariant, Capabilities
from playground.errors import (
    ConfigError,
    DuplicateVariant,
    HookError,
    InvalidInput,
    PlaygroundError,
    PluginLoadError,
    UnknownVariant,
    UnsupportedFeature,
    VariantFailedToLoad,
)
from playground.hookspecs import hookimpl
from playground.registry import default_registry
from playground.softmax_attention import SoftmaxAttention, SoftmaxConfig

__version__ = "0.2.0"


def build(name: str, d_model: int = 512, num_heads: int = 8, **options: Any) -> AttentionVariant:
    """Build the registered variant `name` with its options (see `playground info NAME`)."""
    return default_registry().build(name, d_model=d_model, num_heads=num_heads, **options)


def list_variants() -> list[str]:
    """Names of every registered variant, sorted."""
    return default_registry().names()


def get_variant(name: str) -> type[AttentionVariant]:
    """The class registered as `name`; raises UnknownVariant with close suggestions."""
    return default_registry().get(name)


__all__ = [
    "AttentionOutput",
    "AttentionVariant",
    "Capabilities",
    "ConfigError",
    "DuplicateVariant",
    "HookError",
    "InvalidInput",
    "PlaygroundError",
    "PluginLoadError",
    "SoftmaxAttention",
    "SoftmaxConfig",
    "UnknownVariant",
    "UnsupportedFeature",
    "VariantConfig",
    "VariantFailedToLoad",
    "__version__",
    "build",
    "get_variant",
    "hookimpl",
    "list_variants",
    "picture_width",
    "require_positive",
    "require_range",
]
