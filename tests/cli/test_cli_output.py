"""What a run prints: no profiler chatter on the terminal's file descriptors, and a
summary whose every variant label is whole in a 100-column terminal."""

from __future__ import annotations

import textwrap

import pytest
from rich.console import Console

from playground.cli import main
from playground.registry import Registry, configure
from playground.report.summary import summarize
from playground.report.tables import print_summary
from playground.run.spec_loading import load_spec
from tests.report.test_plots import failed, measurement


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


def test_a_run_prints_no_profiler_lines(tmp_path, capfd):
    spec = tmp_path / "tiny.toml"
    spec.write_text(
        textwrap.dedent(
            """
            name = "tiny"
            seq_lens = [16]
            d_model = 32
            num_heads = 2
            measures = ["memory"]
            """
        )
    )
    assert main(["run", str(spec), "--variants", "vanilla", "--out", str(tmp_path / "r")]) == 0
    out, err = capfd.readouterr()  # the file descriptors themselves, below sys.stdout
    assert "vanilla" in out
    for text in ("USDT", "profiler_start", "profiler_stop", "CPUAllocator"):
        assert text not in out + err


def quick_labels() -> list[tuple[str, str, dict]]:
    """(label, variant, options) of every point of the shipped quick spec, as it runs."""
    spec = load_spec("quick", Registry.discover(entry_points=False))
    return [(point.label, point.name, point.options) for point in spec.variants]


def test_the_summary_shows_every_label_whole_in_100_columns():
    points = quick_labels()
    assert any(len(label) > 40 for label, _, _ in points)  # the case that used to be cut
    rows = [
        measurement(label, variant, n, pass_name, options=options)
        for label, variant, options in points
        for pass_name in ("forward", "forward_backward")
        for n in (256, 512, 1024, 2048)
    ]
    label, variant, options = points[-1]
    rows.append(failed(label, variant, 4096, "forward", "unsupported", options))
    rows.append(failed(label, variant, 4096, "forward_backward", "invalid", options))
    console = Console(width=100, record=True, color_system=None)
    print_summary(summarize(rows), console)
    text = console.export_text()
    assert "…" not in text
    assert all(len(line) <= 100 for line in text.splitlines())
    lines = text.splitlines()
    for label, _, _ in points:
        assert any(label in line for line in lines), label
    for column in ("time ms", "peak MiB", "efficiency", "cosine", "unsupported", "invalid"):
        assert column in text
