"""The command line's overrides on top of a loaded spec: --device, --dtype, --threads,
--accuracy-workers, --executor, --address, --save-weights and --variants (the sizes,
--seq-lens, --steps and the like, are merged into the TOML before it is validated, and
validated with it: playground.run.spec.merge_sizes).

--variants keeps the spec's sweep of each named variant; a variant the spec does not list
runs with its defaults and the spec's [options.NAME] table. The spec's baseline runs
beside the named variants (overrides `with_baseline`, which the command line sets unless
--no-baseline is given), so that their speed-ups have something to be against; a run
recorded before that key existed keeps the variants it named, alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from playground.registry import Registry
from playground.run.spec import MERGED_FLAGS, Spec, SpecError, VariantSetup
from playground.run.spec_loading import (
    address_problem,
    check_variant_name,
    expand_variant,
    first_repeated,
)


def size_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """The settings merged into the spec (MERGED_FLAGS: --seq-lens and the sizes) among a
    run's overrides, for `load_spec(..., sizes=)`."""
    return {key: overrides[key] for key in MERGED_FLAGS if overrides.get(key) is not None}


def added_baseline(spec: Spec, overrides: dict[str, Any]) -> str | None:
    """The baseline label `apply_overrides` ran beside --variants; None when it added none."""
    named = overrides.get("variants") or ()
    added = [variant.label for variant in spec.variants if variant.name not in named]
    return spec.baseline if named and spec.baseline in added else None


def apply_overrides(spec: Spec, registry: Registry, overrides: dict[str, Any]) -> Spec:
    """`spec` with the command line's `overrides` (see the module docstring). A variant
    named twice is an error naming it."""
    changes: dict[str, Any] = {}
    for key in ("device", "dtype", "threads", "accuracy_workers", "executor"):
        if overrides.get(key):
            changes[key] = overrides[key]
    if overrides.get("save_weights"):
        changes["save_weights"] = True
    if overrides.get("address") is not None:  # "" too: refused below, not dropped
        problem = address_problem(overrides["address"])
        if problem:
            raise SpecError(f"--address: {problem}")
        changes["address"] = overrides["address"]
    executor = changes.get("executor", spec.executor)
    if changes.get("address", spec.address) and executor != "ray":
        raise SpecError(
            f"an address is for the ray executor, and this run's executor is {executor!r}; "
            f"add --executor ray (or drop --address)"
        )
    if overrides.get("variants"):
        changes.update(_chosen_variants(spec, registry, overrides))
    return dataclasses.replace(spec, **changes)


def _chosen_variants(spec: Spec, registry: Registry, overrides: dict[str, Any]) -> dict[str, Any]:
    """The spec's changes for --variants: the setups of the named variants, and the
    baseline's first where it is none of them and `with_baseline` asks for it (else no
    baseline: no speed-ups rather than an error)."""
    repeated = first_repeated(overrides["variants"])
    if repeated:
        raise SpecError(f"--variants names {repeated} more than once; give each name once")
    chosen: list[VariantSetup] = []
    for name in overrides["variants"]:
        check_variant_name(name, registry, spec.path, "--variants")
        listed = [v for v in spec.variants if v.name == name]
        chosen.extend(
            listed
            or expand_variant(name, spec.variant_options.get(name, {}), registry, "--variants")
        )
    if spec.baseline in {variant.label for variant in chosen}:
        return {"variants": tuple(chosen)}
    if overrides.get("with_baseline"):
        baseline = [variant for variant in spec.variants if variant.label == spec.baseline]
        return {"variants": (*baseline, *chosen)}
    return {"variants": tuple(chosen), "baseline": None}
