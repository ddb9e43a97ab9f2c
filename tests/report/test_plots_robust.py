"""Figures and the report survive odd data and junk display hooks (issue 30, §4): a
broken figure or hook costs only itself, with a message naming it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import playground.report.plots.data as plot_data
import playground.report.plots.figures as figures_module
from playground.report.pages import write_report
from playground.report.plots import plot_run
from tests.report.test_plots import accuracy, failed, full_rows, measurement, write_run


def _written_stems(paths: list[Path]) -> set[str]:
    return {path.stem for path in paths}


def test_junk_colour_and_display_name_keep_every_figure(tmp_path, monkeypatch, capsys):
    class Junk:
        colour = "not-a-colour"
        display_name = 42

    fake = SimpleNamespace(variants={"linformer": SimpleNamespace(cls=Junk)})
    monkeypatch.setattr(plot_data, "default_registry", lambda: fake)
    plot_data._WARNED.clear()
    run_dir = write_run(tmp_path / "run", full_rows())
    written = plot_run(run_dir)
    assert {"accuracy", "cost_vs_accuracy"} <= _written_stems(written)
    err = capsys.readouterr().err
    assert "'linformer'" in err and "colour" in err and "display_name" in err
    html, _ = write_report(run_dir, written)
    assert html.exists()


def test_one_raising_figure_loses_only_that_figure(tmp_path, monkeypatch, capsys):
    def broken(run):
        raise ValueError("synthetic hook failure")

    monkeypatch.setattr(figures_module, "accuracy_figure", broken)
    run_dir = write_run(tmp_path / "run", full_rows())
    written = plot_run(run_dir)
    stems = _written_stems(written)
    assert "accuracy" not in stems and "cost_vs_accuracy" in stems
    assert "'accuracy' not drawn" in capsys.readouterr().err
    write_report(run_dir, written)


@pytest.mark.parametrize("value", [float("inf"), None])
def test_non_finite_flops_and_efficiency_draw_the_rest(tmp_path, value):
    rows = full_rows()
    for row in rows:
        if row.get("seq_len") == 128 and row.get("status") == "ok":
            row.update(flops=value, efficiency=value, flags=["non-finite flops"])
    run_dir = write_run(tmp_path / "run", rows)
    written = plot_run(run_dir)
    assert {"accuracy", "cost_vs_accuracy", "efficiency_vs_n", "time_vs_n"} <= _written_stems(
        written
    )
    write_report(run_dir, written)


def _odd_runs() -> dict[str, list[dict]]:
    many = [measurement(f"v{i}", f"v{i}", 64, "forward") for i in range(40)]
    return {
        "only_failed": [
            failed("vanilla", "vanilla", 64, "forward", "error"),
            failed("vanilla", "vanilla", 128, "forward", "invalid"),
            failed("x", "x", 64, "forward", "unsupported"),
            accuracy("vanilla", "vanilla", "copy", None, "error"),
        ],
        "one_row": [measurement("vanilla", "vanilla", 64, "forward")],
        "forty": many + [accuracy(f"v{i}", f"v{i}", "copy", 0.5) for i in range(40)],
        "non_ascii": [
            measurement("внимание", "внимание", n, p)
            for n in (64, 128)
            for p in ("forward", "forward_backward")
        ]
        + [accuracy("注意力", "注意力", "copy", 0.5)],
    }


@pytest.mark.parametrize("kind", list(_odd_runs()))
def test_odd_run_directories_write_figures_and_report(tmp_path, kind):
    run_dir = write_run(tmp_path / kind, _odd_runs()[kind])
    written = plot_run(run_dir)
    html, markdown = write_report(run_dir, written)
    assert html.read_text(encoding="utf-8") and markdown.read_text(encoding="utf-8")


def test_report_lists_plugins_that_failed_to_load(tmp_path):
    env = {"torch_version": "2.x", "device": "cpu", "device_name": "Test CPU"}
    env["plugin_load_errors"] = [
        {"source": "plugins/broken.py", "error": "SyntaxError: invalid syntax (line 3)"}
    ]
    run_dir = write_run(tmp_path / "run", [measurement("vanilla", "vanilla", 64, "forward")], env)
    html, markdown = write_report(run_dir, [])
    for path in (html, markdown):
        text = path.read_text(encoding="utf-8")
        assert "failed to load" in text and "plugins/broken.py" in text
        assert "SyntaxError: invalid syntax (line 3)" in text


def test_forty_variants_get_forty_colours(tmp_path):
    from playground.report.plots import draw_figures, load_run, variant_colour

    rows = [measurement(f"v{i}", f"v{i}", 64, "forward") for i in range(40)]
    run = load_run(write_run(tmp_path / "run", rows))
    draw_figures(run)
    assert len({variant_colour(f"v{i}") for i in range(40)}) == 40


def _relative_bias(tmp_path):
    from playground.registry import Registry
    from playground.report.plots import load_run
    from playground.report.plots.patterns import relative_bias_figure

    rows = [measurement(v, v, 64, "forward") for v in ("t5_relative", "alibi")]
    run = load_run(write_run(tmp_path / "run", rows))
    return relative_bias_figure(run, Registry.discover(entry_points=False))


def test_relative_bias_labels_do_not_overlap_next_row_titles(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = _relative_bias(tmp_path)
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    grid = [a for a in figure.axes if a.get_title()]
    columns = len({round(a.get_position().x0, 3) for a in grid})
    for upper, lower in zip(grid[:columns], grid[columns : 2 * columns], strict=True):
        label = upper.xaxis.label.get_window_extent(renderer)
        title = lower.title.get_window_extent(renderer)
        assert label.y0 > title.y1, (upper.get_title(), lower.get_title())


def test_pattern_titles_are_readable_on_white(tmp_path):
    from matplotlib.colors import to_rgb

    from playground.report.plots.style import _contrast_on_white

    figure = _relative_bias(tmp_path)
    for axes in figure.axes:
        if axes.get_title():
            assert _contrast_on_white(to_rgb(axes.title.get_color())) >= 4.5, axes.get_title()


def test_cost_vs_accuracy_names_both_lengths_and_flags_exact_points(tmp_path):
    from playground.report.plots import load_run
    from playground.report.plots.accuracy import cost_accuracy_figure

    rows = full_rows()
    for row in rows:  # the linformer k=8 point is exact at n=64, the tasks' length
        if row["label"].startswith("linformer(k=8") and row.get("seq_len") == 64:
            row.update(fidelity_rel_error=0.0)
    figure = cost_accuracy_figure(load_run(write_run(tmp_path / "run", rows)))
    titles = [axes.get_title() for axes in figure.axes]
    assert "copy(64): accuracy at n=64" in titles
    footnote = figure.get_supxlabel()
    assert "accuracy on each task at its own length" in footnote
    assert "exact attention at n=64" in footnote and "vanilla is exact" not in footnote


def _hostile_registry(base="alibi", **hooks):
    """The shipped registry plus 'hostile', `base` with the given hooks replaced."""
    from playground.registry import Registry, VariantEntry

    registry = Registry.discover(entry_points=False)
    hostile = type("Hostile", (registry.get(base),), {"name": "hostile", **hooks})
    registry.variants["hostile"] = VariantEntry(hostile, "tests/report/test_plots_robust.py")
    return registry


@pytest.mark.parametrize(
    "hooks, named",
    [
        ({"logit_bias": lambda self, n_q, n_k: self.num_heads}, "logit_bias()"),
        (
            {
                "logit_bias": lambda self, n_q, n_k: torch.full(
                    (1, self.num_heads, n_q, n_k), float("nan")
                )
            },
            "non-finite",
        ),
        ({"picture_options": classmethod(lambda cls, options, n: 1 / 0)}, "ZeroDivisionError"),
    ],
    ids=["wrong_shape", "nan", "picture_options_raises"],
)
def test_one_bad_bias_hook_loses_only_its_own_row(tmp_path, hooks, named):
    from playground.report.plots import load_run
    from playground.report.plots.patterns import relative_bias_figure

    rows = [measurement(v, v, 64, "forward") for v in ("t5_relative", "hostile")]
    run = load_run(write_run(tmp_path / "run", rows))
    figure = relative_bias_figure(run, _hostile_registry(**hooks))
    titles = {a.get_title() for a in figure.axes}
    assert any(t.startswith("t5_relative") for t in titles)
    assert not any(t.startswith("hostile") for t in titles)
    footnote = " ".join(t.get_text() for t in figure.texts)
    assert "hostile not drawn" in footnote and named in footnote


def test_one_bad_pattern_hook_loses_only_its_own_panel(tmp_path):
    from playground.report.plots import load_run
    from playground.report.plots.patterns import attention_pattern_figure

    def raising(self, query):
        raise RuntimeError("synthetic pattern failure")

    registry = _hostile_registry("linformer", pattern_weights=raising)
    rows = [measurement(v, v, 64, "forward") for v in ("vanilla", "hostile")]
    run = load_run(write_run(tmp_path / "run", rows))
    figure = attention_pattern_figure(run, registry)
    texts = [t.get_text() for a in figure.axes for t in a.texts]
    assert any("hostile" in t and "could not be drawn" in t for t in texts)
    assert any(a.get_title().startswith("vanilla") for a in figure.axes)


def test_flagged_cells_are_drawn_hollow_with_a_legend_entry(tmp_path):
    from playground.report.plots import load_run
    from playground.report.plots.scaling import TIME, scaling_figure

    rows = full_rows()
    flagged = 0
    for row in rows:
        if row.get("seq_len") == 128 and row.get("status") == "ok" and "time_ms" in row:
            row["flags"] = ["spread: IQR is 40 % of the median"]
            flagged += 1
    run = load_run(write_run(tmp_path / "run", rows))
    figure = scaling_figure(run, TIME)
    hollow = [
        line
        for axes in figure.axes
        for line in axes.get_lines()
        if line.get_markerfacecolor() == "white" and line.get_linestyle() == "None"
    ]
    assert sum(len(line.get_xdata()) for line in hollow) == flagged > 0
    assert all(set(line.get_xdata()) == {128} for line in hollow)
    assert any("flagged" in text.get_text() for text in figure.legends[0].get_texts())
    plain = load_run(write_run(tmp_path / "plain", full_rows()))
    assert not any(
        "flagged" in t.get_text() for t in scaling_figure(plain, TIME).legends[0].get_texts()
    )
