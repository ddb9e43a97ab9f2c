"""Every error the playground raises, in one place.

All derive from `PlaygroundError`, so a caller can catch the family; each also derives
from the built-in exception a Python user would expect (`ValueError` for bad values,
`LookupError` for unknown names), so generic handlers keep working.

    PlaygroundError
    ├── UnsupportedFeature   a variant was asked for something it does not declare
    ├── UnknownVariant       no variant has this name (the message suggests close ones)
    │   └── VariantFailedToLoad  ... because the plugin file that defines it failed to load
    ├── ConfigError          an option is unknown, has the wrong type or an invalid value
    ├── InvalidInput         a tensor has the wrong rank, width, length, shape or dtype
    ├── InvalidOutput        a measured call returned what the contract forbids
    ├── HookError            a variant's hook raised or returned what its contract forbids
    └── PluginLoadError      a plugin failed to import or registered something invalid
        └── DuplicateVariant two sources registered the same name
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TypedDict

import torch


class PlaygroundError(Exception):
    """Base class of every error raised by the playground."""


class UnsupportedFeature(PlaygroundError, NotImplementedError):
    """A variant was asked for a feature its capabilities do not declare."""

    def __init__(self, variant: str, feature: str, hint: str = "") -> None:
        self.variant = variant
        self.feature = feature
        message = f"variant {variant!r} does not support {feature}"
        super().__init__(f"{message}; {hint}" if hint else message)


class UnknownVariant(PlaygroundError, LookupError):
    """No registered variant has the requested name."""

    def __init__(self, name: str, known: Iterable[str], kind: str = "attention variant") -> None:
        self.name = name
        self.known = sorted(known)
        close = difflib.get_close_matches(name, self.known, n=3, cutoff=0.5)
        message = f"no {kind} named {name!r}"
        message += f"; did you mean {', '.join(repr(c) for c in close)}?" if close else "."
        message += f" Registered: {', '.join(self.known) or '(none)'}."
        message += " Run `playground plugins` to see what loaded and what failed."
        super().__init__(message)

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0])


class VariantFailedToLoad(UnknownVariant):
    """The requested name is not registered because a plugin that appears to define it
    failed to load: the message names that file and its error rather than guessing
    at close names."""

    def __init__(self, name: str, known: Iterable[str], failures: list[tuple[str, str]]) -> None:
        super().__init__(name, known)
        self.failures = failures
        why = "; ".join(f"{source} failed to load: {error}" for source, error in failures)
        self.args = (
            f"no attention variant named {name!r} is registered because its plugin did not "
            f"load: {why}. Fix that file (`playground plugins` lists every plugin and its "
            f"errors).",
        )


class HookError(PlaygroundError, ValueError):
    """A variant's extension hook (special_sizes, fit_options, kv_cache_per_token, ...)
    raised or returned a value its documented contract forbids. The message names the
    variant, the file it comes from and the hook, so the author knows what to fix."""

    def __init__(self, variant: str, source: str, hook: str, problem: str) -> None:
        self.variant = variant
        self.source = source
        self.hook = hook
        where = f" ({source})" if source else ""
        super().__init__(f"variant {variant!r}{where}: its {hook} hook {problem}")


class ConfigError(PlaygroundError, ValueError):
    """An option given to a variant or a training run is unknown, of the wrong type, or
    invalid."""


class InvalidInput(PlaygroundError, ValueError):
    """A tensor passed to a variant's forward has the wrong shape or dtype."""


class PluginLoadError(PlaygroundError):
    """A plugin could not be loaded, or registered something that is not a variant."""

    def __init__(self, source: str, message: str) -> None:
        self.source = source
        self.message = message
        super().__init__(f"{source}: {message}")


class DuplicateVariant(PluginLoadError):
    """Two plugins registered a variant under the same name."""

    def __init__(
        self, name: str, first_source: str, second_source: str, kind: str = "variant"
    ) -> None:
        self.name = name
        self.first_source = first_source
        self.second_source = second_source
        super().__init__(
            second_source,
            f"{kind} name {name!r} is already registered by {first_source}; "
            f"rename one of them (the `name` class attribute)",
        )


class InvalidOutput(PlaygroundError):
    """A measured call returned something the attention contract forbids."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocator's refusal (CUDA or host)."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and (
        "out of memory" in message or "can't allocate memory" in message
    )


class FailureFields(TypedDict):
    """A failed cell's status and error, as its row holds them
    (playground.run.row_schema)."""

    status: str
    error: str


def failure_fields(error: BaseException) -> FailureFields:
    """The status and error of a result row whose cell raised `error` (docs/design.md,
    Results): `unsupported`, `invalid`, `oom` or `error`, with the message."""
    if isinstance(error, UnsupportedFeature):
        return {"status": "unsupported", "error": str(error)}
    if isinstance(error, InvalidOutput):
        return {"status": "invalid", "error": str(error)}
    status = "oom" if is_out_of_memory(error) else "error"
    return {"status": status, "error": f"{type(error).__name__}: {error}"}


def first_seed_failure(
    failures: Iterable[tuple[int, FailureFields | None]],
) -> FailureFields | None:
    """Of (seed, its failure or None) in the spec's seed order, the first failure, its
    error prefixed with the seed (what a row of several seeds says when one failed); None
    when every seed succeeded."""
    for seed, failure in failures:
        if failure is not None:
            return {"status": failure["status"], "error": f"seed {seed}: {failure['error']}"}
    return None
