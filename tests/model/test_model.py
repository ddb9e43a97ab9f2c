"""The tiny Transformer: builds with every registered variant, shares what the papers
share (the very same Parameter objects), makes [CLS] global for Longformer, and refuses
what a variant cannot do."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from playground.errors import ConfigError, UnsupportedFeature
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry
from playground.run.jobs import check_task_support
from playground.tasks.positional import Lookback


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight a busy machine for two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(variant: str, **changes: Any) -> ModelConfig:
    settings: dict[str, Any] = dict(
        vocab_size=12,
        num_classes=5,
        max_seq_len=16,
        variant=variant,
        d_model=16,
        num_heads=2,
        num_layers=3,
    )
    settings.update(changes)
    return ModelConfig(**settings)


def test_builds_and_runs_with_every_registered_variant(bundled_registry: Registry) -> None:
    tokens = torch.randint(1, 12, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 10:] = False
    for variant in bundled_registry.names():
        per_token = TransformerClassifier(_config(variant), bundled_registry)
        assert per_token(tokens).shape == (2, 16, 5), variant
        sequence = TransformerClassifier(_config(variant, target="sequence"), bundled_registry)
        padded = bundled_registry.get(variant).capabilities.padding_mask
        logits = sequence(tokens, mask if padded else None)
        assert logits.shape == (2, 5) and torch.isfinite(logits).all(), variant


def test_padding_changes_nothing_for_real_tokens(bundled_registry: Registry) -> None:
    torch.manual_seed(0)
    model = TransformerClassifier(_config("vanilla"), bundled_registry).eval()
    tokens = torch.randint(1, 12, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.bool)
    mask[0, 12:] = False
    changed = tokens.clone()
    changed[0, 12:] = 0
    assert torch.allclose(model(tokens, mask)[0, :12], model(changed, mask)[0, :12], atol=1e-6)
    assert not torch.allclose(model(tokens)[0, :12], model(changed)[0, :12], atol=1e-4)


def test_t5_bias_table_is_one_parameter_for_all_layers(bundled_registry: Registry) -> None:
    model = TransformerClassifier(_config("t5_relative"), bundled_registry)
    tables = [a.relative_attention_bias.weight for a in model.attentions]
    assert all(table is tables[0] for table in tables)
    assert model.shared == ["relative_bias"]
    assert model.positional_encoding is None  # the relative bias replaces the sinusoids
    named = [n for n, _ in model.named_parameters() if "relative_attention_bias" in n]
    assert len(named) == 1  # counted (and optimised) once


def test_t5_bias_is_not_shared_when_asked_not_to(bundled_registry: Registry) -> None:
    model = TransformerClassifier(
        _config("t5_relative", share_across_layers=False), bundled_registry
    )
    first, second = (a.relative_attention_bias.weight for a in model.attentions[:2])
    assert first is not second


def test_linformer_layerwise_sharing_shares_one_projection(bundled_registry: Registry) -> None:
    layerwise = TransformerClassifier(
        _config("linformer", variant_options={"k": 4, "sharing": "layerwise"}), bundled_registry
    )
    projections = [(a.E, a.F) for a in layerwise.attentions]
    assert all(E is projections[0][0] and F is projections[0][0] for E, F in projections)
    assert layerwise.shared == ["projections"]
    headwise = TransformerClassifier(
        _config("linformer", variant_options={"k": 4}), bundled_registry
    )
    assert headwise.attentions[0].E is not headwise.attentions[1].E
    assert headwise.shared == []


def test_linformer_seq_len_follows_the_task_unless_set(bundled_registry: Registry) -> None:
    model = TransformerClassifier(_config("linformer", variant_options={"k": 4}), bundled_registry)
    assert model.attentions[0].config.seq_len == 16
    with pytest.raises(UnsupportedFeature, match="seq_len"):
        TransformerClassifier(
            _config("linformer", variant_options={"k": 4, "seq_len": 8}), bundled_registry
        )


def test_sinusoids_are_on_for_variants_without_their_own_positions(
    bundled_registry: Registry,
) -> None:
    assert TransformerClassifier(_config("vanilla"), bundled_registry).positional_encoding
    forced = TransformerClassifier(
        _config("t5_relative", positional_encoding="sinusoidal"), bundled_registry
    )
    assert forced.positional_encoding is not None


def test_longformer_makes_the_classification_token_global(bundled_registry: Registry) -> None:
    model = TransformerClassifier(
        _config("longformer", target="sequence", variant_options={"attention_window": 2}),
        bundled_registry,
    )
    seen: list[torch.Tensor | None] = []

    def spy(module, args, kwargs):
        seen.append(kwargs.get("global_attention_mask"))

    for attention in model.attentions:
        attention.register_forward_pre_hook(spy, with_kwargs=True)
    model(torch.randint(1, 12, (2, 16)))
    assert len(seen) == 3
    for mask in seen:
        assert mask is not None and mask[:, 0].all() and not mask[:, 1:].any()
    # With a window of 1 each side, [CLS] reaches token 15 only because it is global.
    tokens = torch.randint(1, 12, (1, 16))
    changed = tokens.clone()
    changed[0, 15] = (changed[0, 15] % 11) + 1
    assert not torch.allclose(model(tokens), model(changed))
    per_token = TransformerClassifier(_config("longformer"), bundled_registry)
    assert not per_token.global_first_token  # only sequence classification asks for it


def test_a_task_needing_what_a_variant_lacks_is_unsupported(
    bundled_registry: Registry,
) -> None:
    class CausalLookback(Lookback):
        name = "causal_lookback"
        needs_causal = True

    check_task_support(bundled_registry, "vanilla", {}, CausalLookback())
    with pytest.raises(UnsupportedFeature, match="causal"):
        check_task_support(bundled_registry, "linformer", {}, CausalLookback())


def test_a_causal_model_never_looks_ahead():
    config = ModelConfig(
        vocab_size=16, num_classes=4, max_seq_len=12, variant="vanilla", causal=True
    )
    model = TransformerClassifier(config, Registry.discover(entry_points=False)).eval()
    tokens = torch.randint(1, 16, (2, 12))
    changed = tokens.clone()
    changed[:, 7:] = torch.randint(1, 16, (2, 5))
    assert torch.equal(model(tokens)[:, :7], model(changed)[:, :7])
    assert not torch.equal(model(tokens)[:, 7:], model(changed)[:, 7:])


def test_causal_mqar_is_unsupported_for_a_variant_without_causal_attention():
    from playground.run.accuracy import measure_accuracy
    from playground.run.jobs import AccuracyJob

    with pytest.raises(UnsupportedFeature, match="causal"):
        measure_accuracy(
            Registry.discover(entry_points=False),
            AccuracyJob("linformer", {}, "mqar", {"causal": True}),
        )


RESEARCHER_PLUGIN = """
    import torch
    import playground

    class TableAttention(playground.SoftmaxAttention):
        name, summary, paper = "table_attention", "a learned bias per distance", "-"
        additive_score_mod = True

        def __init__(self, d_model=512, num_heads=8, **options):
            super().__init__(d_model, num_heads, **options)
            self.distance_bias = torch.nn.Parameter(torch.zeros(64))

        def score_mod(self, score, b, h, q_idx, kv_idx):
            return score + self.distance_bias[(q_idx - kv_idx).abs().clamp(max=63)]

        def share_with_first_layer(self, first):
            self.distance_bias = first.distance_bias
            return ("distance_table",)

        def global_token_arguments(self, is_global):
            return {}

    @playground.hookimpl
    def register_attention(register):
        register(TableAttention)
