"""Figures from small synthetic run directories: every figure is written and carries what
it should (failed cells as markers, one colour per variant), and a run with no rows is a
clear PlotError. Also Linformer's slot_weights, which the pattern figure draws."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from einops import rearrange
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from playground.registry import Registry
from playground.report.plots import PlotError, draw_figures, load_run, plot_run, variant_colour
from playground.report.plots.style import STATUS_MARKERS

D_MODEL, HEADS = 32, 4
SPEC = 'name = "synthetic"\ndescription = "made up"\nseed = 0\n'


def measurement(label: str, variant: str, n: int, pass_name: str, **fields: Any) -> dict:
    options = fields.pop("options", {})
    row = {
        "cell": f"{label}|n={n}|{pass_name}",
        "variant": variant,
        "label": label,
        "options": options,
        "seq_len": n,
        "batch_size": 1,
        "d_model": D_MODEL,
        "num_heads": HEADS,
        "device": "cpu",
        "dtype": "float32",
        "pass": pass_name,
        "status": "ok",
        "error": None,
        "flops": 1e9 * n,
        "time_ms": 1e-3 * n**2 if variant == "vanilla" else 0.05 * n,
        "time_iqr_ms": 0.1,
        "efficiency": 0.5,
        "peak_memory_bytes": 1000 * n**2 if variant == "vanilla" else 4000 * n,
        "wall_s": 0.1,
    }
    if pass_name == "forward":
        error = 0.0 if variant == "vanilla" else 10 / options.get("k", 64)
        row.update(
            fidelity_rel_error=error,
            fidelity_cosine=1 - error / 2,
            fidelity_local_rel_error=error / 3,
            fidelity_local_cosine=1 - error / 6,
            fidelity_local_attention_distance=3.0,
        )
    row.update(fields)
    return row


def failed(label: str, variant: str, n: int, pass_name: str, status: str, options=None) -> dict:
    row = measurement(label, variant, n, pass_name, options=options or {})
    for key in list(row):
        if key.startswith(("time", "fidelity", "efficiency", "peak", "gflops")):
            del row[key]
    row.update(status=status, error=f"{status}: synthetic <failure> & more")
    return row


def accuracy(label: str, variant: str, task: str, mean: float | None, status: str = "ok") -> dict:
    seeds = [] if mean is None else [mean - 0.05, mean, mean + 0.05]
    return {
        "cell": f"{label}|{task}",
        "variant": variant,
        "label": label,
        "options": {},
        "task": task,
        "task_options": {"seq_len": 64},
        "task_label": f"{task}(64)",
        "accuracy_mean": mean,
        "accuracy_ci95": None if mean is None else 0.124,  # t(0.975; 2) · 0.05 / √3
        "accuracy_std": None if mean is None else 0.05,
        "accuracy_per_seed": seeds,
        "chance": 0.1,
        "steps": 200,
        "train_time_s": 3.0 if variant == "vanilla" else 1.5,
        "status": status,
        "error": None if status == "ok" else "training diverged",
        "device": "cpu",
        "dtype": "float32",
    }


def write_run(directory: Path, rows: list[dict], env: dict | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "spec.toml").write_text(SPEC)
    environment = {"torch_version": "2.x", "device": "cpu", "device_name": "Test CPU"}
    environment.update(dtype="float32", threads=2, gemm_flops_per_s=1e11)
    (directory / "env.json").write_text(json.dumps(env if env is not None else environment))
    (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def full_rows() -> list[dict]:
    """vanilla and a Linformer k sweep, both passes, with an OOM, an error, an unsupported
    cell, and accuracy rows (one failed)."""
    rows = []
    for n in (64, 128, 256):
        for pass_name in ("forward", "forward_backward"):
            rows.append(measurement("vanilla", "vanilla", n, pass_name))
            for k in (8, 16):
                label = f"linformer(k={k}, seq_len=256)"
                options = {"k": k, "seq_len": 256}
                rows.append(measurement(label, "linformer", n, pass_name, options=options))
    rows.append(failed("vanilla", "vanilla", 512, "forward", "oom"))
    rows.append(failed("vanilla", "vanilla", 512, "forward_backward", "error"))
    rows.append(
        failed(
            "linformer(k=8, seq_len=256)",
            "linformer",
            512,
            "forward",
            "unsupported",
            {"k": 8, "seq_len": 256},
        )
    )
    rows.append(accuracy("vanilla", "vanilla", "copy", 0.9))
    rows.append(accuracy("linformer(k=8, seq_len=256)", "linformer", "copy", 0.6))
    rows.append(accuracy("vanilla", "vanilla", "sort", 0.7))
    rows.append(accuracy("linformer(k=8, seq_len=256)", "linformer", "sort", None, "error"))
    return rows


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover(entry_points=False)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> tuple[Path, list]:
    directory = write_run(tmp_path_factory.mktemp("runs") / "full", full_rows())
    return directory, plot_run(directory, registry=registry)


@pytest.fixture(scope="module")
def drawn(full_run: tuple[Path, list], registry: Registry) -> dict[str, Figure]:
    """The full run's figures as objects, to inspect their artists."""
    return draw_figures(load_run(full_run[0]), registry)


