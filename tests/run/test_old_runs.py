"""What the restructure (issue 31) must not change: every shipped spec plans the cells it
planned before (mqar.toml and quick.toml as issue 43 changed them: a learning-rate sweep,
a recall task), and a run directory written by the code before the move still loads,
summarises, plots, reports and resumes (nothing left to measure)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from playground.cli import main
from playground.registry import default_registry
from playground.report.pages import write_report
from playground.report.plots import plot_run
from playground.run.cells import plan
from playground.run.spec_loading import load_spec
from playground.run.store import RunStore

DATA = Path(__file__).parent / "data"
EXPERIMENTS = Path(__file__).parents[2] / "experiments"
PLANNED = json.loads((DATA / "planned_cells_before_31.json").read_text())


@pytest.mark.parametrize("name", sorted(PLANNED))
def test_shipped_specs_plan_the_same_cells(name):
    spec = load_spec(EXPERIMENTS / name, default_registry())
    assert [cell.id for cell in plan(spec)] == PLANNED[name]


def test_every_spec_shipped_before_the_move_is_still_shipped():
    shipped = {path.name for path in EXPERIMENTS.glob("*.toml")}
    assert set(PLANNED) <= shipped
    added = {"lm.toml", "extrapolation.toml", "decode.toml", "hf_llama.toml"}  # 32, 33, 34
    added |= {"mad.toml", "mad_full.toml", "recall_state.toml"}  # 43
    added |= {"long_context.toml"}  # 45
    assert shipped - set(PLANNED) == added


@pytest.fixture
def old_run(tmp_path):
    run_dir = tmp_path / "run_before_31"
    shutil.copytree(DATA / "run_before_31", run_dir)
    return run_dir


def test_a_run_from_before_the_move_loads_plots_and_reports(old_run):
    rows = RunStore(old_run).rows()
    assert len(rows) == 14
    assert {row["status"] for row in rows} == {"ok", "unsupported"}
    written = plot_run(old_run)
    assert {"time_vs_n", "accuracy"} <= {path.stem for path in written}
    html, markdown = write_report(old_run, written)
    assert "linformer" in html.read_text(encoding="utf-8")
    assert markdown.exists()


def test_a_run_from_before_the_move_resumes_with_nothing_to_measure(old_run, capsys):
    before = (old_run / "results.jsonl").read_text()
    assert main(["run", "--resume", str(old_run)]) == 0
    assert (old_run / "results.jsonl").read_text() == before
