"""Recall against state size (issue 43 part 3): the Pareto frontier picks the points no
other beats with fewer bytes (and leaves a dominated one off), the figure is drawn from
accuracy rows that carry `state_bytes` (one panel per task and length, a setup without a
decoding state drawn hollow and said so), and rows without it break nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from playground.report.pages import write_report
from playground.report.plots import draw_figures, load_run, plot_run
from playground.report.plots.recall_state import pareto_frontier, recall_state_figure
from playground.run.state_size import DECODING_STATE, KEY_VALUE_BYTES
from tests.report.test_plots import accuracy, write_run


def test_the_frontier_is_the_upper_left_staircase() -> None:
    points = [
        (1000.0, 0.50),  # 0: on it
        (2000.0, 0.40),  # 1: more bytes, less accurate than 0
        (3000.0, 0.90),  # 2: on it
        (3000.0, 0.80),  # 3: as many bytes as 2, less accurate
        (4000.0, 0.90),  # 4: as accurate as 2, more bytes
        (500.0, 0.20),  # 5: the fewest bytes: on it
        (8000.0, 0.95),  # 6: the most accurate: on it
    ]
    assert pareto_frontier(points) == [5, 0, 2, 6]


def test_a_dominated_point_is_never_on_the_frontier() -> None:
    # The most bytes and below the best: a frontier that kept every point, or sorted by
    # accuracy alone, would keep it.
    points = [(10.0, 0.9), (100.0, 0.5)]
    assert pareto_frontier(points) == [0]
    assert pareto_frontier([(5.0, 0.3), (5.0, 0.3)]) == [0]  # identical: the first counts
    assert pareto_frontier([]) == []


def recall_row(label: str, variant: str, mean: float, state: int | None, **fields) -> dict:
    row = accuracy(label, variant, "mqar", mean)
    row.update({"task_label": "mqar(seq_len=128)", "task_options": {"seq_len": 128}, **fields})
    row["cell"] = f"{label}|{row['task_label']}"
    if state is not None:
        row.update(state_bytes=state, state_source=DECODING_STATE)
    return row


def recall_rows() -> list[dict]:
    return [
        recall_row("vanilla", "vanilla", 0.99, 131_328, model={"d_model": 64}),
        recall_row(
            "vanilla",
            "vanilla",
            0.98,
            65_792,
            model={"d_model": 32},
            task_label="mqar(seq_len=128) d_model=32",
        ),
        recall_row(
            "sliding_window(window=8)", "sliding_window", 0.10, 8_208, options={"window": 8}
        ),
        recall_row(
            "sliding_window(window=64)", "sliding_window", 0.60, 65_664, options={"window": 64}
        ),
        recall_row("linear", "linear", 0.30, 8_704),
        {
            **recall_row("linformer", "linformer", 0.50, 131_072),
            "state_source": KEY_VALUE_BYTES,
        },
        # The same task at its curriculum stage's length: a panel of its own.
        recall_row(
            "vanilla",
            "vanilla",
            1.0,
            65_664,
            model={"d_model": 64},
            task_options={"seq_len": 64},
            task_label="mqar curriculum",
        ),
    ]


def frontier(axes) -> list[tuple[float, float]]:
    (line,) = [line for line in axes.get_lines() if line.get_label() == "Pareto frontier"]
    return list(zip(line.get_xdata(), line.get_ydata(), strict=True))


def test_the_figure_draws_each_task_with_its_frontier(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", recall_rows())
    written = plot_run(run_dir)
    assert run_dir / "figures" / "recall_vs_state.png" in written
    figure = recall_state_figure(load_run(run_dir))
    assert figure is not None
    long, short = figure.axes[:2]
    assert long.get_xscale() == "log"
    # Each beaten by nothing with fewer bytes: the window of 8, linear attention, the
    # window of 64 (128 bytes under vanilla at d_model 32), vanilla at 32 and 64. Linformer,
    # placed by its key/value bytes, is beaten by vanilla at d_model 32 with half of them.
    assert frontier(long) == [
        (8_208, 0.10),
        (8_704, 0.30),
        (65_664, 0.60),
        (65_792, 0.98),
        (131_328, 0.99),
    ]
    assert frontier(short) == [(65_664, 1.0)]
    labels = [text.get_text() for text in long.texts]
    assert "window=8" in labels and "d_model=32" in labels  # what sets each point's state
    legend_texts = [text.get_text() for text in figure.legends[0].get_texts()]
    assert any("no decoding state" in text for text in legend_texts)
    footnote = figure.get_supxlabel()
    assert "frontier sliding_window window=8, linear" in footnote


def test_the_no_decoding_note_appears_only_when_a_setup_has_no_state(tmp_path: Path) -> None:
    rows = [row for row in recall_rows() if row["variant"] != "linformer"]
    figure = recall_state_figure(load_run(write_run(tmp_path / "run", rows)))
    assert figure is not None
    legend_texts = [text.get_text() for text in figure.legends[0].get_texts()]
    assert not any("no decoding state" in text for text in legend_texts)


@pytest.mark.parametrize("with_state", [0, 2])
def test_rows_without_state_bytes_break_nothing(tmp_path: Path, with_state: int) -> None:
    # Accuracy rows from before the state was measured (or of a bidirectional task),
    # alone or beside rows that carry it.
    rows = [accuracy("vanilla", "vanilla", "copy", 0.9), accuracy("linear", "linear", "copy", 0.4)]
    rows += recall_rows()[:with_state]
    run_dir = write_run(tmp_path / "run", rows)
    figures = draw_figures(load_run(run_dir))
    assert ("recall_vs_state" in figures) == bool(with_state)
    written = plot_run(run_dir)
    html, markdown = write_report(run_dir, written)
    assert html.is_file() and markdown.is_file()
    if with_state:
        figure = figures["recall_vs_state"]
        assert len(figure.axes) == 1  # the copy rows have no state: not drawn