def test_every_figure_is_written_and_non_trivial(full_run: tuple[Path, list]) -> None:
    directory, written = full_run
    stems = {path.stem for path in written}
    assert stems == {
        "time_vs_n",
        "memory_vs_n",
        "efficiency_vs_n",
        "fidelity_vs_linformer_k",
        "accuracy",
        "cost_vs_accuracy",
        "task_grid",  # two setups on two tasks
        "attention_patterns",
    }
    assert {path.suffix for path in written} == {".png"}
    for path in written:
        assert path.parent == directory / "figures"
        assert path.stat().st_size > 10_000, path


def test_failed_cells_are_marked_not_dropped(drawn: dict[str, Figure]) -> None:
    time_figure = drawn["time_vs_n"]
    forward, forward_backward = time_figure.axes[:2]
    markers = {line.get_marker() for line in forward.lines}
    assert {STATUS_MARKERS["oom"], STATUS_MARKERS["unsupported"]} <= markers
    assert STATUS_MARKERS["error"] in {line.get_marker() for line in forward_backward.lines}
    footnote = time_figure.get_supxlabel()
    assert "oom: vanilla n=512 forward" in footnote
    assert "unsupported: linformer k=8 n=512 forward" in footnote
    assert "torch 2.x" in footnote and "float32" in footnote
    legend_texts = [t.get_text() for t in time_figure.legends[0].get_texts()]
    assert "oom (not measured)" in legend_texts
    # A failed accuracy cell appears in the bar chart's footnote.
    assert "error: linformer k=8 sort(64)" in drawn["accuracy"].get_supxlabel()


def test_variant_keeps_its_colour_in_every_figure(drawn: dict[str, Figure]) -> None:
    time_lines = {
        line.get_label().split("  ")[0]: line for line in drawn["time_vs_n"].axes[0].lines
    }
    assert to_hex(time_lines["vanilla"].get_color()) == variant_colour("vanilla")
    bars = [
        container.patches[0]
        for container in drawn["accuracy"].axes[0].containers
        if isinstance(container, BarContainer) and container.get_label() == "vanilla"
    ]
    assert bars and to_hex(bars[0].get_facecolor()) == variant_colour("vanilla")
    assert variant_colour("vanilla") != variant_colour("linformer")
    # Names outside the shipped four get a colour from their name, not from plot order.
    assert variant_colour("my_variant") == variant_colour("my_variant")


def test_fitted_exponent_is_in_the_legend(drawn: dict[str, Figure]) -> None:
    time_figure = drawn["time_vs_n"]
    texts = [t.get_text() for t in time_figure.legends[0].get_texts()]
    vanilla = next(text for text in texts if text.startswith("vanilla"))
    assert "n^{2.00}" in vanilla  # time = 1e-3 n² exactly


