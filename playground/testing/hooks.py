"""Checks of a variant's presentation hooks on a freshly built module, so that what a
report reads from them after a training run is known good before any training is spent:
`playground check` finds junk in minutes, not at the end of a run."""

from __future__ import annotations

from playground.errors import HookError
from playground.hook_calls import checked_learned_summary
from playground.testing.corners import CheckFailed
from playground.testing.subject import Subject


def check_learned_summary(subject: Subject) -> None:
    """`learned_summary()` of a freshly built module, in eval and in train mode, is what
    the report can read: a dict of one-line names to a finite number or a list of finite
    numbers (or empty)."""
    for mode in ("eval", "train"):
        try:
            checked_learned_summary(subject.build(mode=mode))
        except HookError as error:
            raise CheckFailed(f"in {mode} mode: {error}") from None
