"""The report layer on language-model rows (issue 32): one table line per (setup,
evaluation length) in the console, the CSV and the report; the "Train Short, Test Long"
figure and the cost figure; unsupported lengths left out of the lines; samples escaped;
mixed corpora refused; and accuracy rows beside language rows kept apart."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from rich.console import Console

from playground.registry import Registry
from playground.report.pages import write_report
from playground.report.plots import draw_figures, load_run, plot_run, variant_colour
from playground.report.plots.accuracy import accuracy_figure, cost_accuracy_figure
from playground.report.plots.bits_per_byte import extrapolation_figure, language_cost_figure
from playground.report.plots.style import STATUS_MARKERS, assign_colours
from playground.report.summary import write_summary
from playground.report.tables import language_entries, print_accuracy, print_language
from playground.report.task_rows import (
    LANGUAGE_SUMMARY,
    MixedCorpora,
    is_accuracy_row,
    is_language_row,
    visible,
)
from playground.run.store import RunStore
from tests.report.test_plots import accuracy, measurement, write_run

TRAIN_LENGTH = 128
LENGTHS = (128, 256, 512, 1024)
CORPUS = "3f9a0c1d2e4b" + "5" * 52
OTHER_CORPUS = "77aa00bb11cc" + "6" * 52
UNIGRAM, BIGRAM = 4.9, 3.3
HALF_WIDTH = 0.124  # t(0.975; 2) · 0.05 / √3, seeds at mean ± 0.05
SAMPLE = "):\n\tself.x = 1\x00\r<script>alert(1)</script>"
UNSUPPORTED = "variant 'linformer' does not support sequences of {n} tokens (its limit is 128)"


def lm_row(
    label: str,
    variant: str,
    eval_length: int,
    mean: float | None,
    *,
    settings: str = "",
    status: str = "ok",
    fingerprint: str = CORPUS,
    train_time_s: float = 10.0,
    **fields: Any,
) -> dict[str, Any]:
    """A language-model row as run.language writes it (an unsupported one keeps only the
    identifying fields)."""
    task_label = " ".join(part for part in (f"lm(seq_len={TRAIN_LENGTH})", settings) if part)
    cell = f"{label}|task={task_label}"
    row: dict[str, Any] = {
        "cell": cell if eval_length == TRAIN_LENGTH else f"{cell}|eval_len={eval_length}",
        "variant": variant,
        "label": label,
        "options": {},
        "setup_label": " ".join(part for part in (label, settings) if part),
        "task": "lm",
        "task_label": task_label,
        "task_options": {"seq_len": TRAIN_LENGTH},
        "metric": "bits_per_byte",
        "status": status,
        "error": None if status == "ok" else UNSUPPORTED.format(n=eval_length),
        "eval_length": eval_length,
        "train_length": TRAIN_LENGTH,
    }
    if status == "ok" and mean is not None:
        row.update(
            bits_per_byte_mean=mean,
            bits_per_byte_ci95=HALF_WIDTH,
            bits_per_byte_ci95_low=mean - HALF_WIDTH,
            bits_per_byte_ci95_high=mean + HALF_WIDTH,
            bits_per_byte_std=0.05,
            bits_per_byte_per_seed=[mean - 0.05, mean, mean + 0.05],
            scored_bytes=65536,
            unigram_bits_per_byte=UNIGRAM,
            bigram_bits_per_byte=BIGRAM,
            validation_bits_per_byte=mean + 0.01,
            tokens_per_s=12345.0,
            train_time_s=train_time_s,
            final_train_loss=1.3,
            samples=[
                {
                    "seed": 0,
                    "prompt": "def __init__(self",
                    # every length's row carries the samples; only the training length's show
                    "continuation": SAMPLE if eval_length == TRAIN_LENGTH else "WRONG ROW",
                },
                {"seed": 1, "prompt": "def __init__(self", "continuation": "SECOND SEED"},
            ],
            corpus_fingerprint=fingerprint,
            corpus={"source": "stdlib", "split_by": "file", "files": {"train": 600}},
            seeds=[0, 1],
            steps=500,
            batch_size=32,
            d_model=32,
            num_heads=4,
            num_layers=2,
            device="cpu",
            dtype="float32",
        )
    row.update(fields)
    return row


CURVES = {
    # setup label, variant, settings, bits per byte at 128, 256, 512, 1024
    ("vanilla", "vanilla", ""): (2.0, 2.6, 3.5, 4.4),
    ("alibi", "alibi", ""): (2.1, 2.05, 2.02, 2.0),
    ("vanilla", "vanilla", "positional_encoding=none"): (2.2, 2.4, 2.7, 3.0),
}


def language_rows() -> list[dict[str, Any]]:
    """Three setups at four lengths and a Linformer that runs only at L, written out of
    order (longest length first) so the table's order is its own."""
    rows = []
    for (label, variant, settings), means in CURVES.items():
        for length, mean in reversed(list(zip(LENGTHS, means, strict=True))):
            rows.append(lm_row(label, variant, length, mean, settings=settings, train_time_s=20.0))
    for length in LENGTHS[1:]:
        rows.append(lm_row("linformer(k=8)", "linformer", length, None, status="unsupported"))
    rows.append(lm_row("linformer(k=8)", "linformer", TRAIN_LENGTH, 2.3, train_time_s=5.0))
    return rows


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover(entry_points=False)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "lm", language_rows())


