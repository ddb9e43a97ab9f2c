"""The model settings a task table may change, the labels rows carry for them, and the
network they build: what the spec, the accuracy measurement and re-evaluation agree on."""

from __future__ import annotations

import typing
from typing import Any

from playground.errors import UnsupportedFeature
from playground.hf.language_model import LlamaLanguageModel
from playground.model.transformer import ModelConfig, PositionalEncodingName, TransformerClassifier
from playground.registry import Registry

MODEL_DEFAULTS = {"d_model": 64, "num_heads": 4, "num_layers": 2}
"""The model a task trains on unless its table says otherwise."""


CURRICULUM_TAG = "curriculum"
"""Appended to the label of every task scored after a curriculum: the same task trained
alone is another cell."""


POSITIONAL_ENCODINGS: tuple[str, ...] = typing.get_args(PositionalEncodingName)
"""The model's own positions (ModelConfig.positional_encoding); "none" is NoPE."""


def settings_label(
    *, positional_encoding: str = "auto", architecture: str = "playground", **shape: int
) -> str:
    """Each model setting that is not the default, e.g. `d_model=128 positional_encoding=none`
    ("" when all are)."""
    changed = [
        f"{k}={shape[k]}"
        for k in MODEL_DEFAULTS
        if shape.get(k, MODEL_DEFAULTS[k]) != MODEL_DEFAULTS[k]
    ]
    if positional_encoding != "auto":
        changed.append(f"positional_encoding={positional_encoding}")
    if architecture != "playground":
        changed.append(f"architecture={architecture}")
    return " ".join(changed)


def training_label(
    task_label: str,
    *,
    curriculum: bool = False,
    positional_encoding: str = "auto",
    architecture: str = "playground",
    grid: dict[str, Any] | None = None,
    **shape: int,
) -> str:
    """The task's label, with each model setting that is not the default appended
    (`mqar(seq_len=128, num_pairs=8) d_model=128`), CURRICULUM_TAG when the model was
    trained on a curriculum, and last the point of a sweep (`grid_tag`): one task trained
    at several widths, positions or learning rates, or alone and after a curriculum, is
    several cells. A setting the grid sweeps is named by the grid alone."""
    swept = grid or {}
    settings = settings_label(
        positional_encoding="auto" if "positional_encoding" in swept else positional_encoding,
        architecture="playground" if "architecture" in swept else architecture,
        **{key: value for key, value in shape.items() if key not in swept},
    )
    return " ".join(
        part
        for part in (task_label, settings, CURRICULUM_TAG if curriculum else "", grid_tag(swept))
        if part
    )


def sweep_label(label: str, grid: dict[str, Any]) -> str:
    """The label every point of a sweep shares: `label` less its grid tag ("" outside a
    sweep)."""
    return label.removesuffix(grid_tag(grid)).strip() if grid else ""


def grid_tag(grid: dict[str, Any]) -> str:
    """A sweep's point as its cells' labels end with it: `learning_rate=0.001
    weight_decay=0.1` ("" outside a sweep)."""
    return " ".join(f"{key}={value}" for key, value in grid.items())


def build_model(config: ModelConfig, registry: Registry) -> TransformerClassifier:
    """The network `config.architecture` names, around `config.variant` from `registry`:
    the playground's TransformerClassifier, or a transformers Llama with the variant
    swapped in (which needs the `hf` extra). The Llama answers the calls training,
    scoring and sampling make of a TransformerClassifier (forward with positions,
    prefill, decode_step, config, attentions), so it is typed as one."""
    if config.architecture == "hf_llama":
        llama = LlamaLanguageModel(config, registry.get(config.variant))
        return typing.cast(TransformerClassifier, llama)
    return TransformerClassifier(config, registry)


def refuse_beyond_limit(model: TransformerClassifier, length: int) -> None:
    """UnsupportedFeature when `length` is past the `max_seq_len` the model's attention
    declares: scoring a trained model there would be outside its contract."""
    attention = model.attentions[0]
    caps = attention.capabilities_for(attention.config)
    if caps.max_seq_len is not None and length > caps.max_seq_len:
        raise UnsupportedFeature(
            model.config.variant,
            f"sequences of {length} tokens (its limit is {caps.max_seq_len})",
            caps.max_seq_len_hint,
        )
