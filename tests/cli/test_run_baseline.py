"""Issue 42: `playground run SPEC --variants NAME` runs the spec's baseline beside NAME (and
says so), so that the speed-up column has a reference; --no-baseline leaves it out, and a
resume keeps whichever the run started with."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import pytest

from playground.cli import main
from playground.registry import configure
from playground.run import runner as runner_module

SPEC = """
name = "baseline"
seq_lens = [16]
d_model = 16
num_heads = 2
passes = ["forward"]
measures = ["speed"]
baseline = "vanilla"
[timing]
min_run_time = 0.01
[[variants]]
name = "vanilla"
[[variants]]
name = "alibi"
"""


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.fixture(autouse=True)
def _no_gemm(monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)


def run(tmp_path: Path, *flags: str) -> Path:
    spec = tmp_path / "baseline.toml"
    spec.write_text(textwrap.dedent(SPEC))
    out = tmp_path / "results"
    assert main(["run", str(spec), "--out", str(out), "--threads", "1", *flags]) == 0
    configure([])
    (run_dir,) = (out / "baseline").iterdir()
    return run_dir


def cells(run_dir: Path) -> list[str]:
    return [
        json.loads(line)["cell"] for line in (run_dir / "results.jsonl").read_text().splitlines()
    ]


def speedups(run_dir: Path) -> dict[str, str]:
    with (run_dir / "summary.csv").open() as file:
        return {row["label"]: row["speedup_vs_baseline"] for row in csv.DictReader(file)}


def test_one_variant_runs_beside_the_specs_baseline_and_says_so(tmp_path, capsys):
    """The issue's case: `--variants myattn` showed "no baseline run" in the speed-up column."""
    run_dir = run(tmp_path, "--variants", "alibi")
    out = " ".join(capsys.readouterr().out.split())
    assert "also running the spec's baseline vanilla beside --variants" in out
    assert "--no-baseline leaves it out" in out
    assert cells(run_dir) == ["vanilla|n=16|forward", "alibi|n=16|forward"]
    assert float(speedups(run_dir)["alibi"]) > 0
    assert "no baseline run" not in out and "no speed-ups" not in out
    assert json.loads((run_dir / "overrides.json").read_text())["with_baseline"] is True
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "2 cells (0 to run" in capsys.readouterr().out


def test_no_baseline_leaves_it_out_and_says_what_that_costs(tmp_path, capsys):
    run_dir = run(tmp_path, "--variants", "alibi", "--no-baseline")
    out = " ".join(capsys.readouterr().out.split())
    assert "also running" not in out
    assert "baseline 'vanilla' is not among the variants run" in out
    assert cells(run_dir) == ["alibi|n=16|forward"]
    assert speedups(run_dir)["alibi"] == ""
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "1 cells (0 to run" in capsys.readouterr().out
    assert cells(run_dir) == ["alibi|n=16|forward"]


def test_naming_the_baseline_adds_nothing(tmp_path, capsys):
    run_dir = run(tmp_path, "--variants", "vanilla")
    assert "also running" not in capsys.readouterr().out
    assert cells(run_dir) == ["vanilla|n=16|forward"]


def test_a_run_recorded_before_the_default_resumes_without_it(tmp_path, capsys):
    """overrides.json from before `with_baseline`: the run keeps the cells it planned."""
    run_dir = run(tmp_path, "--variants", "alibi", "--no-baseline")
    overrides = json.loads((run_dir / "overrides.json").read_text())
    del overrides["with_baseline"]
    (run_dir / "overrides.json").write_text(json.dumps(overrides))
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "1 cells (0 to run" in capsys.readouterr().out