@pytest.fixture(scope="module")
def extrapolation(lm_run: Path) -> Figure:
    run = load_run(lm_run)
    assign_colours(row["variant"] for row in run.rows)
    figure = extrapolation_figure(run)
    assert figure is not None
    return figure


def _containers(figure: Figure) -> dict[str, ErrorbarContainer]:
    return {
        container.get_label(): container
        for container in figure.axes[0].containers
        if isinstance(container, ErrorbarContainer)
    }


def test_rows_are_told_apart_by_metric() -> None:
    old_accuracy = accuracy("vanilla", "vanilla", "copy", 0.9)  # no "metric": predates it
    assert is_accuracy_row(old_accuracy) and not is_language_row(old_accuracy)
    assert is_accuracy_row({**old_accuracy, "metric": "accuracy"})
    language = lm_row("vanilla", "vanilla", 128, 2.0)
    assert is_language_row(language) and not is_accuracy_row(language)
    cost = measurement("vanilla", "vanilla", 64, "forward")
    assert not is_accuracy_row(cost) and not is_language_row(cost)


def test_table_has_one_line_per_setup_and_length() -> None:
    entries = language_entries(language_rows())
    assert [(entry[0], int(entry[3])) for entry in entries] == [
        *(("alibi", n) for n in LENGTHS),
        *(("linformer(k=8)", n) for n in LENGTHS),
        *(("vanilla", n) for n in LENGTHS),
        *(("vanilla positional_encoding=none", n) for n in LENGTHS),
    ]
    by_key = {(entry[0], int(entry[3])): entry for entry in entries}
    assert by_key[("alibi", 512)] == [
        "alibi",
        "lm(seq_len=128)",
        "128",
        "512",
        "2.020 [1.896, 2.144]",
        "4.900",
        "3.300",
        "12,345",
        "20.0",
        "ok",
    ]
    nope = by_key[("vanilla positional_encoding=none", 1024)]
    assert nope[1] == "lm(seq_len=128) positional_encoding=none" and nope[4].startswith("3.000 [")
    unsupported = by_key[("linformer(k=8)", 256)]
    assert unsupported[4] == "-"
    assert unsupported[-1] == f"unsupported: {UNSUPPORTED.format(n=256)}"


def test_console_and_csv_carry_the_table(tmp_path: Path) -> None:
    console = Console(record=True, width=250)
    rows = language_rows()
    print_language(rows, console)
    print_accuracy(rows, console)  # language rows are no accuracy rows: prints nothing
    text = console.export_text()
    assert "Language modelling" in text and "Accuracy" not in text
    assert "2.020 [1.896, 2.144]" in text and "support sequences of 256 tokens" in text
    directory = write_run(tmp_path / "run", rows)
    write_summary(RunStore(directory))
    with (directory / LANGUAGE_SUMMARY).open(newline="") as handle:
        records = list(csv.DictReader(handle))
    assert len(records) == 16
    alibi = next(r for r in records if r["setup_label"] == "alibi" and r["eval_length"] == "512")
    assert float(alibi["bits_per_byte_mean"]) == 2.02 and alibi["corpus_fingerprint"] == CORPUS
    assert not (directory / "accuracy.csv").exists()  # no accuracy rows in this run


def test_figures_are_written(lm_run: Path, registry: Registry) -> None:
    written = plot_run(lm_run, registry=registry)
    stems = {path.stem for path in written}
    assert {"lm_extrapolation", "lm_cost"} <= stems
    assert not {"accuracy", "cost_vs_accuracy"} & stems  # an LM-only run has no accuracy
    for path in written:
        if path.stem.startswith("lm_"):
            assert path.suffix == ".png" and path.read_bytes()[:4] == b"\x89PNG"
            assert path.stat().st_size > 10_000


