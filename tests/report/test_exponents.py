"""Exponents are promised only where shown, and doubtful slopes are marked (issue 42):
legends said "fitted exponent: forward | forward + backward" over runs of two lengths,
which show none, and the summary printed a 2-point slope of −0.69 with no mark of doubt."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from playground.report.pages import write_report
from playground.report.plots import load_run
from playground.report.plots.scaling import MEMORY, TIME, scaling_figure
from playground.report.summary import DOUBTFUL_NOTE, exponents, summarize
from playground.report.tables import exponent_entries, print_summary
from tests.report.test_plots import measurement, write_run


def _rows(times: dict[int, float], label: str = "nystromformer") -> list[dict]:
    rows = []
    for n, time_ms in times.items():
        for pass_name in ("forward", "forward_backward"):
            row = measurement(label, label, n, pass_name, time_ms=time_ms)
            rows.append(row | {"peak_memory_bytes": 1000 * n})
    return rows


def _legend(figure) -> tuple[str, list[str]]:
    legend = figure.legends[0]
    return legend.get_title().get_text(), [text.get_text() for text in legend.get_texts()]


def test_two_lengths_promise_no_fitted_exponent(tmp_path):
    rows = _rows({64: 1.0, 128: 0.62}) + _rows({64: 1.0, 128: 4.0}, "vanilla")
    run = load_run(write_run(tmp_path / "run", rows))
    for metric in (TIME, MEMORY):
        figure = scaling_figure(run, metric)
        title, entries = _legend(figure)
        assert "exponent" not in title
        assert not any("n^" in entry for entry in entries)
        assert "fitted exponent" not in figure.get_supxlabel()


def test_three_lengths_show_and_explain_the_fit(tmp_path):
    run = load_run(write_run(tmp_path / "run", _rows({64: 1.0, 128: 4.0, 256: 16.0}, "vanilla")))
    figure = scaling_figure(run, TIME)
    title, entries = _legend(figure)
    assert title == "fitted exponent: forward | forward + backward"
    assert any("n^{2.00}" in entry for entry in entries)
    assert "fitted exponent: from three or more lengths" in figure.get_supxlabel()


@pytest.mark.parametrize(
    ("times", "text"),
    [
        ({64: 1.0, 128: 0.62}, "-0.69 (2-point slope) ?"),  # the Nyströmformer
        ({64: 1.0, 128: 16.0}, "4.00 (2-point slope) ?"),  # steeper than any attention
        ({64: 1.0, 128: 16.0, 256: 256.0}, "4.00 ± 0.00 ?"),
        ({64: 1.0, 128: 3.9}, "1.96 (2-point slope)"),  # plausible: marked 2-point only
        ({64: 1.0, 128: 4.0, 256: 16.0}, "2.00 ± 0.00"),
    ],
)
def test_doubtful_slopes_are_marked(times, text):
    lines = summarize(_rows(times))
    assert {row[2] for row in exponent_entries(lines)} == {text}
    shown = exponents([row for row in _rows(times) if row["pass"] == "forward"])[0]
    assert (shown is not None) == (len(times) >= 3 and "?" not in text)


def test_the_mark_is_explained_in_the_terminal_and_the_report(tmp_path):
    rows = _rows({64: 1.0, 128: 0.62}) + _rows({64: 1.0, 128: 4.0}, "vanilla")
    console = Console(record=True, width=200, file=io.StringIO())
    print_summary(summarize(rows), console)
    printed = console.export_text()
    assert "-0.69 (2-point slope) ?" in printed
    assert DOUBTFUL_NOTE in printed.replace("\n", " ")
    html, markdown = write_report(write_run(tmp_path / "run", rows), [])
    assert DOUBTFUL_NOTE in markdown.read_text()
    assert "doubtful, do not read it as a scaling law" in html.read_text()

    plain = Console(record=True, width=200, file=io.StringIO())
    print_summary(summarize(_rows({64: 1.0, 128: 4.0}, "vanilla")), plain)
    assert "doubtful" not in plain.export_text()
