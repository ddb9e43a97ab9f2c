"""Learned parameters in the report (issue 42): a variant's `learned_summary` hook (no-op
by default) is read from every attention layer after training, written into the row, and
shown in report.md / report.html and under the terminal's accuracy table."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import playground
from playground.errors import HookError
from playground.hook_calls import checked_learned_summary, learned_summaries
from playground.registry import Registry
from playground.report.learned import learned_entries
from playground.report.pages import write_report
from playground.report.tables import print_accuracy, print_language
from playground.run.accuracy import measure_accuracy
from playground.run.jobs import AccuracyJob
from tests.report.test_language_report import lm_row
from tests.report.test_plots import accuracy, write_run

Vanilla = playground.get_variant("vanilla")
Alibi = playground.get_variant("alibi")


def _trained_row(registry: Registry, variant: str, options: dict, layers: int = 1) -> dict:
    job = AccuracyJob(
        variant, options, "lookback", {"seq_len": 12, "offset": 2, "vocab_size": 8},
        steps=6, d_model=16, num_heads=4, num_layers=layers, learning_rate=0.05,
    )  # fmt: skip
    row = measure_accuracy(registry, job, seeds=[0, 1])
    return {
        "cell": f"{variant}|lookback",
        "variant": variant,
        "label": variant,
        "status": "ok",
        **row,
    }


def test_the_hook_is_empty_by_default_and_checked():
    assert Vanilla(16, 2).learned_summary() == {}
    assert learned_summaries(torch.nn.Sequential(Vanilla(16, 2), Vanilla(16, 2))) == {}

    class Learns(Vanilla):
        name = "learns"

        def learned_summary(self):
            return {"temperature": torch.tensor(0.5), "widths": torch.tensor([1.0, 2.0])}

    assert checked_learned_summary(Learns(16, 2)) == {"temperature": 0.5, "widths": [1.0, 2.0]}
    model = torch.nn.Sequential(Vanilla(16, 2), Learns(16, 2))
    assert learned_summaries(model) == {"layer 2": {"temperature": 0.5, "widths": [1.0, 2.0]}}


@pytest.mark.parametrize(
    "summary",
    [[0.5], {"mixing": [[1.0, 0.0], [0.0, 1.0]]}, {"λ": float("nan")}, {3: 1.0}, {"x": "big"}],
    ids=["not_a_dict", "nested", "nan", "name_not_str", "text"],
)
def test_a_bad_summary_is_refused_naming_the_hook(summary):
    broken = type("Broken", (Vanilla,), {"name": "broken", "learned_summary": lambda s: summary})
    with pytest.raises(HookError, match=r"learned_summary\(\).*finite number or a list"):
        checked_learned_summary(broken(16, 2))


def test_shipped_plugins_summarise_what_they_learn():
    slopes = checked_learned_summary(Alibi(16, 4, learnable_slopes=True))
    assert slopes == {"slope m_h per head": [0.25, 0.0625, 0.015625, 0.00390625]}
    assert checked_learned_summary(Alibi(16, 4)) == {}  # the paper's fixed slopes: not learned
    differential = playground.build("differential", 16, 2)
    found = checked_learned_summary(differential)
    assert found["λ (eq. 2)"] == pytest.approx(differential.differential_lambda().item())
    t5 = playground.build("t5_relative", 16, 4)
    table = t5.relative_attention_bias.weight
    assert checked_learned_summary(t5)["bias range over buckets, per head"] == pytest.approx(
        (table.max(0).values - table.min(0).values).tolist()
    )


def test_training_writes_each_seeds_learned_values_into_the_row(bundled_registry):
    row = _trained_row(bundled_registry, "alibi", {"learnable_slopes": True})
    per_seed = row["learned_per_seed"]
    assert len(per_seed) == len(row["seeds"]) == 2
    initial = [0.25, 0.0625, 0.015625, 0.00390625]
    for seed in per_seed:
        trained = seed["layer 1"]["slope m_h per head"]
        assert len(trained) == 4 and trained != pytest.approx(initial)  # they did train
    assert per_seed[0] != per_seed[1]  # each seed its own
    assert "learned_per_seed" not in _trained_row(bundled_registry, "vanilla", {})


def test_the_report_and_the_terminal_show_learned_values(bundled_registry, tmp_path):
    trained = _trained_row(bundled_registry, "differential", {}, layers=2)
    untrained = accuracy("vanilla", "vanilla", "lookback", 0.5)
    untrained["task_label"] = trained["task_label"]
    run_dir = write_run(tmp_path / "run", [trained, untrained])
    entries = learned_entries([trained, untrained])
    lambdas = [entry for entry in entries if entry[3] == "λ (eq. 2)"]
    assert [entry[2] for entry in lambdas] == ["layer 1", "layer 2"]
    seeds = [seed["layer 2"]["λ (eq. 2)"] for seed in trained["learned_per_seed"]]
    assert lambdas[1][4] == f"{sum(seeds) / 2:.3g}"
    assert lambdas[1][5] == "; ".join(f"{value:.3g}" for value in seeds)
    assert not any(entry[0] == "vanilla" for entry in entries)

    _, markdown = write_report(run_dir, [])
    text = markdown.read_text()
    assert "## Learned parameters after training" in text
    assert f"| differential | {trained['task_label']} | layer 2 | λ (eq. 2) |" in text
    console = Console(record=True, width=250, file=io.StringIO())
    print_accuracy([trained, untrained], console)
    printed = console.export_text()
    assert "Learned parameters after training" in printed and lambdas[1][5] in printed


def test_a_table_shared_by_every_layer_is_one_entry():
    shared = {"layer 1": {"range": [0.5, 0.25]}, "layer 2": {"range": [0.5, 0.25]}}
    other = {"layer 1": {"range": [0.7, 0.05]}, "layer 2": {"range": [0.7, 0.05]}}
    row = accuracy("t5", "t5_relative", "copy", 0.5) | {"learned_per_seed": [shared, other]}
    assert learned_entries([row]) == [
        ["t5", "copy(64)", "all 2 (equal)", "range", "[0.6, 0.15]", "[0.5, 0.25]; [0.7, 0.05]"]
    ]


def test_language_rows_show_once_per_setup_and_odd_rows_are_skipped():
    learned = [{"layer 1": {"λ": 0.25}}]
    rows = [lm_row("alibi", "alibi", n, 2.0, learned_per_seed=learned) for n in (128, 256)]
    rows.append(lm_row("vanilla", "vanilla", 128, 2.0, learned_per_seed="junk"))
    rows.append(lm_row("gqa", "gqa", 128, 2.0, learned_per_seed=[{"layer 1": {"λ": "x"}}]))
    assert learned_entries(rows) == [["alibi", "lm(seq_len=128)", "layer 1", "λ", "0.25", "0.25"]]
    console = Console(record=True, width=200, file=io.StringIO())
    print_language(rows, console)
    assert "Learned parameters" in console.export_text()