def test_extrapolation_figure_has_a_line_per_setup_and_the_training_length(
    extrapolation: Figure,
) -> None:
    axes = extrapolation.axes[0]
    lines = _containers(extrapolation)
    assert set(lines) == {"vanilla", "alibi", "vanilla positional_encoding=none", "linformer(k=8)"}
    vanilla = lines["vanilla"].lines[0]
    assert list(vanilla.get_xdata()) == list(LENGTHS)
    assert list(vanilla.get_ydata()) == list(CURVES[("vanilla", "vanilla", "")])
    # the training length: a vertical dashed line at L, labelled
    marker = [
        line
        for line in axes.lines
        if list(line.get_xdata()) == [TRAIN_LENGTH, TRAIN_LENGTH] and line.get_linestyle() == "--"
    ]
    assert len(marker) == 1
    texts = [text.get_text() for text in axes.texts]
    assert "trained at L = 128" in texts
    assert f"unigram baseline {UNIGRAM:.2f}" in texts and f"bigram baseline {BIGRAM:.2f}" in texts
    baselines = {tuple(line.get_ydata()) for line in axes.lines}
    assert (UNIGRAM, UNIGRAM) in baselines and (BIGRAM, BIGRAM) in baselines
    assert axes.get_xscale() == "log" and list(axes.get_xticks()) == list(LENGTHS)
    # NoPE keeps vanilla's colour and gets a line style of its own
    nope = lines["vanilla positional_encoding=none"].lines[0]
    assert to_hex(vanilla.get_color()) == to_hex(nope.get_color()) == variant_colour("vanilla")
    assert vanilla.get_linestyle() == "-" and nope.get_linestyle() != "-"
    # the 95% interval as error bars: a segment from low to high at every point
    bars = lines["alibi"].lines[2][0].get_segments()
    assert [tuple(segment[:, 1].round(3)) for segment in bars][2] == (1.896, 2.144)


def test_unsupported_lengths_are_left_out_not_drawn_as_zero(extrapolation: Figure) -> None:
    axes = extrapolation.axes[0]
    linformer = _containers(extrapolation)["linformer(k=8)"].lines[0]
    assert list(linformer.get_xdata()) == [TRAIN_LENGTH]  # its L point stays
    assert list(linformer.get_ydata()) == [2.3]
    ys = [
        y for line in axes.lines if line.get_transform() == axes.transData for y in line.get_ydata()
    ]
    assert min(ys) > 1.0  # nothing at 0 in data coordinates
    foot = [line for line in axes.lines if line.get_marker() == STATUS_MARKERS["unsupported"]]
    assert sorted(line.get_xdata()[0] for line in foot) == list(LENGTHS[1:])
    assert "unsupported: linformer(k=8) at length 256: variant" in extrapolation.get_supxlabel()


def test_cost_figure_has_a_point_per_setup(lm_run: Path) -> None:
    figure = language_cost_figure(load_run(lm_run))
    assert figure is not None
    points = {
        label: (container.lines[0].get_xdata()[0], container.lines[0].get_ydata()[0])
        for label, container in _containers(figure).items()
    }
    assert points == {
        "vanilla": (20.0, 2.0),
        "alibi": (20.0, 2.1),
        "vanilla positional_encoding=none": (20.0, 2.2),
        "linformer(k=8)": (5.0, 2.3),
    }
    assert {text.get_text() for text in figure.axes[0].texts} == set(points)


def test_mixed_corpora_are_refused_with_both_fingerprints(tmp_path: Path, capsys) -> None:
    rows = [
        *language_rows(),
        lm_row("rope", "rope", TRAIN_LENGTH, 2.1, fingerprint=OTHER_CORPUS),
    ]
    with pytest.raises(MixedCorpora) as refused:
        language_entries(rows)
    message = str(refused.value)
    assert "different corpora" in message
    assert f"corpus {CORPUS[:12]} (alibi, linformer(k=8), vanilla" in message
    assert f"corpus {OTHER_CORPUS[:12]} (rope)" in message
    assert "Evaluate every setup again on one corpus" in message
    assert "report the runs separately" in message
    directory = write_run(tmp_path / "mixed", rows)
    with pytest.raises(MixedCorpora):
        write_summary(RunStore(directory))
    with pytest.raises(MixedCorpora):
        write_report(directory, [])
    # The figures alone become warnings (the other figures stand); the table step raises.
    stems = {path.stem for path in plot_run(directory)}
    assert "lm_extrapolation" not in stems and "lm_cost" not in stems
    assert "figure 'lm_extrapolation' not drawn: MixedCorpora" in capsys.readouterr().err


