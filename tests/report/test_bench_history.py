"""The history of saved benchmark runs: the plot draws every variant across runs, and
the noise report finds the largest slow-down between consecutive runs."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.image import imread
from matplotlib.text import Text

from playground.cli import main as playground_main
from playground.errors import PlaygroundError
from playground.report.bench_history import (
    history_figure,
    largest_steps,
    load_saved_runs,
    main,
    median_steps,
    normalised_time,
    plot_history,
)
from tests.gates.saved_runs import save_run

PEAKS = {
    "vanilla-n512-forward": 1,
    "vanilla-n512-forward_backward": 1,
    "linformer-n512-forward": 1,
    "linformer-n1024-forward": 1,
}


def test_plot_history_writes_a_figure_of_every_run(tmp_path):
    storage = tmp_path / "store"
    for number in (1, 2, 3):
        save_run(storage, number, PEAKS, {"vanilla-n512-forward": 0.001 * number})
    (storage / "Linux-CPython-3.11-64bit" / "not-ours.json").write_text(
        '{"datetime": "2026-01-01T00:00:00", "benchmarks": [{"name": "test_other", '
        '"extra_info": {}, "stats": {"median": 1.0}}]}'
    )  # another suite's run in the same storage is skipped, not drawn
    out = plot_history(storage, tmp_path / "figures" / "history.png")
    assert out == tmp_path / "figures" / "history.png"
    height, width, _ = imread(out).shape
    assert width > 800 and height > 600  # 2 passes × 2 lengths of panels
    assert [run.path.name[:4] for run in load_saved_runs(storage)] == ["0001", "0002", "0003"]


def test_plot_history_without_runs_says_what_to_run(tmp_path):
    with pytest.raises(PlaygroundError, match="nox -s bench"):
        plot_history(tmp_path / "missing", tmp_path / "history.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlaygroundError, match="no saved run of the attention benchmarks"):
        plot_history(tmp_path / "empty", tmp_path / "history.png")


def test_a_file_that_is_not_a_saved_run_is_named(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(PlaygroundError, match=r"broken.json is not a saved pytest-benchmark"):
        load_saved_runs(tmp_path)


def test_median_steps_is_the_largest_slow_down_between_consecutive_runs(tmp_path, capsys):
    for number, median in enumerate((0.010, 0.008, 0.012, 0.011), start=1):
        save_run(tmp_path, number, {"vanilla-n512-forward": 1}, {"vanilla-n512-forward": median})
    steps = median_steps(load_saved_runs(tmp_path))
    assert steps == {"test_attention[vanilla-n512-forward]": pytest.approx(0.5)}  # 8 → 12 ms
    assert main([str(tmp_path), "--noise"]) == 0
    assert "+50%" in capsys.readouterr().out


def test_noise_reports_the_normalised_time_the_time_gate_compares(tmp_path, capsys):
    """Twice the time on a machine twice as slow: the median steps +100 %, the gate's
    figure not at all."""
    name = "vanilla-n512-forward"
    save_run(tmp_path, 1, {name: 1}, {name: 0.010}, mins_s={name: 0.010}, reference_s=0.002)
    save_run(tmp_path, 2, {name: 1}, {name: 0.020}, mins_s={name: 0.020}, reference_s=0.004)
    runs = load_saved_runs(tmp_path)
    assert largest_steps(runs, normalised_time) == {f"test_attention[{name}]": pytest.approx(0)}
    assert main([str(tmp_path), "--noise"]) == 0
    out = capsys.readouterr().out
    assert "   +100%         +0%  test_attention[vanilla-n512-forward]" in out
    assert (
        "normalised time: largest step between consecutive runs (2 runs, 1 benchmarks) +0%" in out
    )


def test_history_of_one_run_says_run_and_keeps_the_legend_off_the_title(tmp_path):
    """Issue 42: "1 saved runs", and a legend drawn over the end of the title."""
    save_run(tmp_path, 1, {"vanilla-n512-forward": 1, "linformer-n512-forward": 1})
    figure = history_figure(tmp_path)
    title = figure.get_suptitle()
    assert "1 saved run " in title and "runs" not in title
    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # the constrained layout places the legend as it is saved
    renderer = canvas.get_renderer()
    [title_text] = [text for text in figure.findobj(Text) if text.get_text() == title]
    title_box = title_text.get_window_extent(renderer)
    legend_box = figure.legends[0].get_window_extent(renderer)
    assert not title_box.overlaps(legend_box), (title_box, legend_box)
    for number in (2, 3):
        save_run(tmp_path, number, {"vanilla-n512-forward": 1})
    assert "3 saved runs " in history_figure(tmp_path).get_suptitle()


def test_history_figure_goes_under_results_not_the_checkouts_root(tmp_path, monkeypatch):
    """Issue 42: bench_history.png was written to the working directory, the repository's
    root; both commands now write results/benchmarks/bench_history.png."""
    save_run(tmp_path / ".benchmarks", 1, PEAKS)
    monkeypatch.chdir(tmp_path)
    written = tmp_path / "results" / "benchmarks" / "bench_history.png"
    assert main([]) == 0
    assert written.is_file()
    assert not (tmp_path / "bench_history.png").exists()
    written.unlink()
    assert playground_main(["plot", "--benchmarks"]) == 0
    assert written.is_file()
    assert not (tmp_path / "bench_history.png").exists()
