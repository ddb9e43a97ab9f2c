"""A swapped model saved with `save_pretrained` and loaded again with `from_pretrained`.

`save_pretrained` writes a swapped model's attention weights under the swapped modules'
names (`model.layers.0.self_attn.variant.q_proj.weight`). The class `from_pretrained`
builds has HF's own attention there: it loads every other weight, starts the attention
new and lists both sets of names in its load report. So `swap_attention` records the swap
in the model's config (`playground_swap`: the variant and the options the user gave,
written to config.json), and when it is called on a model loaded from a checkpoint that
carries the record, it swaps in the same variant and then loads the swapped modules'
weights from the checkpoint's directory: `from_pretrained` then `swap_attention` gives
the model that was saved. Another variant or other options are refused, as is a
checkpoint that is not a local directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from playground.errors import InvalidInput

RECORD = "playground_swap"
"""The config attribute (and config.json key) that records a swap."""


def record_swap(config: Any, variant: str, options: dict[str, Any]) -> None:
    """Write the swap into the model's config; options that JSON cannot hold are recorded
    as None (the user must give them again)."""
    try:
        recorded: dict[str, Any] | None = json.loads(json.dumps(options))
    except (TypeError, ValueError):
        recorded = None
    setattr(config, RECORD, {"variant": variant, "options": recorded})


def saved_swap(model: nn.Module) -> tuple[str, dict[str, Any]] | None:
    """(checkpoint, record) when `model` was loaded from a checkpoint of a swapped model
    (its config carries the record and names where it came from), else None."""
    config = getattr(model, "config", None)
    record = getattr(config, RECORD, None)
    checkpoint = str(getattr(config, "_name_or_path", "") or "")
    return (checkpoint, record) if isinstance(record, dict) and checkpoint else None


def saved_options(
    checkpoint: str, record: dict[str, Any], variant: str, options: dict[str, Any]
) -> dict[str, Any]:
    """The options to swap with: those recorded, which `options` (the user's) must equal
    when given; refused for another variant."""
    saved_variant, saved = record.get("variant"), record.get("options")
    again = (
        f"this model was loaded from {checkpoint!r}, saved with {saved_variant!r} swapped in "
        f"(config.{RECORD}); its attention weights are that variant's, which from_pretrained "
        "could not load (they are new)"
    )
    if saved_variant != variant:
        raise InvalidInput(
            f"{again}: swap in {saved_variant!r}, with the options it was saved with, to load "
            f"them, not {variant!r}; to put {variant!r} in its place, swap it into a model "
            "loaded from an unswapped checkpoint"
        )
    if saved is None and not options:
        raise InvalidInput(
            f"{again}: its options could not be recorded (not JSON); give them again: "
            f"swap_attention(model, {variant!r}, **options)"
        )
    if options and saved is not None and json.loads(json.dumps(options)) != saved:
        raise InvalidInput(
            f"{again}: it was swapped with options {saved}, not {options}; swap it with those "
            "(or none: the recorded ones are used)"
        )
    return dict(options) if options else dict(saved or {})


def load_swapped_weights(
    model: nn.Module, swapped: Mapping[str, nn.Module], checkpoint: str
) -> None:
    """Load each swapped module's parameters and buffers ({path in model: module}) from the
    safetensors files of the `checkpoint` directory, as `save_pretrained` wrote them."""
    from transformers.modeling_utils import load_state_dict

    files = sorted(Path(checkpoint).glob("*.safetensors")) if Path(checkpoint).is_dir() else []
    if not files:
        raise InvalidInput(
            f"the swapped attention's weights of this model are in its checkpoint "
            f"{checkpoint!r}, which is not a local directory of *.safetensors files; download "
            "it (huggingface_hub.snapshot_download) and load the model from that directory"
        )
    saved: dict[str, Any] = {}
    for file in files:
        saved.update(load_state_dict(str(file)))
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    for path, module in swapped.items():
        found, missing = {}, []
        for key in module.state_dict():
            # The checkpoint may be of the model with its head and this the base, or back.
            names = (f"{path}.{key}", f"{prefix}{path}.{key}", f"{path}.{key}".removeprefix(prefix))
            name = next((n for n in names if n in saved), None)
            if name is None:
                missing.append(f"{path}.{key}")
            else:
                found[key] = saved[name]
        if missing:
            raise InvalidInput(
                f"the checkpoint {checkpoint!r} lacks {', '.join(missing[:4])}: it was saved "
                "with another variant or other options than its config records"
            )
        module.load_state_dict(found)