def test_model_settings_do_not_hide_a_mixed_corpus() -> None:
    """NoPE's task label carries its setting, but it is the same task: another corpus
    there is refused too."""
    rows = [
        lm_row("vanilla", "vanilla", TRAIN_LENGTH, 2.0),
        lm_row(
            "vanilla",
            "vanilla",
            TRAIN_LENGTH,
            2.2,
            settings="positional_encoding=none",
            fingerprint=OTHER_CORPUS,
        ),
    ]
    with pytest.raises(MixedCorpora, match="lm\\(seq_len=128\\) were measured"):
        language_entries(rows)


def test_a_row_the_runner_refused_for_its_corpus_mixes_nothing() -> None:
    refused = lm_row("rope", "rope", TRAIN_LENGTH, 2.1, fingerprint=OTHER_CORPUS)
    refused.update(status="error", error="this cell was measured on a different corpus")
    entries = language_entries([*language_rows(), refused])
    rope = next(entry for entry in entries if entry[0] == "rope")
    assert rope[4] == "-" and rope[-1].startswith("error: this cell was measured")


def test_accuracy_and_language_rows_render_both_sections(tmp_path: Path, registry) -> None:
    rows = [
        measurement("vanilla", "vanilla", 64, "forward"),
        accuracy("vanilla", "vanilla", "copy", 0.9),
        accuracy("alibi", "alibi", "copy", 0.8),
        *language_rows(),
    ]
    directory = write_run(tmp_path / "both", rows)
    run = load_run(directory)
    assert len(run.accuracy) == 2 and len(run.language) == 16
    figures = draw_figures(run, registry)
    assert {"accuracy", "cost_vs_accuracy", "lm_extrapolation", "lm_cost"} <= set(figures)
    bars = [
        c for c in figures["accuracy"].axes[0].containers if c.get_label() in {"vanilla", "alibi"}
    ]
    assert len(bars) == 2  # one bar per accuracy row, none for the language rows
    written = plot_run(directory, registry=registry)
    html_path, markdown_path = write_report(directory, written)
    html = html_path.read_text(encoding="utf-8")
    accuracy_section = html.split("<h2>Accuracy")[1].split("<h2>")[0]
    assert "0.900 [" in accuracy_section and "lm(seq_len=128)" not in accuracy_section
    language_section = html.split("<h2>Language modelling")[1].split("<h2>")[0]
    assert "2.020 [1.896, 2.144]" in language_section and "copy" not in language_section
    markdown = markdown_path.read_text(encoding="utf-8")
    assert "| setup | task | train length | eval length | bits per byte |" in markdown
    assert "<figcaption>lm extrapolation" in html and "(figures/lm_cost.png)" in markdown
    console = Console(record=True, width=250)
    print_accuracy(rows, console)
    text = console.export_text()
    assert "lm(" not in text and "copy(64)" in text


def test_language_only_run_leaves_the_accuracy_machinery_alone(lm_run: Path) -> None:
    run = load_run(lm_run)
    assert run.accuracy == [] and run.measurements == []
    assert accuracy_figure(run) is None and cost_accuracy_figure(run) is None
    console = Console(record=True, width=200)
    print_accuracy(run.rows, console)
    assert console.export_text() == ""


def test_continuations_are_escaped_and_from_the_training_length(lm_run: Path) -> None:
    html_path, markdown_path = write_report(lm_run, [])
    html = html_path.read_text(encoding="utf-8")
    section = html.split("<h2>Continuations</h2>")[1].split("<h2>")[0]
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    assert "\\x00\\r" in section and "\x00" not in html and "\r" not in html
    assert "\n\tself.x = 1" in section  # newline and tab stay as they are
    assert '<span class="prompt">def __init__(self</span>' in section
    assert "<h3>vanilla positional_encoding=none (seed 0)</h3>" in section
    assert "WRONG ROW" not in html and "SECOND SEED" not in html
    assert "linformer(k=8) (seed 0)" in section  # its training length ran
    markdown = markdown_path.read_text(encoding="utf-8")
    assert "```text\ndef __init__(self):\n\tself.x = 1\\x00\\r<script>" in markdown


def test_visible_escapes_control_characters_only() -> None:
    assert visible("a\tb\nc\x1b[31m\u200bé\ufffd") == "a\tb\nc\\x1b[31m\\u200bé\ufffd"


def test_old_runs_write_no_language_files(tmp_path: Path) -> None:
    rows = [
        measurement("vanilla", "vanilla", 64, "forward"),
        accuracy("vanilla", "vanilla", "copy", 0.9),
    ]
    directory = write_run(tmp_path / "old", rows)
    write_summary(RunStore(directory))
    assert not (directory / LANGUAGE_SUMMARY).exists()
    html_path, _ = write_report(directory, [])
    html = html_path.read_text(encoding="utf-8")
    assert "Language modelling" not in html and "Continuations" not in html
