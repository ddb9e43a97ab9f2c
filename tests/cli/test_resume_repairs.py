"""Issue 42: rows a resume must restore, and what it must not do.

- A row `playground eval` wrote and a crash cut short: `--resume` used to accept the file
  without a word and run 0 cells, `playground repair` promised the row would be measured
  again, and it stayed lost. Now the resume says the line was cut, sets it aside and scores
  that length again; repair says what the resume will do.
- A row a cell writes beside its own (an evaluation length of the spec) cut by a crash:
  the cell ran as done and the row stayed lost; now the cell runs again and writes only
  what is missing.
- A resume with nothing to run builds no native kernels (it took 98 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from playground.cli import main
from playground.kernels import native
from playground.registry import configure
from playground.run import runner as runner_module
from playground.run.store import EVALUATIONS, REJECTED, RunStore
from tests.cli import test_eval_command as lm_run

L = lm_run.L


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.fixture(autouse=True)
def _no_gemm(monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    """A tiny LM run that kept its weights, then `playground eval` at 4L (its last row)."""
    root = tmp_path_factory.mktemp("evaluated")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)
        run_dir = lm_run.train(root, "--save-weights")
        assert main(["eval", str(run_dir), "--eval-lengths", str(4 * L)]) == 0
    configure([])
    return run_dir


@pytest.fixture
def run_dir(evaluated: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    copy.mkdir()
    for path in evaluated.rglob("*"):
        if path.is_file() and "figures" not in path.parts:
            target = copy / path.relative_to(evaluated)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    return copy


def cells(run_dir: Path) -> list[str]:
    return [row["cell"] for row in RunStore(run_dir).rows()]


def cut_last_line(run_dir: Path) -> str:
    """Cut results.jsonl's last row in half, as a crash while writing it does; its cell."""
    path = run_dir / "results.jsonl"
    *whole, last = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(whole) + last[: len(last) // 2])
    return json.loads(last)["cell"]


def said(capsys) -> str:
    out, err = capsys.readouterr()
    return " ".join((out + err).split())


def test_a_resume_says_an_eval_row_was_cut_and_scores_it_again(run_dir, capsys):
    lost = cut_last_line(run_dir)
    assert lost.endswith(f"|eval_len={4 * L}")
    assert lost not in cells(run_dir)
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 0
    out = said(capsys)
    assert "line 3 was cut short (a crash while it was written)" in out
    assert f"1 `playground eval` row(s) at {4 * L} to score again" in out
    assert cells(run_dir)[-1] == lost
    (row,) = [row for row in RunStore(run_dir).rows() if row["cell"] == lost]
    assert row["status"] == "ok" and row["eval_length"] == 4 * L and row["bits_per_byte_mean"] > 0
    assert len(cells(run_dir)) == len(set(cells(run_dir))) == 3
    assert json.loads((run_dir / REJECTED).read_text())["line"] == 3


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "run-before-the-record"])
def test_repair_says_what_the_resume_will_do_and_it_does(run_dir, capsys, recorded):
    """The issue's sequence: repair, then resume. A run evaluated before evaluations.json
    existed has the length in the line set aside."""
    if not recorded:
        (run_dir / EVALUATIONS).unlink()
    lost = cut_last_line(run_dir)
    capsys.readouterr()
    assert main(["repair", str(run_dir)]) == 0
    out = said(capsys)
    assert f"scores 1 `playground eval` row(s) at {4 * L} again" in out
    assert "measures" not in out  # no cell of the spec lacks a row
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "cut short" not in said(capsys)  # repair set it aside already
    assert cells(run_dir)[-1] == lost


def test_a_resume_with_nothing_missing_scores_nothing(run_dir, capsys):
    before = (run_dir / "results.jsonl").read_bytes()
    assert main(["run", "--resume", str(run_dir)]) == 0
    out = said(capsys)
    assert "0 to run," in out and "score again" not in out
    assert (run_dir / "results.jsonl").read_bytes() == before


def test_a_cut_row_beside_a_cells_own_is_measured_again_and_only_it(run_dir, capsys):
    """The row the spec's eval_lengths wrote at 2L, cut: its cell runs again, and writes
    the row at 2L alone (its own row is there)."""
    path = run_dir / "results.jsonl"
    own, beside, _ = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(own + beside[:40])
    (run_dir / EVALUATIONS).unlink()  # leave the evaluation at 4L out of it
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 0
    out = said(capsys)
    assert "1 cells (1 to run" in out and "cut short" in out
    assert cells(run_dir) == [json.loads(own)["cell"], json.loads(beside)["cell"]]


def test_repair_names_a_line_it_cannot_tell_the_cell_of(run_dir, capsys):
    path = run_dir / "results.jsonl"
    *whole, last = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(whole) + last[:5])  # cut before "cell"
    (run_dir / EVALUATIONS).unlink()
    capsys.readouterr()
    assert main(["repair", str(run_dir)]) == 0
    out = said(capsys)
    assert "nothing is missing" in out
    assert "line(s) 3 name no cell: if `playground eval` wrote them, run it again" in out


def test_a_resume_with_nothing_to_run_builds_no_native_kernels(run_dir, monkeypatch, capsys):
    def no_build():
        raise AssertionError("the native kernels were built for a resume with nothing to run")

    monkeypatch.setattr(native, "build_state", no_build)
    monkeypatch.setattr(native, "load", no_build)
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "0 to run," in said(capsys)


def test_a_resume_with_cells_to_run_builds_them_first(tmp_path, monkeypatch, capsys):
    """The build still happens where a cell may use the kernels (the executor asks first,
    and training asks again: later asks return the first answer)."""
    run_dir = lm_run.train(tmp_path)
    path = run_dir / "results.jsonl"
    path.write_bytes(path.read_bytes().splitlines(keepends=True)[0][:30])
    builds = []
    monkeypatch.setattr(native, "build_state", lambda: builds.append(1))
    assert main(["run", "--resume", str(run_dir), "--accuracy-workers", "1"]) == 0
    assert builds  # asked for; a build happens on the first ask only


def test_eval_after_a_crash_says_it_set_the_cut_line_aside(run_dir, capsys):
    lost = cut_last_line(run_dir)
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--eval-lengths", str(8 * L)]) == 0
    out = said(capsys)
    assert "line 3 was cut short (a crash while it was written)" in out
    assert f"`playground run --resume {run_dir}` measures its row again" in out
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert lost in cells(run_dir) and f"|eval_len={8 * L}" in cells(run_dir)[2]
