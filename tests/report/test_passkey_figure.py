"""The passkey heatmap (issue 45 part 2: "show the result as a heatmap, as
needle-in-a-haystack reports are drawn"), from synthetic language rows: one panel per
setup, lengths across and depths down, each cell coloured and annotated by its scores, the
training length framed, unsupported lengths hatched with their status, chance in the
footnote, and no figure without passkey scores."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from playground.report.plots import load_run
from playground.report.plots.passkey import COLOURMAP, passkey_figure, passkey_panels, probed
from playground.report.plots.style import assign_colours
from tests.report.test_language_report import LENGTHS, TRAIN_LENGTH, lm_row
from tests.report.test_plots import write_run

DEPTHS = [0.0, 0.5, 1.0]
CHANCE = 5 * math.log2(0.1)


def exact_of(setup: str, length: int, depth: float) -> float:
    """A made-up score: perfect at L, falling with length for vanilla, flat for ALiBi."""
    if setup == "alibi":
        return 0.5 + 0.25 * depth
    return max(0.0, 1.0 - (length // TRAIN_LENGTH - 1) * 0.3 - 0.1 * depth)


def passkey_fields(setup: str, length: int) -> dict[str, Any]:
    exact = [exact_of(setup, length, depth) for depth in DEPTHS]
    return {
        "passkey_depths": DEPTHS,
        "passkey_exact": exact,
        "passkey_exact_per_seed": [exact, exact],
        "passkey_log_likelihood": [-0.5 - 10 * (1 - value) for value in exact],
        "passkey_chance_log_likelihood": CHANCE,
        "passkey_trials": 32,
    }


def passkey_rows() -> list[dict[str, Any]]:
    """vanilla and alibi probed at four lengths; a Linformer probed at L and unsupported
    past it."""
    rows = []
    for label in ("vanilla", "alibi"):
        for length in LENGTHS:
            rows.append(lm_row(label, label, length, 2.0, **passkey_fields(label, length)))
    rows.append(
        lm_row(
            "linformer(k=8)",
            "linformer",
            TRAIN_LENGTH,
            2.3,
            **passkey_fields("vanilla", TRAIN_LENGTH),
        )
    )
    for length in LENGTHS[1:]:
        rows.append(lm_row("linformer(k=8)", "linformer", length, None, status="unsupported"))
    return rows


@pytest.fixture(scope="module")
def figure(tmp_path_factory: pytest.TempPathFactory) -> Figure:
    run = load_run(write_run(tmp_path_factory.mktemp("runs") / "passkey", passkey_rows()))
    assign_colours(row["variant"] for row in run.rows)
    drawn = passkey_figure(run)
    assert drawn is not None
    return drawn


def heatmaps(figure: Figure) -> dict[str, Any]:
    """Setup -> its axes (the colour bar's axes have no title)."""
    return {axes.get_title().splitlines()[0]: axes for axes in figure.axes if axes.get_title()}


def cells(axes) -> dict[str, Rectangle]:
    return {patch.get_gid(): patch for patch in axes.patches if patch.get_gid()}


def test_one_heatmap_per_setup_with_lengths_across_and_depths_down(figure: Figure) -> None:
    panels = heatmaps(figure)
    assert list(panels) == ["alibi", "linformer(k=8)", "vanilla"]
    vanilla = panels["vanilla"]
    assert [label.get_text() for label in vanilla.get_xticklabels()] == [
        "L = 128", "256", "512", "1024",
    ]  # fmt: skip
    assert [label.get_text() for label in vanilla.get_yticklabels()] == ["0%", "50%", "100%"]
    assert vanilla.get_ylim() == (3.0, 0.0)  # depth 0 at the top
    assert vanilla.get_title() == "vanilla"  # the one task is said once, in a note
    assert "lm(seq_len=128): trained at L = 128" in " ".join(t.get_text() for t in figure.texts)
    assert len(figure.axes) == 4  # three heatmaps and the colour bar


def test_each_cell_is_coloured_and_annotated_by_its_scores(figure: Figure) -> None:
    vanilla = heatmaps(figure)["vanilla"]
    colours = colormaps[COLOURMAP]
    for length in LENGTHS:
        for line, depth in enumerate(DEPTHS):
            exact = exact_of("vanilla", length, depth)
            cell = cells(vanilla)[f"passkey:{length}:{depth:g}"]
            assert to_hex(cell.get_facecolor()) == to_hex(colours(exact))
            assert cell.get_y() == line and cell.get_x() == LENGTHS.index(length)
    texts = [text.get_text() for text in vanilla.texts]
    assert "0.70" in texts  # 256 at depth 0: 1 − 0.3
    assert "-3.5 bits" in texts  # its log-likelihood, −0.5 − 10 · 0.3
    assert texts.count("1.00") == 1 and texts.count("0.90") == 1  # L at depths 0 and 0.5


def test_the_training_length_is_framed(figure: Figure) -> None:
    frame = cells(heatmaps(figure)["alibi"])["passkey:training-length"]
    assert not frame.get_fill() and frame.get_x() == 0 and frame.get_height() == len(DEPTHS)


def test_unsupported_lengths_are_hatched_with_their_status(figure: Figure) -> None:
    linformer = heatmaps(figure)["linformer(k=8)"]
    found = cells(linformer)
    assert "passkey:128:0.5" in found  # scored at L
    for length in LENGTHS[1:]:
        column = found[f"passkey:{length}:unsupported"]
        assert column.get_hatch() == "//" and column.get_height() == len(DEPTHS)
    assert [t.get_text() for t in linformer.texts].count("unsupported") == 3


def test_the_footnote_gives_chance_and_the_failures(figure: Figure) -> None:
    footnote = figure.get_supxlabel()
    assert "chance: -16.6 bits" in footnote and "exact match 1e-05" in footnote
    assert "32 prompts per cell, mean over 2 seeds" in footnote
    assert "unsupported: linformer(k=8) at length 256" in footnote


def test_the_figure_renders(figure: Figure) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    assert buffer.getvalue()[:4] == b"\x89PNG" and len(buffer.getvalue()) > 20_000


def test_no_figure_without_passkey_scores(tmp_path: Path) -> None:
    plain = [lm_row("vanilla", "vanilla", length, 2.0) for length in LENGTHS]
    assert passkey_figure(load_run(write_run(tmp_path / "plain", plain))) is None
    failed = [
        lm_row("vanilla", "vanilla", 128, 2.0, **passkey_fields("vanilla", 128), status="error")
    ]
    assert passkey_figure(load_run(write_run(tmp_path / "failed", failed))) is None


def test_a_task_without_scores_gets_no_panel(tmp_path: Path) -> None:
    other = [
        {**row, "task_label": "lm(seq_len=128, corpus=x)", "cell": row["cell"] + "|other"}
        for row in (lm_row("alibi", "alibi", length, 2.0) for length in LENGTHS)
    ]
    run = load_run(write_run(tmp_path / "mixed", passkey_rows() + other))
    assert {panel.task for panel in passkey_panels(run)} == {"lm(seq_len=128)"}


@pytest.mark.parametrize(
    "fields",
    [
        {"passkey_exact": [1.0, 0.5]},  # one depth short
        {"passkey_log_likelihood": [0.0, float("nan"), 0.0]},
        {"passkey_depths": []},
        {"passkey_exact": None},
    ],
)
def test_a_row_with_a_malformed_score_is_not_drawn_as_one(fields: dict[str, Any]) -> None:
    row = lm_row("vanilla", "vanilla", 128, 2.0, **passkey_fields("vanilla", 128))
    assert probed(row)
    assert not probed({**row, **fields})


def test_many_setups_wrap_onto_lines_of_three(tmp_path: Path) -> None:
    rows = [
        lm_row(label, "vanilla", length, 2.0, **passkey_fields("vanilla", length))
        for label in ("a", "b", "c", "d")
        for length in LENGTHS
    ]
    figure = passkey_figure(load_run(write_run(tmp_path / "four", rows)))
    assert figure is not None
    assert list(heatmaps(figure)) == ["a", "b", "c", "d"]
    assert len(figure.axes) == 5  # the two spare places of the second line are removed
