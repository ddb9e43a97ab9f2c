"""The attention-pattern figure's mask panel draws the mask, not the weights (issue 42): a
weight that underflowed to exactly 0 is a pair the variant may see."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import playground
from playground.registry import Registry, VariantEntry
from playground.report.plots import load_run
from playground.report.plots.patterns import attention_pattern_figure
from tests.report.test_plots import measurement, write_run

Vanilla = playground.get_variant("vanilla")


class SteepPenalty(playground.SoftmaxAttention):
    """No mask_mod: a distance penalty so steep that far keys' weights underflow to 0."""

    name, summary, paper = "steep_penalty", "softmax, −40 per step of distance", "-"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score - 40.0 * (q_idx - kv_idx).abs()


class WindowedSteepPenalty(SteepPenalty):
    """The same penalty inside a declared window of ±8: the mask is the window."""

    name = "windowed_steep_penalty"

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= 8


class SharpScores(Vanilla):
    """Not a SoftmaxAttention: scores so sharp that most weights underflow to 0."""

    name = "sharp_scores"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        return super().forward_reference(
            1e4 * query, key, value, attention_mask, is_causal, need_weights
        )


def _panels(tmp_path: Path, *classes: type) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """{variant: (mask title, drawn weights, drawn mask)} of a run of those variants."""
    registry = Registry.discover(entry_points=False)
    for cls in classes:
        registry.variants[cls.name] = VariantEntry(cls, __file__)
    rows = [measurement(cls.name, cls.name, 64, "forward") for cls in classes]
    figure = attention_pattern_figure(load_run(write_run(tmp_path / "run", rows)), registry)
    axes = [a for a in figure.axes if a.images and a.get_title()]
    tops = {a.get_title().split("\n")[0]: a for a in axes if not a.get_title().startswith("mask")}
    bottoms = [a for a in axes if a.get_title().startswith("mask")]
    return {
        name: (bottom.get_title(), top.images[0].get_array(), bottom.images[0].get_array())
        for (name, top), bottom in zip(tops.items(), bottoms, strict=True)
    }


def test_a_mod_without_mask_mod_has_no_mask_though_weights_underflow(tmp_path):
    """The issue's case: no mask_mod, yet "mask: 84 % of pairs seen" (here 30 %)."""
    title, weights, mask = _panels(tmp_path, SteepPenalty)["steep_penalty"]
    assert title == "mask (mask_mod): all pairs seen"
    assert np.asarray(mask).all()
    drawn = np.ma.getdata(weights)
    assert (drawn == 0).mean() > 0.5  # the weights did underflow ...
    assert not np.isnan(drawn).any()  # ... and are drawn as 0, not greyed out as masked


def test_a_declared_mask_mod_is_the_mask(tmp_path):
    title, _, mask = _panels(tmp_path, WindowedSteepPenalty)["windowed_steep_penalty"]
    offsets = np.subtract.outer(np.arange(64), np.arange(64))
    assert np.array_equal(np.asarray(mask, dtype=bool), np.abs(offsets) <= 8)
    assert title == f"mask (mask_mod): {(np.abs(offsets) <= 8).mean():.0%} of pairs seen"


@pytest.mark.parametrize("name", ["sliding_window", "longformer"])
def test_shipped_windows_keep_their_masks(tmp_path, name):
    """A window (a mask_mod, or a variant's own window) is still drawn as a mask."""
    registry = Registry.discover(entry_points=False)
    rows = [measurement(name, name, 64, "forward")]
    figure = attention_pattern_figure(load_run(write_run(tmp_path / "run", rows)), registry)
    mask = next(a for a in figure.axes if a.get_title().startswith("mask"))
    assert 0.1 < np.asarray(mask.images[0].get_array(), dtype=bool).mean() < 0.6
    assert "all pairs" not in mask.get_title()


def test_any_variant_whose_weights_underflow_has_no_mask(tmp_path):
    """Not a SoftmaxAttention: its mask is what it gives weight on inputs without content
    (every key alike), where nothing underflows, as well as on the drawn ones."""
    title, weights, mask = _panels(tmp_path, SharpScores)["sharp_scores"]
    assert title == "mask (weight on 2 inputs): all pairs seen"
    assert np.asarray(mask).all()
    assert (np.ma.getdata(weights) == 0).mean() > 0.5


def test_relative_bias_has_a_colour_scale_per_head(tmp_path):
    """Issue 42: one colour bar per row left ALiBi's gentle heads blank beside its steep
    one; each head now has its own scale and bar."""
    from playground.report.plots.patterns import relative_bias_figure

    registry = Registry.discover(entry_points=False)
    rows = [measurement(v, v, 64, "forward", num_heads=8) for v in ("alibi", "t5_relative")]
    figure = relative_bias_figure(load_run(write_run(tmp_path / "run", rows)), registry)
    panels = [axes for axes in figure.axes if axes.get_title()]
    assert len(panels) == 8  # 4 heads of each
    for axes in panels:
        [image] = axes.images
        assert image.colorbar is not None, axes.get_title()
        drawn = np.abs(np.asarray(image.get_array())).max()
        assert image.norm.vmax == pytest.approx(drawn) and image.norm.vmin == -image.norm.vmax
    alibi = [a.images[0].norm.vmax for a in panels if a.get_title().startswith("alibi")]
    assert max(alibi) > 50 * min(alibi)  # a slope per head: scales orders of magnitude apart
