"""The verdict (issue 43 part 4) on synthetic rows whose truth is known: a clear gain is
marked better, a copy of the baseline indistinguishable, one seed (or a minority of seeds)
does not decide a mark, seeds that do not share data fall back to Welch, bits per byte
count lower as better, a missing baseline names the setups there are; and the command,
the CSV, the end-of-run print and the scorecard figure."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from playground.cli.parser import build_parser
from playground.registry import Registry
from playground.report.plots import load_run, plot_run
from playground.report.plots.verdict import scorecard_figure
from playground.report.verdict import (
    BETTER,
    NOT_MEASURED,
    PAIRED,
    SAME,
    UNPAIRED,
    VERDICT,
    WORSE,
    MissingBaseline,
    print_verdicts,
    run_verdicts,
    verdicts,
)
from playground.run.store import RunStore
from tests.report.test_plots import measurement, write_run

SEEDS = [0, 1, 2]
BASELINE = [0.60, 0.70, 0.65]


def accuracy_row(label: str, per_seed: list[float], seeds: list[int] | None = None, **task: Any):
    seeds = SEEDS if seeds is None else seeds
    return {
        "cell": f"{label}|recall",
        "variant": label.split()[0],
        "label": label,
        "options": {},
        "task": "recall",
        "task_options": {"seq_len": 64, **task},
        "task_label": "recall(64)",
        "accuracy_mean": sum(per_seed) / len(per_seed),
        "accuracy_per_seed": per_seed,
        "seeds": seeds,
        "status": "ok",
        "error": None,
    }


def language_row(label: str, per_seed: list[float], eval_length: int = 128) -> dict:
    return {
        "cell": f"{label}|lm|{eval_length}",
        "variant": label,
        "label": label,
        "task": "lm",
        "task_options": {"seq_len": 128},
        "task_label": "lm(128)",
        "metric": "bits_per_byte",
        "train_length": 128,
        "eval_length": eval_length,
        "bits_per_byte_mean": sum(per_seed) / len(per_seed),
        "bits_per_byte_per_seed": per_seed,
        "seeds": SEEDS,
        "corpus_fingerprint": "c" * 64,
        "status": "ok",
        "error": None,
    }


def write_judged_run(directory: Path, rows: list[dict]) -> Path:
    """write_run with a spec that names vanilla its baseline."""
    write_run(directory, rows)
    (directory / "spec.toml").write_text('name = "synthetic"\nbaseline = "vanilla"\n')
    return directory


def only(found: list, setup: str):
    (verdict,) = [v for v in found if v.setup == setup]
    return verdict


def test_a_clear_gain_is_marked_better_paired_by_seed() -> None:
    rows = [
        accuracy_row("vanilla", BASELINE),
        accuracy_row("good", [0.90, 0.97, 0.93]),
        accuracy_row("bad", [0.30, 0.41, 0.33]),
    ]
    found = verdicts(rows, "vanilla")
    good, bad = only(found, "good"), only(found, "bad")
    assert good.pairing == PAIRED and good.mark == BETTER
    assert good.difference == pytest.approx(0.2833333, abs=1e-6)
    # paired: differences 0.30, 0.27, 0.28; sd 0.01528, t(2) = 4.3027 → half 0.03795
    assert good.low == pytest.approx(0.2833333 - 0.037950, abs=1e-5)
    assert good.high == pytest.approx(0.2833333 + 0.037950, abs=1e-5)
    assert bad.mark == WORSE


def test_a_copy_of_the_baseline_is_indistinguishable() -> None:
    found = verdicts([accuracy_row("vanilla", BASELINE), accuracy_row("copy", BASELINE)], "vanilla")
    copy = only(found, "copy")
    assert copy.mark == SAME
    assert (copy.difference, copy.low, copy.high) == (0.0, 0.0, 0.0)


def test_one_outlier_seed_does_not_decide_the_mark() -> None:
    # Equal to the baseline on four seeds, far ahead on one: the mean gains 0.08.
    seeds = [0, 1, 2, 3, 4]
    base = [0.60, 0.70, 0.65, 0.62, 0.68]
    lucky = [0.60, 0.70, 0.65, 0.62, 0.68 + 0.40]
    rows = [accuracy_row("vanilla", base, seeds), accuracy_row("lucky", lucky, seeds)]
    verdict = only(verdicts(rows, "vanilla"), "lucky")
    assert verdict.difference == pytest.approx(0.08)
    assert verdict.mark == SAME


def test_a_minority_of_seeds_does_not_decide_the_mark() -> None:
    # Five seeds far ahead, six slightly behind: the paired interval alone excludes 0
    # ([0.022, 0.240]), but most seeds say worse, so the mark is indistinguishable.
    seeds = list(range(11))
    base = [0.5] * 11
    mixed = [0.8] * 5 + [0.49] * 6
    rows = [accuracy_row("vanilla", base, seeds), accuracy_row("mixed", mixed, seeds)]
    verdict = only(verdicts(rows, "vanilla"), "mixed")
    assert verdict.low is not None and verdict.low > 0
    assert verdict.mark == SAME


def test_seeds_that_do_not_share_data_fall_back_to_welch() -> None:
    # Other seeds, or another task size: seed k did not see the baseline's seed k's data.
    other_seeds = accuracy_row("other", [0.90, 0.97, 0.93], seeds=[3, 4, 5])
    other_data = accuracy_row("bigger", [0.90, 0.97, 0.93], num_examples=999)
    rows = [accuracy_row("vanilla", BASELINE), other_seeds, other_data]
    found = verdicts(rows, "vanilla")
    for setup in ("other", "bigger"):
        verdict = only(found, setup)
        assert verdict.pairing == UNPAIRED
        # Welch: se² = (0.00123 + 0.0025) / 3, df = 3.44 → 3, t(3) = 3.1824
        assert verdict.high - verdict.low == pytest.approx(2 * 3.18245 * 0.035277, rel=1e-3)
        assert verdict.mark == BETTER


def test_bits_per_byte_lower_is_better() -> None:
    rows = [
        language_row("vanilla", [2.00, 2.10, 2.05]),
        language_row("sharper", [1.80, 1.91, 1.84]),
        language_row("blurrier", [2.30, 2.41, 2.33]),
    ]
    found = verdicts(rows, "vanilla")
    assert only(found, "sharper").mark == BETTER
    assert only(found, "blurrier").mark == WORSE
    assert only(found, "sharper").effect > 0
    assert only(found, "sharper").metric == "bits/byte on lm(128) at n=128"


def test_passkey_retrieval_is_a_metric_of_its_own_averaged_over_depths() -> None:
    """Each seed's exact matches over the depths, averaged: a setup that finds the key
    where the baseline does not is better on retrieval, whatever its bits per byte."""

    def probed(label: str, per_seed: list[float], exact: list[list[float]]) -> dict:
        return {**language_row(label, per_seed, 512), "passkey_exact_per_seed": exact}

    rows = [
        probed("vanilla", [2.00, 2.10, 2.05], [[0.0, 0.0, 0.1], [0.0, 0.1, 0.0], [0.0, 0.0, 0.0]]),
        probed("alibi", [2.02, 2.11, 2.06], [[0.5, 1.0, 1.0], [0.4, 1.0, 1.0], [0.6, 0.9, 1.0]]),
    ]
    found = [v for v in verdicts(rows, "vanilla") if v.setup == "alibi"]
    by_metric = {verdict.metric: verdict for verdict in found}
    retrieval = by_metric["passkey exact on lm(128) at n=512"]
    assert retrieval.mark == BETTER and retrieval.pairing == PAIRED
    assert retrieval.difference == pytest.approx((2.5 + 2.4 + 2.5) / 9 - 0.2 / 9)
    assert by_metric["bits/byte on lm(128) at n=512"].mark == SAME


def test_a_missing_baseline_names_the_setups_there_are() -> None:
    rows = [accuracy_row("vanilla", BASELINE), accuracy_row("good", [0.9, 0.97, 0.93])]
    with pytest.raises(MissingBaseline, match=r"'linear'.*good, vanilla"):
        verdicts(rows, "linear")


def cost_rows() -> list[dict]:
    rows = []
    for label in ("vanilla", "good"):
        for n in (64, 256):
            rows.append(measurement(label, "vanilla" if label == "vanilla" else "x", n, "forward"))
            rows.append(
                measurement(label, "vanilla" if label == "vanilla" else "x", n, "forward_backward")
            )
    return rows


def test_the_cost_at_the_same_length_stands_beside_it() -> None:
    rows = [
        *cost_rows(),
        accuracy_row("vanilla", BASELINE),
        accuracy_row("good", [0.9, 0.97, 0.93]),
    ]
    rows.append({**measurement("good", "x", 64, "decode"), "state_bytes": 4096})
    verdict = only(verdicts(rows, "vanilla"), "good")
    assert verdict.cost_length == 64
    # measurement(): vanilla takes 1e-3·n² ms, the others 0.05·n ms: at 64, 3.2 / 4.096
    assert verdict.time_ratio == pytest.approx(3.2 / 4.096)
    assert verdict.efficiency == pytest.approx(0.5)
    assert verdict.state_bytes == 4096
    without = only(verdicts(rows[-3:-1], "vanilla"), "good")
    assert (without.efficiency, without.time_ratio, without.state_bytes) == (None, None, None)


def test_the_command_prints_the_table_and_writes_verdict_csv(tmp_path: Path, capsys) -> None:
    rows = [
        *cost_rows(),
        accuracy_row("vanilla", BASELINE),
        accuracy_row("good", [0.9, 0.97, 0.93]),
    ]
    directory = write_run(tmp_path / "bare", rows)
    with pytest.raises(MissingBaseline, match=r"names no baseline.*good, vanilla"):
        run_verdicts(RunStore(directory))
    directory = write_judged_run(tmp_path / "run", rows)
    arguments = build_parser().parse_args(["verdict", str(directory)])
    assert arguments.handler(Registry(), arguments) == 0
    out = capsys.readouterr().out
    assert "Verdict against vanilla" in out and "better" in out
    with open(directory / VERDICT, newline="") as handle:
        (written,) = list(csv.DictReader(handle))
    assert written["setup"] == "good" and written["mark"] == BETTER
    other = build_parser().parse_args(["verdict", str(directory), "--baseline", "good"])
    other.handler(Registry(), other)
    assert "Verdict against good" in capsys.readouterr().out
    with pytest.raises(MissingBaseline, match="good, vanilla"):
        run_verdicts(RunStore(directory), "nope")


def test_not_measured_costs_are_said_so() -> None:
    console = Console(record=True, width=200)
    rows = [accuracy_row("vanilla", BASELINE), accuracy_row("good", [0.9, 0.97, 0.93])]
    print_verdicts(verdicts(rows, "vanilla"), "vanilla", console)
    assert NOT_MEASURED in console.export_text()


def test_the_scorecard_figure_hatches_the_indistinguishable(tmp_path: Path) -> None:
    rows = [
        accuracy_row("vanilla", BASELINE),
        accuracy_row("good", [0.9, 0.97, 0.93]),
        accuracy_row("copy", BASELINE),
    ]
    directory = write_judged_run(tmp_path / "run", rows)
    figure = scorecard_figure(load_run(directory))
    assert figure is not None
    patches = {
        text.get_text().split("\n")[-1]: patch
        for patch, text in zip(figure.axes[0].patches, figure.axes[0].texts, strict=True)
    }
    assert patches[SAME].get_hatch() == "///"
    assert patches[BETTER].get_hatch() is None
    assert any(path.stem == "scorecard" for path in plot_run(directory))
    assert json.loads(json.dumps(rows))  # the rows stay plain JSON


def test_a_run_with_quality_rows_ends_with_the_verdict(tmp_path: Path, capsys) -> None:
    from playground.cli import main

    spec = tmp_path / "acc.toml"
    spec.write_text(
        'name = "acc"\nmeasures = ["accuracy"]\nbaseline = "vanilla"\n'
        '[[tasks]]\nname = "lookback"\nsteps = 2\nseeds = 2\n'
        '[[variants]]\nname = "vanilla"\n[[variants]]\nname = "linformer"\nseq_len = 64\nk = 4\n'
    )
    assert main(["run", str(spec), "--out", str(tmp_path / "out"), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "Verdict against vanilla" in out
    (directory,) = (tmp_path / "out").glob("acc/*")
    with open(directory / VERDICT, newline="") as handle:
        (written,) = list(csv.DictReader(handle))
    assert written["pairing"] == PAIRED and written["seeds"] == "2"
    assert (directory / "figures" / "scorecard.png").is_file()


def test_a_run_without_a_decode_pass_shows_the_rows_own_decoding_state() -> None:
    """An accuracy row that carries its model's state bytes (recall_state.toml) puts them
    in the verdict's cost column; without them the column says not measured."""
    rows = [
        {**accuracy_row("vanilla", BASELINE), "state_bytes": 65_664.0},
        {**accuracy_row("linear", [0.30, 0.41, 0.33]), "state_bytes": 8_704.0},
        accuracy_row("other", [0.30, 0.41, 0.33]),
    ]
    found = verdicts(rows, "vanilla")
    assert only(found, "linear").state_bytes == 8_704.0
    assert only(found, "other").state_bytes is None
