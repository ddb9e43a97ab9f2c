"""Resuming a run: its directory turned back into what measures the cells it lacks (the
store, the spec it started with, its overrides, and the registry with the plugin
directories it started with)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from playground.registry import Registry, configure
from playground.run.spec import Spec
from playground.run.spec_loading import load_spec
from playground.run.spec_overrides import apply_overrides, size_overrides
from playground.run.store import ENV, OVERRIDES, SPEC, RunStore

LANE_SETTINGS = ("accuracy_workers", "executor", "address")
"""Where the cells run is not a measurement setting: a resume may choose these anew."""


@dataclass(frozen=True)
class Resumed:
    """An earlier run, ready to measure the cells it lacks."""

    store: RunStore
    spec: Spec
    """The spec the run started with, its overrides applied."""
    overrides: dict[str, Any]
    """The command line's overrides the run started with."""
    registry: Registry
    """The registry the spec was read with: the run's plugin directories loaded anew, or
    the caller's."""


def recorded_overrides(store: RunStore) -> dict[str, Any]:
    """The command line's overrides a run started with: overrides.json, or, in a run from
    before that file, env.json's `overrides`."""
    if store.path(OVERRIDES).exists():
        return store.read_json(OVERRIDES)
    env = store.read_json(ENV) if store.path(ENV).exists() else {}
    return env.get("overrides", {})


def resume(
    directory: str | os.PathLike[str],
    registry: Registry,
    plugins_dirs: Sequence[str] = (),
    lane: dict[str, Any] | None = None,
    reloaded: Callable[[Registry], None] | None = None,
) -> Resumed:
    """The run in `directory`, with the spec and overrides it started with; `lane` (the
    LANE_SETTINGS) on top. A run started with plugin directories gets a registry of those
    and then `plugins_dirs`, handed to `reloaded` before the spec is read (so that its
    load errors are told even when the spec then fails to load); else `registry` serves.
    A damaged results.jsonl is refused (DamagedRun) before anything else."""
    store = RunStore.existing(directory)
    store.rows()
    overrides = recorded_overrides(store)
    recorded = overrides.get("plugins_dirs") or []
    if recorded:
        registry = configure([*recorded, *plugins_dirs])
        if reloaded is not None:
            reloaded(registry)
    chosen = {key: (lane or {}).get(key) for key in LANE_SETTINGS}
    spec = load_spec(store.path(SPEC), registry, size_overrides(overrides))
    spec = apply_overrides(spec, registry, {**overrides, **chosen})
    return Resumed(store, spec, overrides, registry)
