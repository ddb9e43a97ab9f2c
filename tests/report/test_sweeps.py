"""Sweeps decided (issue 43 part 1) on synthetic rows whose truth is known: the point is
chosen on validation, never on test; bits per byte choose the lowest; the points within
the best one's interval are counted; a failed point is shown, not chosen; the tables,
the verdict and the figures read the chosen point only, under the sweep's label."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from playground.cli import main
from playground.report.pages import write_report
from playground.report.plots import load_run, plot_run
from playground.report.plots.sweeps import sweep_figure, swept_key
from playground.report.suite_tables import (
    print_sweeps,
    sweep_entries,
)
from playground.report.sweeps import (
    SWEEPS,
    SweepPointMissing,
    at_point,
    best_at,
    choices,
    chosen_rows,
    write_sweeps,
)
from playground.report.verdict import BETTER, VERDICT, WORSE, verdicts
from playground.run.store import RunStore
from tests.report.test_verdict import write_judged_run

SWEEP = "recall(64)"


def point(
    label: str,
    lr: float,
    validation: list[float],
    test: list[float],
    *,
    metric: str = "accuracy",
    status: str = "ok",
    **grid: Any,
) -> dict[str, Any]:
    """One grid point's row, as the runner writes it (`learning_rate=lr` plus `grid`)."""
    point_grid = {"learning_rate": lr, **grid}
    tag = " ".join(f"{k}={v}" for k, v in point_grid.items())
    row: dict[str, Any] = {
        "cell": f"{label}|task={SWEEP} {tag}",
        "variant": label.split("(")[0],
        "label": label,
        "options": {},
        "task": "recall",
        "task_options": {"seq_len": 64},
        "task_label": f"{SWEEP} {tag}",
        "sweep": SWEEP,
        "grid": point_grid,
        "seeds": [0, 1, 2],
        "status": status,
        "error": None if status == "ok" else "diverged",
    }
    if status != "ok":
        return row
    mean = sum(validation) / len(validation)
    spread = max(validation) - min(validation)
    row.update(
        validation_metric=metric,
        validation_mean=mean,
        validation_ci95=spread,
        validation_per_seed=validation,
    )
    if metric == "accuracy":
        row.update(accuracy_mean=sum(test) / len(test), accuracy_per_seed=test, accuracy_ci95=0.01)
    else:
        row.update(
            metric=metric,
            train_length=64,
            eval_length=64,
            bits_per_byte_mean=sum(test) / len(test),
            bits_per_byte_per_seed=test,
            corpus_fingerprint="c" * 64,
        )
    return row


def grid_rows() -> list[dict[str, Any]]:
    """vanilla: flat across the grid, best on validation at 1e-3. linear: a narrow window
    at 3e-3; at 1e-2 its *test* score is the best of all, its validation poor (a choice
    made on test would take it)."""
    return [
        point("vanilla", 1e-3, [0.96, 0.97, 0.98], [0.95, 0.96, 0.97]),
        point("vanilla", 3e-3, [0.95, 0.96, 0.97], [0.96, 0.97, 0.98]),
        point("vanilla", 1e-2, [0.945, 0.955, 0.965], [0.94, 0.95, 0.96]),
        point("linear", 1e-3, [0.30, 0.31, 0.32], [0.30, 0.31, 0.32]),
        point("linear", 3e-3, [0.60, 0.61, 0.62], [0.58, 0.59, 0.60]),
        point("linear", 1e-2, [0.40, 0.41, 0.42], [0.99, 0.99, 0.99]),
        point("linear", 3e-2, [], [], status="error"),
    ]


