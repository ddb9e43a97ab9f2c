"""Where a run's cells execute: `local` (this machine) or `ray` (a Ray cluster), chosen by
the spec's `executor`."""

from __future__ import annotations

from playground.run.context import Executor
from playground.run.executors.local import LocalExecutor
from playground.run.executors.ray import RayExecutor
from playground.run.spec import Spec

__all__ = ["LocalExecutor", "RayExecutor", "executor_for"]


def executor_for(spec: Spec) -> Executor:
    """The executor a spec names; PlaygroundError saying how to install Ray when it names
    ray and Ray is missing."""
    if spec.executor == "ray":
        return RayExecutor(spec.address)
    return LocalExecutor()
