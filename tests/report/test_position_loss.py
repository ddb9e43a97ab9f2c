"""The loss by position (issue 45 part 1): `bits_by_position` against the loss computed
position by position, the rows' buckets, and the figure that draws them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from playground.model.training import bits_by_position, bits_per_byte
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry
from playground.report.plots import load_run, plot_run
from playground.report.plots.position_loss import CLIP_FACTOR, position_loss_figure
from playground.report.plots.style import assign_colours
from playground.run.language_scores import LengthScore, length_fields
from playground.tasks import IGNORE, TaskData
from tests.report.test_language_report import TRAIN_LENGTH, UNIGRAM, lm_row
from tests.report.test_plots import write_run

BUCKET = 64


def small_model() -> TransformerClassifier:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=256, num_classes=256, max_seq_len=64, variant="vanilla", d_model=16,
        num_heads=2, num_layers=1, target="token", causal=True,
    )  # fmt: skip
    return TransformerClassifier(config, Registry.discover(entry_points=False))


def test_bits_by_position_is_the_loss_at_each_position() -> None:
    model = small_model()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (5, 24), generator=generator)
    labels = torch.randint(0, 256, (5, 24), generator=generator)
    labels[1, 3] = labels[4, 0] = IGNORE  # a position not every window scores
    totals, counts = bits_by_position(model, TaskData(tokens, labels))
    with torch.no_grad():
        logits = model(tokens).double()  # (5, 24, 256)
    nats = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
    scored = (labels != IGNORE).double()
    assert counts.tolist() == scored.sum(0).tolist()
    assert counts[3] == 4 and counts[0] == 4 and counts[5] == 5
    expected = (nats * scored).sum(0) / math.log(2)
    torch.testing.assert_close(totals, expected, rtol=1e-9, atol=1e-9)
    direct = float((nats * scored).sum() / scored.sum()) / math.log(2)
    assert bits_per_byte(model, TaskData(tokens, labels)) == pytest.approx(direct, rel=1e-12)


def test_length_fields_average_each_bucket_over_seeds() -> None:
    scores = [
        LengthScore(192, 2.0, 100, by_position=(1.0, 2.0, 3.0)),
        LengthScore(192, 2.2, 100, by_position=(1.2, 2.2, 3.4)),
    ]
    fields = length_fields(192, [0, 1], scores)
    assert fields["bits_per_byte_by_position"] == pytest.approx([1.1, 2.1, 3.2])
    halves = fields["bits_per_byte_by_position_ci95"]
    assert halves[0] == pytest.approx(halves[1]) and halves[2] > halves[0] > 0


CURVES = {
    # label: bits per byte in buckets of 64 over 4 × L = 512 positions; L = 128
    "vanilla": (2.5, 2.1, 2.6, 4.0, 6.0, 7.5, 8.0, 8.0),
    "alibi": (2.5, 2.1, 2.0, 2.0, 2.0, 1.9, 1.9, 1.9),
}


def position_rows() -> list[dict]:
    rows = []
    for label, values in CURVES.items():
        for length in (TRAIN_LENGTH, 4 * TRAIN_LENGTH):
            count = length // BUCKET
            rows.append(
                lm_row(
                    label,
                    label,
                    length,
                    sum(values[:count]) / count,
                    position_bucket=BUCKET,
                    bits_per_byte_by_position=list(values[:count]),
                    bits_per_byte_by_position_ci95=[0.1] * count,
                )
            )
    return rows


@pytest.fixture(scope="module")
def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "positions", position_rows())


def test_a_line_per_setup_from_its_longest_length(run_directory: Path) -> None:
    run = load_run(run_directory)
    assign_colours(row["variant"] for row in run.rows)
    figure = position_loss_figure(run)
    assert figure is not None
    axes = figure.axes[0]
    lines = {line.get_label(): line for line in axes.lines if not line.get_label().startswith("_")}
    assert set(lines) == {"vanilla", "alibi"}
    assert list(lines["alibi"].get_xdata()) == [32 + 64 * i for i in range(8)]  # bucket centres
    assert list(lines["alibi"].get_ydata()) == list(CURVES["alibi"])
    # the training length marked, and the y axis clipped at CLIP_FACTOR × unigram
    assert "trained at L = 128" in [text.get_text() for text in axes.texts]
    assert axes.get_ylim()[1] == pytest.approx(CLIP_FACTOR * UNIGRAM)
    notes = " ".join(text.get_text() for text in figure.texts)
    assert "vanilla: above" in notes and "peak 8.00" in notes


def test_the_figure_is_written_and_absent_without_positions(
    run_directory: Path, tmp_path: Path
) -> None:
    written = plot_run(run_directory, registry=Registry.discover(entry_points=False))
    assert "lm_by_position" in {path.stem for path in written}
    rows = position_rows()
    for row in rows:
        del row["bits_per_byte_by_position"]
    assert position_loss_figure(load_run(write_run(tmp_path / "old", rows))) is None


class Repeater(torch.nn.Module):
    """An oracle for text that repeats every `period` bytes: certain of the byte `period`
    back once there is one, uniform before."""

    def __init__(self, period: int) -> None:
        super().__init__()
        self.period = period

    def forward(self, tokens, mask=None, positions=None):
        logits = torch.zeros(*tokens.shape, 256)
        # the label at i is the byte at i + 1, which is the byte at i + 1 - period
        span = tokens.shape[1] - self.period + 1
        logits[:, self.period - 1 :].scatter_(-1, tokens[:, :span].unsqueeze(-1), 1e4)
        return logits[positions] if positions is not None else logits


def test_a_text_the_model_can_predict_costs_nothing_after_its_first_period() -> None:
    """The loss lands at the positions that earn it: 8 bits a byte until the oracle has
    seen one period, none after, at every length."""
    period, length = 16, 96
    text = torch.randint(0, 256, (period,), generator=torch.Generator().manual_seed(0))
    stream = text.repeat(4 * length // period + 1)
    windows = stream[: 4 * length + 1]
    data = TaskData(windows[:-1].view(4, length), windows[1:].view(4, length))
    totals, counts = bits_by_position(Repeater(period), data)
    per_position = totals / counts
    assert per_position[: period - 1].tolist() == pytest.approx([8.0] * (period - 1))
    assert per_position[period - 1 :].abs().max() < 1e-6