def test_single_variant_single_length(tmp_path: Path, registry: Registry) -> None:
    rows = [measurement("vanilla", "vanilla", 128, "forward")]
    written = plot_run(write_run(tmp_path / "one", rows), formats=("svg", "pdf"), registry=registry)
    stems = {path.stem for path in written}
    assert {"time_vs_n", "memory_vs_n", "efficiency_vs_n", "fidelity_vs_n"} <= stems
    assert {path.suffix for path in written} == {".svg", ".pdf"}
    assert all(path.stat().st_size > 5_000 for path in written)


def test_only_failed_cells_and_no_env(tmp_path: Path, registry: Registry) -> None:
    rows = [failed("vanilla", "vanilla", 128, "forward", "oom")]
    directory = write_run(tmp_path / "failed", rows, env={})
    written = plot_run(directory, registry=registry)
    assert written and all(path.stat().st_size > 5_000 for path in written)


def test_invalid_cells_are_marked_like_other_failures(tmp_path: Path, registry: Registry) -> None:
    rows = [
        measurement("vanilla", "vanilla", 64, "forward"),
        measurement("vanilla", "vanilla", 128, "forward"),
        failed("vanilla", "vanilla", 256, "forward", "invalid"),
    ]
    drawn = draw_figures(load_run(write_run(tmp_path / "invalid", rows)), registry)
    for stem in ("time_vs_n", "memory_vs_n", "efficiency_vs_n"):
        figure = drawn[stem]
        assert STATUS_MARKERS["invalid"] in {line.get_marker() for line in figure.axes[0].lines}
        assert "invalid: vanilla n=256 forward" in figure.get_supxlabel()
        assert "invalid (not measured)" in [t.get_text() for t in figure.legends[0].get_texts()]
    assert len(set(STATUS_MARKERS.values())) == len(STATUS_MARKERS)  # one marker each


def test_t5_relative_bias_figure(tmp_path: Path, registry: Registry) -> None:
    rows = [measurement("t5_relative", "t5_relative", 64, "forward")]
    drawn = draw_figures(load_run(write_run(tmp_path / "t5", rows)), registry)
    assert len([axes for axes in drawn["relative_bias"].axes if axes.images]) == HEADS


def test_empty_results_give_a_clear_error(tmp_path: Path) -> None:
    directory = write_run(tmp_path / "empty", [])
    with pytest.raises(PlotError, match=r"nothing to plot.*results\.jsonl is empty"):
        plot_run(directory)
    with pytest.raises(PlotError, match="not a directory"):
        plot_run(tmp_path / "missing")


def test_unknown_format_is_refused(full_run) -> None:
    directory, _ = full_run
    with pytest.raises(PlotError, match="choose from png, svg, pdf"):
        plot_run(directory, formats=("gif",))


def test_linformer_slot_weights_match_forward(registry: Registry) -> None:
    torch.manual_seed(0)
    module = registry.build("linformer", D_MODEL, HEADS, k=8, seq_len=32).eval()
    tokens = torch.randn(2, 24, D_MODEL)
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[1, 20:] = False
    weights = module.slot_weights(tokens, attention_mask=mask)  # (B, H, Nq, k)
    assert weights.shape == (2, HEADS, 24, 8)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, HEADS, 24))
    # The forward output is these weights mixing the projected values, F · V.
    values = module.v_proj(tokens).masked_fill(~mask[..., None], 0.0)
    values = rearrange(values, "b n (h d) -> b h n d", h=HEADS)
    values = torch.einsum("sn,bhnd->bhsd", module.F[:, :24], values)
    mixed = rearrange(weights @ values, "b h n d -> b n (h d)")
    expected = module(tokens, attention_mask=mask).output
    torch.testing.assert_close(module.out_proj(mixed), expected, rtol=1e-5, atol=1e-5)