"""


def test_a_researchers_variant_shares_state_through_the_hook_like_a_shipped_one(write_plugin):
    """Names of the researcher's own choosing: the model calls the declared hook, so the
    three layers hold one and the same Parameter, as T5's do."""
    path = write_plugin("table_attention.py", RESEARCHER_PLUGIN)
    registry = Registry.discover([path.parent], entry_points=False)
    assert not registry.errors, registry.errors
    model = TransformerClassifier(_config("table_attention"), registry)
    assert model.shared == ["distance_table"]
    tables = {id(attention.distance_bias) for attention in model.attentions}
    assert len(tables) == 1
    model(torch.randint(0, 12, (2, 16))).sum().backward()
    assert model.attentions[0].distance_bias.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", ["vanilla", "t5_relative", "longformer"])
def test_logits_of_selected_positions_are_the_full_outputs_there(variant):
    """Training asks only for the scored positions' logits (the last feed-forward sublayer
    then runs on those rows only): values and gradients are the full computation's."""
    registry = Registry.discover(entry_points=False)
    config = ModelConfig(
        vocab_size=20, num_classes=7, max_seq_len=24, variant=variant, num_layers=2,
        d_model=32, num_heads=4, causal=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = TransformerClassifier(config, registry)
    tokens = torch.randint(0, 20, (3, 24))
    positions = torch.rand(3, 24) < 0.2
    positions[1] = False  # a sequence with nothing scored
    full = model(tokens)
    selected = model(tokens, positions=positions)
    assert selected.shape == (int(positions.sum()), 7)
    assert torch.allclose(selected, full[positions], atol=1e-6, rtol=0)
    weights = torch.randn_like(selected)
    parameters = list(model.parameters())  # Longformer's global projections go unused
    grads_full = torch.autograd.grad(
        (full[positions] * weights).sum(), parameters, allow_unused=True
    )
    grads_sel = torch.autograd.grad((selected * weights).sum(), parameters, allow_unused=True)
    for a, b in zip(grads_full, grads_sel, strict=True):
        assert (a is None) == (b is None)
        assert a is None or torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_positions_are_refused_for_a_sequence_target():
    registry = Registry.discover(entry_points=False)
    config = ModelConfig(
        vocab_size=20, num_classes=3, max_seq_len=8, variant="vanilla", target="sequence"
    )
    model = TransformerClassifier(config, registry)
    token_model = TransformerClassifier(dataclasses.replace(config, target="token"), registry)
    with pytest.raises(ConfigError, match="bool mask shaped like tokens"):
        token_model(
            torch.zeros(2, 8, dtype=torch.long), positions=torch.ones(2, 7, dtype=torch.bool)
        )
    with pytest.raises(ConfigError, match="token target"):
        model(torch.zeros(2, 8, dtype=torch.long), positions=torch.ones(2, 8, dtype=torch.bool))
