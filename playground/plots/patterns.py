"""What each variant attends to: its actual attention weights on a short sequence (head 0)
above the mask it used, side by side, and T5's relative position bias per head.

Every variant of the run is rebuilt from its first point's options, shortened to
`PATTERN_LENGTH` tokens (a window narrower than the sequence so the band shows, Linformer's
seq_len cut to fit and k to a quarter of it). All share one vanilla instance's projections
with W_k = W_q and see AR(1) tokens, the "local" inputs of `playground.fidelity`: exact
attention is then visibly local, so a band or a low-rank mix stands out against it.

A variant that cannot return weights but offers `slot_weights(query)` (Linformer: the
probabilities over its k projected slots) is drawn from that; any other says so in its
panel. The mask is where the weights are non-zero (the contract gives masked keys exactly
zero weight; float64 keeps real keys from underflowing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap, PowerNorm
from matplotlib.figure import Figure

from playground.contract import AttentionVariant
from playground.errors import PlaygroundError
from playground.fidelity import LOCAL_SCALE, REFERENCE, copy_reference_weights, local_tokens
from playground.plots.data import Run, format_value
from playground.plots.style import PANEL_SIZE, finish, variant_colour
from playground.registry import Registry, default_registry

PATTERN_LENGTH = 64
MASKED = "#f2f2f2"
MASK_COLOURS = ListedColormap([MASKED, "#303030"])  # masked, seen
WEIGHT_COLOURS = colormaps["viridis"].with_extremes(bad=MASKED)  # NaN: a masked pair


def short_options(options: dict[str, Any], n: int) -> dict[str, Any]:
    """A variant point's options fitted to an n-token picture: windows and Linformer's k
    at most n/4 (so a band or the slots are visible), seq_len exactly n, global tokens
    inside the sequence."""
    fitted = dict(options)
    for name in ("attention_window", "window", "k"):
        if isinstance(fitted.get(name), int):
            fitted[name] = max(2, min(fitted[name], n // 4))
    if isinstance(fitted.get("seq_len"), int):
        fitted["seq_len"] = n
    if isinstance(fitted.get("global_tokens"), (list, tuple)):
        fitted["global_tokens"] = [p for p in fitted["global_tokens"] if p < n]
    return fitted


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
        if module.capabilities.need_weights:
            return module(tokens, need_weights=True).weights[0, 0], "key position j"
        slot_weights: Callable[..., torch.Tensor] | None = getattr(module, "slot_weights", None)
        if slot_weights is not None:
            return slot_weights(tokens)[0, 0], "projected slot (of k)"
    return None, ""


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


def attention_pattern_figure(
    run: Run, registry: Registry | None = None, n: int = PATTERN_LENGTH
) -> Figure:
    """Weights (top) and mask (bottom) of every variant in the run, on n tokens."""
    registry = registry or default_registry()
    first = run.rows[0]
    d_model, num_heads = int(first.get("d_model", 64)), int(first.get("num_heads", 4))
    points: dict[str, dict[str, Any]] = {}
    for row in run.rows:
        points.setdefault(row["variant"], row.get("options") or {})
    torch.manual_seed(int(run.spec.get("seed", 0)))
    reference = registry.build(REFERENCE, d_model, num_heads).double()
    reference.k_proj.load_state_dict(reference.q_proj.state_dict())  # a score is a similarity
    generator = torch.Generator().manual_seed(int(run.spec.get("seed", 0)))
    tokens = LOCAL_SCALE * local_tokens((1, n, d_model), generator).double()

    figure = Figure(
        figsize=(max(2, len(points)) * PANEL_SIZE[0] * 0.62, 2 * PANEL_SIZE[1] * 0.82 + 0.9),
        layout="constrained",
    )
    grid = figure.subplots(2, len(points), squeeze=False)
    figure.suptitle(f"Attention on {n} tokens: weights of head 0 (top) and mask (bottom)")
    notes = []
    for column, (name, original) in enumerate(points.items()):
        top, bottom = grid[0, column], grid[1, column]
        try:
            module, options = _build(registry, name, short_options(original, n), d_model, num_heads)
            module = module.double().eval()
            try:
                copy_reference_weights(reference, module)
            except ValueError as error:
                notes.append(f"{name}: own random weights ({error})")
            weights, columns = _weights(module, tokens)
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
        seen = values > 0
        image = top.imshow(
            np.where(seen, values, np.nan),
            cmap=WEIGHT_COLOURS,
            norm=PowerNorm(0.5, vmin=0, vmax=float(values.max())),
            aspect="auto",
            interpolation="nearest",
        )
        figure.colorbar(image, ax=top, shrink=0.8, label="weight")
        top.set_title(_panel_title(name, options, original), fontsize=9, color=variant_colour(name))
        bottom.imshow(
            seen, cmap=MASK_COLOURS, vmin=0, vmax=1, aspect="auto", interpolation="nearest"
        )
        bottom.set_title(f"mask: {seen.mean():.0%} of pairs seen", fontsize=9)
        for axes in (top, bottom):
            axes.set_xlabel(columns)
            axes.set_ylabel("query position i")
    finish(
        figure,
        run,
        [
            "inputs: AR(1) tokens, W_k = W_q (exact attention is local); "
            "masked pairs are light grey",
            *notes,
        ],
    )
    return figure


def relative_bias_figure(
    run: Run, registry: Registry | None = None, n: int = PATTERN_LENGTH
) -> Figure | None:
    """Per head, the bias a variant with `compute_bias(q_len, k_len)` adds to its logits
    (T5), as initialised; None when no variant of the run has one."""
    registry = registry or default_registry()
    first = run.rows[0]
    d_model, num_heads = int(first.get("d_model", 64)), int(first.get("num_heads", 4))
    for row in run.rows:
        cls = registry.get(row["variant"]) if row["variant"] in registry.names() else None
        if cls is not None and hasattr(cls, "compute_bias"):
            break
    else:
        return None
    torch.manual_seed(int(run.spec.get("seed", 0)))
    module, _ = _build(
        registry, row["variant"], short_options(row.get("options") or {}, n), d_model, num_heads
    )
    with torch.no_grad():
        bias = module.compute_bias(n, n)[0].double().numpy()  # (H, n, n)
    columns = min(4, len(bias))
    lines = -(-len(bias) // columns)
    figure = Figure(figsize=(columns * 3.0 + 1.2, lines * 2.9 + 1.0), layout="constrained")
    grid = figure.subplots(lines, columns, squeeze=False)
    figure.suptitle(
        f"{row['variant']}: relative position bias per head on {n} tokens (as initialised)"
    )
    limit = float(np.abs(bias).max()) or 1.0
    for head, axes in enumerate(grid.flat):
        if head >= len(bias):
            axes.set_visible(False)
            continue
        image = axes.imshow(
            bias[head], cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest"
        )
        axes.set_title(f"head {head}", fontsize=9)
        axes.set_xlabel("key position j")
        axes.set_ylabel("query position i")
    figure.colorbar(image, ax=grid, shrink=0.7, label="bias added to the logit")
    finish(
        figure,
        run,
        [
            "constant along each diagonal j − i; exact buckets near the diagonal, "
            "log-spaced further away (T5 §2.1)"
        ],
    )
    return figure
