"""What each variant attends to: its actual attention weights on a short sequence (head 0)
above the mask it used, side by side, and T5's relative position bias per head.

Every variant of the run is rebuilt from its first point's options as fitted to a
`PATTERN_LENGTH`-token picture by its `picture_options` hook (a window narrower than the
picture, so the band shows). All share the projections of one exact attention instance
(`ExactAttention`) with W_k = W_q and see AR(1) tokens, the "local" inputs of
`playground.run.fidelity`: exact attention is then visibly local, so a band or a low-rank mix
stands out against it.

A variant that cannot return weights is drawn from its `pattern_weights` hook when it
has one (probabilities over projected slots, say); any other says so in its panel. The
bias figure draws the `logit_bias` of the first variant of the run that has one.

The mask panel draws the mask, not the weights: a weight that underflowed to exactly 0 is
a pair the variant may see. A `SoftmaxAttention`'s mask is its `mask_mod`; any other
variant's is the pairs it gives weight on inputs without content (every token zero, so
every key looks alike and only positions tell them apart) or on the drawn inputs: the
contract gives a masked pair exactly zero weight whatever the inputs.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colorbar import Colorbar
from matplotlib.colors import ListedColormap, Normalize, PowerNorm
from matplotlib.figure import Figure

from playground.contract import AttentionVariant
from playground.errors import PlaygroundError
from playground.hook_calls import checked_logit_bias, checked_options_hook, checked_pattern_weights
from playground.mods.grid import index_grid
from playground.registry import Registry, default_registry
from playground.report.plots.data import RunData, declared, format_value
from playground.report.plots.style import PANEL_SIZE, finish, readable, variant_colour
from playground.run.fidelity import LOCAL_SCALE, copy_reference_weights, local_tokens
from playground.softmax_attention import ExactAttention, SoftmaxAttention

PATTERN_LENGTH = 64
MASKED = "#f2f2f2"
MASK_COLOURS = ListedColormap([MASKED, "#303030"])  # masked, seen
WEIGHT_COLOURS = colormaps["viridis"].with_extremes(bad=MASKED)  # NaN: a masked pair
SIGNED_COLOURS = colormaps["RdBu_r"].with_extremes(bad=MASKED)
PANELS_PER_ROW = 7
"""Variants per row of the patterns figure; more wrap onto further rows."""


def _build(
    registry: Registry, name: str, options: dict[str, Any], d_model: int, num_heads: int
) -> tuple[AttentionVariant, dict[str, Any]]:
    """The variant with its shortened options, or its defaults if those are refused."""
    try:
        return registry.build(name, d_model, num_heads, **options), options
    except PlaygroundError:
        return registry.build(name, d_model, num_heads), {}


def _weights(module: AttentionVariant, tokens: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """(Nq, Nk or k) weights of batch 0, head 0, and what the columns are."""
    with torch.no_grad():
        if module.capabilities_for(module.config).need_weights:
            return module(tokens, need_weights=True).weights[0, 0], "key position j"
        drawn = checked_pattern_weights(module, tokens)
        if drawn is not None:
            return drawn[0][0, 0], drawn[1]
    return None, ""


def _allowed(
    module: AttentionVariant, tokens: torch.Tensor, weights: torch.Tensor
) -> tuple[np.ndarray, str]:
    """(Nq, columns) bool, True where head 0 of batch 0 may see a column, and where that
    comes from (the panel's title). Never `weights != 0` alone: weights underflow to 0."""
    n_q, n_k = weights.shape
    if isinstance(module, SoftmaxAttention) and n_k == tokens.shape[1]:
        grid = index_grid(1, module.num_heads, torch.arange(n_q), torch.arange(n_k))
        with torch.no_grad():
            allowed = torch.as_tensor(module.mask_mod(*grid), dtype=torch.bool)
        return allowed.broadcast_to(1, module.num_heads, n_q, n_k)[0, 0].numpy(), "mask_mod"
    without_content, _ = _weights(module, torch.zeros_like(tokens))
    seen = weights != 0
    if without_content is not None and without_content.shape == weights.shape:
        seen |= without_content != 0
    return seen.numpy(), "weight on 2 inputs"


def _mask_title(allowed: np.ndarray, source: str) -> str:
    share = "all" if allowed.all() else f"{allowed.mean():.0%} of"
    return f"mask ({source}): {share} pairs seen"


def _panel_title(name: str, options: dict[str, Any], original: dict[str, Any]) -> str:
    changed = [
        f"{key}={format_value(value)}"
        + (f" (run: {format_value(original[key])})" if original.get(key) != value else "")
        for key, value in options.items()
        if key in original
    ]
    return name + ("\n" + "\n".join(changed) if changed else "")


def _message(axes: Axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=8)
    axes.set_xticks([])
    axes.set_yticks([])


def _position_axes(axes: Axes, shape: tuple[int, ...], columns: str, first_column: bool) -> None:
    """Ticks at the ends and middle of a (queries, columns) picture; the query label only
    on the first column of panels (every panel shares it). Fixed ticks: a tick locator
    per axes makes the layout of dozens of panels take seconds."""
    rows, cols = shape
    axes.set_xticks([0, cols // 2, cols - 1])
    axes.set_yticks([0, rows // 2, rows - 1])
    axes.tick_params(labelsize=7)
    axes.set_xlabel(columns, fontsize=8)
    if first_column:
        axes.set_ylabel("query position i", fontsize=8)


def _bar_ticks(bar: Colorbar, low: float, high: float, count: int) -> None:
    """`count` fixed, evenly spaced ticks on a colour bar (its own locator costs seconds
    over dozens of bars)."""
    ticks = np.linspace(low, high, count).tolist()
    bar.set_ticks(ticks, labels=[f"{tick:.2g}" for tick in ticks])
    bar.ax.tick_params(labelsize=7)


def attention_pattern_figure(
    run: RunData, registry: Registry | None = None, n: int = PATTERN_LENGTH
) -> Figure:
    """Weights (top) and mask (bottom) of every variant in the run, on n tokens."""
    registry = registry or default_registry()
    first = run.rows[0]
    d_model, num_heads = int(first.get("d_model", 64)), int(first.get("num_heads", 4))
    points: dict[str, dict[str, Any]] = {}
    for row in run.rows:
        points.setdefault(row["variant"], row.get("options") or {})
    torch.manual_seed(int(run.spec.get("seed", 0)))
    reference = ExactAttention(d_model, num_heads).double()
    reference.k_proj.load_state_dict(reference.q_proj.state_dict())  # a score is a similarity
    generator = torch.Generator().manual_seed(int(run.spec.get("seed", 0)))
    tokens = LOCAL_SCALE * local_tokens((1, n, d_model), generator).double()

    per_row = min(len(points), PANELS_PER_ROW)
    rows = -(-len(points) // per_row)
    figure = Figure(
        figsize=(
            max(2, per_row) * PANEL_SIZE[0] * 0.62,
            rows * (2 * PANEL_SIZE[1] * 0.82) + 0.9,
        ),
        layout="constrained",
    )
    grid = figure.subplots(2 * rows, per_row, squeeze=False)
    for unused in range(len(points), rows * per_row):
        grid_row, column = divmod(unused, per_row)
        for axes in grid[2 * grid_row : 2 * grid_row + 2, column]:
            axes.set_visible(False)
    figure.suptitle(f"Attention on {n} tokens: weights of head 0 (top) and mask (bottom)")
    notes = []
    for index, (name, original) in enumerate(points.items()):
        grid_row, column = divmod(index, per_row)
        top, bottom = grid[2 * grid_row, column], grid[2 * grid_row + 1, column]
        try:
            fitted = checked_options_hook(registry.get(name), "picture_options", original, n)
            module, options = _build(registry, name, fitted, d_model, num_heads)
            module = module.double().eval()
            try:
                copy_reference_weights(reference, module)
            except ValueError as error:
                notes.append(f"{name}: own random weights ({error})")
            weights, columns = _weights(module, tokens)
            if weights is not None:
                seen, mask_source = _allowed(module, tokens, weights)
        except Exception as error:  # one variant's failure must not lose the others
            _message(top, f"{name}\ncould not be drawn:\n{type(error).__name__}: {error}"[:300])
            bottom.set_visible(False)
            notes.append(f"{name}: {type(error).__name__}: {error}")
            continue
        if weights is None:
            _message(top, f"{name}\nreturns no attention weights\n(need_weights unsupported)")
            bottom.set_visible(False)
            continue
        values = weights.numpy()
        if values.min() < 0:  # signed weights (differential attention): diverging, at 0
            limit = float(np.abs(values).max())
            colours, norm = SIGNED_COLOURS, Normalize(vmin=-limit, vmax=limit)
        else:
            colours, norm = WEIGHT_COLOURS, PowerNorm(0.5, vmin=0, vmax=float(values.max()))
        image = top.imshow(
            np.where(seen, values, np.nan),
            cmap=colours,
            norm=norm,
            aspect="auto",
            interpolation="nearest",
        )
        bar = figure.colorbar(image, ax=top, shrink=0.8, label="weight")
        low, high = image.get_clim()  # the norm's limits
        _bar_ticks(bar, low, high, 3)
        title = _panel_title(declared(name, "display_name") or name, options, original)
        top.set_title(title, fontsize=9, color=readable(variant_colour(name)))
        bottom.imshow(
            seen, cmap=MASK_COLOURS, vmin=0, vmax=1, aspect="auto", interpolation="nearest"
        )
        bottom.set_title(_mask_title(seen, mask_source), fontsize=9)
        for axes in (top, bottom):
            _position_axes(axes, values.shape, columns, first_column=column == 0)
    finish(
        figure,
        run,
        [
            "inputs: AR(1) tokens, W_k = W_q (exact attention is local); "
            "masked pairs are light grey",
            "mask: a SoftmaxAttention's mask_mod, else the pairs given weight on these "
            "inputs or on all-zero ones (a weight that underflows to 0 is not masked)",
            *notes,
        ],
    )
    return figure


BIAS_HEADS = 4
"""Heads drawn per variant in the bias figure, spread evenly over its heads."""


def relative_bias_figure(
    run: RunData, registry: Registry | None = None, n: int = PATTERN_LENGTH
) -> Figure | None:
    """Per variant of the run whose `logit_bias` hook gives one, the bias it adds to its
    scores by position alone, as initialised, for a few heads; None when none does."""
    registry = registry or default_registry()
    first = run.rows[0]
    d_model, num_heads = int(first.get("d_model", 64)), int(first.get("num_heads", 4))
    points: dict[str, dict[str, Any]] = {}
    for row in run.rows:
        if row["variant"] in registry.names():
            points.setdefault(row["variant"], row.get("options") or {})
    biases: dict[str, np.ndarray] = {}
    notes = []
    for name, original in points.items():
        torch.manual_seed(int(run.spec.get("seed", 0)))
        try:
            fitted = checked_options_hook(registry.get(name), "picture_options", original, n)
            module, _ = _build(registry, name, fitted, d_model, num_heads)
            with torch.no_grad():
                bias = checked_logit_bias(module, n, n)
            if bias is not None and not torch.isfinite(bias).all():
                raise ValueError("its logit_bias has non-finite values")
        except Exception as error:  # one variant's failure must not lose the others
            notes.append(f"{name} not drawn: {type(error).__name__}: {error}"[:300])
            continue
        if bias is not None:
            biases[name] = bias[0].double().numpy()  # (H, n, n)
    if not biases:
        if notes:  # only failures: say so rather than leave the figure out in silence
            warnings.warn("relative bias figure not drawn: " + "; ".join(notes), stacklevel=2)
        return None
    columns = min(BIAS_HEADS, num_heads)
    heads = np.linspace(0, num_heads - 1, columns).round().astype(int)
    figure = Figure(figsize=(columns * 3.7 + 0.6, len(biases) * 2.9 + 1.0), layout="constrained")
    grid = figure.subplots(len(biases), columns, squeeze=False)
    figure.suptitle(f"Bias added to the scores by position, on {n} tokens (as initialised)")
    for line, (name, head_biases) in zip(grid, biases.items(), strict=True):
        for index, (axes, head) in enumerate(zip(line, heads, strict=True)):
            # Each head its own scale: heads' biases differ by orders of magnitude (a
            # slope per head), and one scale per row leaves the gentle heads blank.
            limit = float(np.abs(head_biases[head]).max()) or 1.0
            # aspect="auto": a fixed (equal) aspect defeats the constrained layout, which
            # then lets a row's axis labels run into the next row's titles.
            image = axes.imshow(
                head_biases[head],
                cmap="RdBu_r",
                vmin=-limit,
                vmax=limit,
                interpolation="nearest",
                aspect="auto",
            )
            axes.set_title(f"{name}, head {head}", fontsize=9, color=readable(variant_colour(name)))
            _position_axes(axes, head_biases[head].shape, "key position j", first_column=index == 0)
            bar = figure.colorbar(image, ax=axes, shrink=0.8, pad=0.02)
            _bar_ticks(bar, -limit, limit, 5)
            if index == len(heads) - 1:
                bar.set_label("bias", fontsize=8)
    finish(figure, run, ["each variant's `logit_bias`; each head its own colour scale", *notes])
    return figure
