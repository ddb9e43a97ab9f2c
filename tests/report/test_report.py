"""report.html is valid, self-contained HTML with every figure embedded and every text
escaped; report.md has the tables and links the figures by relative name."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from playground.registry import Registry
from playground.report.pages import accuracy_table, write_report
from playground.report.plots import PlotError, plot_run
from playground.report.tables import print_accuracy
from playground.run.stats import format_interval, proportion_interval
from tests.report.test_plots import accuracy, failed, measurement, write_run

VOID = {"meta", "img", "br", "hr", "link", "input"}


class Checker(HTMLParser):
    """Records images and checks that every opened element is closed in order."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    rows = [
        measurement("vanilla", "vanilla", 64, "forward"),
        measurement("vanilla", "vanilla", 128, "forward"),
        measurement("linformer(k=8)", "linformer", 64, "forward", options={"k": 8}),
        failed("linformer(k=8)", "linformer", 128, "forward", "oom", {"k": 8}),
        failed("vanilla", "vanilla", 256, "forward", "invalid"),
        accuracy("vanilla", "vanilla", "copy", 0.9),
        accuracy("linformer(k=8)", "linformer", "copy", None, "error"),
    ]
    directory = write_run(tmp_path_factory.mktemp("runs") / "run", rows)
    registry = Registry.discover(entry_points=False)
    figures = plot_run(directory, formats=("png", "pdf"), registry=registry)
    html_path, markdown_path = write_report(directory, figures)
    return html_path, markdown_path, figures


def test_html_is_valid_and_self_contained(report) -> None:
    html_path, _, figures = report
    checker = Checker()
    checker.feed(html_path.read_text(encoding="utf-8"))
    checker.close()
    assert checker.open == ["html"] or checker.open == []
    pngs = [path for path in figures if path.suffix == ".png"]
    assert len(checker.images) == len(pngs)
    for source in checker.images:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1])[:4] == b"\x89PNG"
    text = "".join(checker.text)
    assert "oom: synthetic <failure> & more" in text  # the error, shown as text
    assert "invalid: synthetic <failure> & more" in text  # invalid cells are failures too
    assert (
        "accuracy" in text.lower() and "0.900 [0.713, 0.970]" in text
    )  # the 95% interval, inside [0, 1]
    assert "0.850, 0.900, 0.950" in text  # and every seed
    assert 'name = "synthetic"' in text  # the spec
    assert "Test CPU" in text  # the environment


def test_html_escapes_run_text(report) -> None:
    html_path, _, _ = report
    source = html_path.read_text(encoding="utf-8")
    assert "<failure>" not in source
    assert "synthetic &lt;failure&gt; &amp; more" in source


def test_markdown_has_tables_and_relative_figures(report) -> None:
    _, markdown_path, figures = report
    text = markdown_path.read_text(encoding="utf-8")
    assert "| variant | pass | n |" in text
    assert "linformer(k=8)\\|n=128\\|forward" in text  # cell ids keep their pipes escaped
    # each accuracy value under its own header: the seeds, then chance
    assert "| accuracy (mean [95% interval]) | per seed | chance |" in text
    assert "| 0.900 [0.713, 0.970] | 0.850, 0.900, 0.950 | " in text
    for path in figures:
        if path.suffix == ".png":
            assert f"](figures/{path.name})" in text
    assert "```toml" in text


def test_invalid_cells_are_failed_cells_not_measurements(report) -> None:
    html_path, markdown_path, _ = report
    source = html_path.read_text(encoding="utf-8")
    assert '<td class="failed">invalid</td>' in source
    failed_section = markdown_path.read_text(encoding="utf-8").split("## Failed cells")[1]
    assert "| vanilla\\|n=256\\|forward | invalid |" in failed_section


def test_report_of_an_empty_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PlotError, match="nothing to plot"):
        write_report(write_run(tmp_path / "empty", []), [])


def test_the_terminal_accuracy_table_shows_the_reports_interval() -> None:
    """Both show the row's recorded interval (Wilson's, with the seeds' held-out
    predictions); the terminal table once recomputed it from the seeds alone, which is
    narrower when seeds agree closely (here [0.897, 0.902] against [0.769, 0.960])."""
    seeds = [0.899, 0.9, 0.901]
    low, high = proportion_interval(seeds, 64) or (0.0, 0.0)
    row = accuracy("vanilla", "vanilla", "copy", 0.9) | {
        "accuracy_per_seed": seeds,
        "accuracy_scored": 64,
        "accuracy_ci95_low": low,
        "accuracy_ci95_high": high,
    }
    recorded = format_interval(0.9, (low, high))
    assert recorded != format_interval(0.9, proportion_interval(seeds))  # the test can fail
    _, entries = accuracy_table([row])
    assert entries[0][2] == recorded
    console = Console(record=True, width=250, file=io.StringIO())
    print_accuracy([row], console)
    assert recorded in console.export_text()