def by_setup(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {choice.setup: choice for choice in choices(rows)}


def test_the_point_is_chosen_on_validation_not_on_test() -> None:
    found = by_setup(grid_rows())
    assert found["vanilla"].chosen["grid"] == {"learning_rate": 1e-3}
    assert found["linear"].chosen["grid"] == {"learning_rate": 3e-3}  # test would say 1e-2
    assert len(found["linear"].points) == 4 and len(found["linear"].scored) == 3


def test_the_points_within_the_best_ones_interval_are_counted() -> None:
    found = by_setup(grid_rows())
    # vanilla's best: 0.97 ± 0.02, and 0.96 and 0.955 lie within it; linear's 0.61 ± 0.02 alone
    assert found["vanilla"].within == 3
    assert found["linear"].within == 1


def test_bits_per_byte_choose_the_lowest() -> None:
    rows = [
        point("vanilla", 1e-3, [2.0, 2.1, 2.2], [2.0, 2.1, 2.2], metric="bits_per_byte"),
        point("vanilla", 3e-3, [1.5, 1.6, 1.7], [1.9, 2.0, 2.1], metric="bits_per_byte"),
    ]
    (choice,) = choices(rows)
    assert choice.chosen["grid"]["learning_rate"] == 3e-3
    assert choice.eval_length == 64


def test_a_sweep_whose_every_point_failed_keeps_a_row_that_says_why() -> None:
    rows = [point("vanilla", 1e-3, [], [], status="error")]
    (choice,) = choices(rows)
    assert choice.chosen is None and choice.within == 0
    (kept,) = chosen_rows(rows)
    assert kept["status"] == "error" and kept["task_label"] == SWEEP
    assert "diverged" in " ".join(sweep_entries([choice])[0])


def test_chosen_rows_keep_one_row_per_setup_under_the_sweeps_label() -> None:
    other = {"cell": "vanilla|task=lookback", "task": "lookback", "label": "vanilla"}
    kept = chosen_rows([*grid_rows(), other])
    assert [row["label"] for row in kept] == ["vanilla", "linear", "vanilla"]
    vanilla, linear, untouched = kept
    assert vanilla["task_label"] == linear["task_label"] == SWEEP
    assert linear["grid"] == {"learning_rate": 3e-3} and linear["chosen_from"] == 4
    assert untouched is other  # a row outside any sweep is passed through as it is


def test_the_verdict_compares_the_chosen_points_on_one_metric() -> None:
    found = verdicts(grid_rows(), "vanilla")
    (linear,) = found
    assert linear.metric == f"accuracy on {SWEEP}"
    assert linear.difference < -0.3 and linear.mark == WORSE  # 0.59 against 0.96
    # chosen on test instead, linear's 0.99 would have been marked better:
    test_chosen = [row for row in grid_rows() if row["grid"]["learning_rate"] != 3e-3]
    assert verdicts(test_chosen, "vanilla")[0].mark == BETTER


def test_the_profile_takes_each_learning_rates_best_point() -> None:
    rows = [
        point("vanilla", 1e-3, [0.5, 0.5, 0.5], [0.5] * 3, weight_decay=0.0),
        point("vanilla", 1e-3, [0.7, 0.7, 0.7], [0.7] * 3, weight_decay=0.1),
        point("vanilla", 1e-2, [0.6, 0.6, 0.6], [0.6] * 3, weight_decay=0.0),
    ]
    (choice,) = choices(rows)
    assert swept_key(choice) == "learning_rate"
    profile = [(x, round(y, 9), chosen) for x, y, _, chosen in best_at(choice, "learning_rate")]
    assert profile == [(1e-3, 0.7, True), (1e-2, 0.6, False)]


def test_the_run_writes_sweeps_csv_prints_the_table_and_draws_the_figure(tmp_path: Path) -> None:
    directory = write_judged_run(tmp_path / "run", grid_rows())
    store = RunStore.existing(directory)
    write_sweeps(store)
    records = list(csv.DictReader(io.StringIO(store.path(SWEEPS).read_text())))
    assert len(records) == 7
    assert [r["grid"] for r in records if r["chosen"] == "True"] == [
        "learning_rate=0.001",
        "learning_rate=0.003",
    ]
    console = Console(file=io.StringIO(), width=200)
    print_sweeps(store.rows(), console)
    printed = console.file.getvalue()
    assert "learning_rate=0.003" in printed and "1 of 4" in printed and "3 of 3" in printed
    run = load_run(directory)
    assert [row["task_label"] for row in run.accuracy] == [SWEEP, SWEEP]
    assert sweep_figure(run) is not None
    written = plot_run(directory)
    assert any(path.stem == "sweeps" for path in written)
    _, markdown = write_report(directory, written)
    report = markdown.read_text()
    assert "Sweeps: each setup's point chosen on validation" in report
    assert "learning_rate=0.003" in report and "1 of 4" in report


def test_a_swept_zero_is_drawn_where_it_was_chosen(tmp_path: Path) -> None:
    # weight decay alone swept, best at 0.0: a log x axis would drop that point and its ring
    rows = [
        point("vanilla", 1e-3, [0.9, 0.91, 0.92], [0.9] * 3, weight_decay=0.0),
        point("vanilla", 1e-3, [0.5, 0.51, 0.52], [0.5] * 3, weight_decay=0.1),
    ]
    for row in rows:
        row["cell"] += f" weight_decay={row['grid']['weight_decay']}"
    figure = sweep_figure(load_run(write_judged_run(tmp_path / "run", rows)))
    assert figure is not None
    axes = figure.axes[0]
    assert axes.get_xlabel() == "weight decay" and axes.get_xscale() == "linear"
    low, high = axes.get_xlim()
    assert low < 0.0 < 0.1 < high


def test_a_run_without_a_sweep_draws_no_sweep_figure(tmp_path: Path) -> None:
    rows = [{**row, "grid": {}} for row in grid_rows()]
    run = load_run(write_judged_run(tmp_path / "run", rows))
    assert run.sweeps == [] and sweep_figure(run) is None


def test_a_verdict_held_at_one_grid_point_is_what_one_learning_rate_would_say() -> None:
    held = verdicts(at_point(grid_rows(), {"learning_rate": "1e-2"}), "vanilla")
    assert held[0].mark == BETTER  # at 1e-2 alone linear looks better; chosen, it is worse
    assert verdicts(at_point(grid_rows(), {}), "vanilla")[0].mark == WORSE
    with pytest.raises(SweepPointMissing, match=r"learning_rate: 0\.001, 0\.003, 0\.01, 0\.03"):
        at_point(grid_rows(), {"learning_rate": "5e-3"})


def test_the_verdict_command_holds_sweeps_at_a_point_and_leaves_verdict_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = write_judged_run(tmp_path / "run", grid_rows())
    assert main(["verdict", str(directory)]) == 0
    written = (directory / VERDICT).read_text()
    assert main(["verdict", str(directory), "--at", "learning_rate=0.01"]) == 0
    printed = capsys.readouterr().out
    assert "every sweep at learning_rate=0.01" in printed and "better" in printed
    assert (directory / VERDICT).read_text() == written  # the run's own verdict stays
    assert main(["verdict", str(directory), "--at", "lr"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_a_non_finite_validation_score_is_never_chosen() -> None:
    rows = grid_rows()[:3]
    rows[0] = {**rows[0], "validation_mean": float("nan")}
    (choice,) = choices(rows)
    assert choice.chosen is rows[1] and len(choice.scored) == 2
