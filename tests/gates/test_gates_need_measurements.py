"""A regression gate never passes without having measured something: no baseline, or a
baseline or candidate whose benchmarks hold no measurement (pytest-benchmark disabled by
pytest-xdist, every benchmark skipped, statistics missing), is an error saying what to
run. And the nox sessions that feed the gates run the benchmarks without xdist, fail when
they saved or wrote nothing, and print no notice about uv, which no session uses."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from playground.errors import PlaygroundError
from playground.gates import measured
from playground.gates import memory as memory_gate
from playground.gates import time as time_gate
from playground.gates.paired import PairedRounds
from playground.report.bench_history import is_measured, newest_baseline, plot_history
from tests.gates.saved_runs import save_run

ROOT = Path(__file__).resolve().parents[2]
PEAKS = {"vanilla-n512-forward": 1_048_576, "vanilla-n512-forward_backward": 3_000_000}


def unmeasured(path: Path, how: str) -> Path:
    """The saved run at `path`, rewritten to hold no measurement in the way `how` says."""
    data = json.loads(path.read_text())
    if how == "empty-list":
        data["benchmarks"] = []
    elif how == "stats-missing":
        for benchmark in data["benchmarks"]:
            del benchmark["stats"]
    elif how == "stats-null":
        for benchmark in data["benchmarks"]:
            benchmark["stats"] = None
    elif how == "median-zero":
        for benchmark in data["benchmarks"]:
            benchmark["stats"]["median"] = 0.0
    path.write_text(json.dumps(data))
    return path


HOW = ["empty-list", "stats-missing", "stats-null", "median-zero"]


def never_timed(entry: dict[str, Any]) -> PairedRounds:
    raise AssertionError(f"the time gate timed {entry['name']} against nothing")


def gates(storage: Path, candidate: Path) -> list[int]:
    """Both gates' exit statuses, the way `nox -s bench_compare` runs them."""
    arguments = [str(storage), "--candidate", str(candidate)]
    return [time_gate.main(arguments, measure=never_timed), memory_gate.main(arguments)]


def test_no_baseline_fails_both_gates_saying_what_to_run(tmp_path, capsys):
    candidate = save_run(tmp_path / "candidates", 1, PEAKS)
    (tmp_path / "empty").mkdir()
    for storage in (tmp_path / "missing", tmp_path / "empty"):
        assert gates(storage, candidate) == [2, 2]
        err = capsys.readouterr().err
        assert err.count("so no baseline") == 2, err
        assert err.count("save a baseline with `nox -s bench`") == 2, err


@pytest.mark.parametrize("how", HOW)
def test_a_baseline_with_no_measured_benchmark_fails_both_gates(tmp_path, capsys, how):
    baseline = unmeasured(save_run(tmp_path / "store", 1, PEAKS), how)
    candidate = save_run(tmp_path / "candidates", 2, PEAKS)
    assert gates(tmp_path / "store", candidate) == [2, 2]
    err = capsys.readouterr().err
    assert err.count(f"the baseline {baseline} holds no measured benchmark") == 2, err
    assert "nox -s bench" in err and "pytest-xdist" in err


def test_the_newest_baseline_is_checked_not_an_older_one(tmp_path, capsys):
    """An unmeasured newest run is not passed over for an older one that measured."""
    save_run(tmp_path / "store", 1, PEAKS)
    unmeasured(save_run(tmp_path / "store", 2, PEAKS), "empty-list")
    candidate = save_run(tmp_path / "candidates", 3, PEAKS)
    assert gates(tmp_path / "store", candidate) == [2, 2]
    assert "0002_" in capsys.readouterr().err
    with pytest.raises(PlaygroundError, match="'benchmarks' list is empty"):
        newest_baseline(tmp_path / "store")


@pytest.mark.parametrize("how", HOW)
def test_a_candidate_with_no_measured_benchmark_fails_both_gates(tmp_path, capsys, how):
    save_run(tmp_path / "store", 1, PEAKS)
    candidate = unmeasured(save_run(tmp_path / "candidates", 2, PEAKS), how)
    assert gates(tmp_path / "store", candidate) == [2, 2]
    err = capsys.readouterr().err
    assert err.count(f"the candidate run {candidate} holds no measured benchmark") == 2, err
    assert err.count("nox -s bench_compare") == 2, err


def test_the_memory_gate_between_saved_runs_needs_measurements_too(tmp_path, capsys):
    save_run(tmp_path, 1, PEAKS)
    unmeasured(save_run(tmp_path, 2, PEAKS), "stats-missing")
    assert memory_gate.main([str(tmp_path)]) == 2
    assert "the newest saved run" in capsys.readouterr().err


def test_measured_and_unmeasured_benchmarks_are_told_apart():
    assert is_measured({"stats": {"median": 0.001}})
    for stats in (None, {}, {"median": None}, {"median": 0}, {"median": float("nan")}):
        assert not is_measured({"stats": stats})
    assert not is_measured({"stats": {"median": True}})
    assert not is_measured({})


def test_the_history_draws_only_measured_benchmarks(tmp_path):
    save_run(tmp_path, 1, PEAKS)
    unmeasured(save_run(tmp_path, 2, PEAKS), "stats-missing")  # a KeyError before
    assert plot_history(tmp_path, tmp_path / "history.png").is_file()


@pytest.mark.parametrize("how", [None, *HOW])
def test_the_check_bench_runs_on_what_it_saved(tmp_path, capsys, how):
    run = save_run(tmp_path, 1, PEAKS)
    if how is None:
        assert measured.main(["--role", "baseline", str(run)]) == 0
        assert "2 measured benchmarks" in capsys.readouterr().out
    else:
        assert measured.main(["--role", "baseline", str(unmeasured(run, how))]) == 2
        assert "holds no measured benchmark" in capsys.readouterr().err


# The nox sessions, called with a stand-in for nox's session.


@functools.cache
def _noxfile() -> ModuleType:
    # Loaded once: nox registers every session it defines, and warns when one is
    # registered again.
    spec = importlib.util.spec_from_file_location("project_noxfile", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_noxfile(root: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The project's noxfile as a module, its ROOT moved to `root` so that nothing is
    written to or deleted from the checkout."""
    module = _noxfile()
    monkeypatch.setattr(module, "ROOT", root)
    return module


class SessionError(Exception):
    pass


class Session:
    """Records what a session runs; `effect` does what pytest would have done."""

    def __init__(self, effect=lambda arguments: None) -> None:
        self.posargs: list[str] = []
        self.runs: list[tuple[str, ...]] = []
        self.effect = effect

    def run(self, *arguments: str, **_: object) -> None:
        self.runs.append(arguments)
        self.effect(arguments)

    def error(self, message: str) -> None:
        raise SessionError(message)

    def warn(self, message: str) -> None:
        pass


def test_the_bench_sessions_run_without_xdist(tmp_path, monkeypatch):
    """pyproject's addopts give `-n auto`; under xdist pytest-benchmark disables itself."""
    noxfile = load_noxfile(tmp_path, monkeypatch)
    command = noxfile._bench_command("--benchmark-autosave")
    assert command[command.index("-n") + 1] == "0"
    assert "--benchmark-enable" in command


def test_bench_that_saved_nothing_fails(tmp_path, monkeypatch):
    noxfile = load_noxfile(tmp_path, monkeypatch)
    session = Session()  # pytest ran, and pytest-benchmark saved nothing
    with pytest.raises(SessionError, match=r"nothing was saved to \.benchmarks/"):
        noxfile.bench(session)
    assert len(session.runs) == 1  # the suite, and no check of a run that does not exist


def test_bench_checks_the_run_it_saved(tmp_path, monkeypatch):
    noxfile = load_noxfile(tmp_path, monkeypatch)

    def save(arguments: tuple[str, ...]) -> None:
        if "--benchmark-autosave" in arguments:
            save_run(tmp_path / ".benchmarks", 1, PEAKS)

    session = Session(save)
    noxfile.bench(session)
    assert session.runs[-1][1:5] == ("-m", "playground.gates.measured", "--role", "baseline")
    assert session.runs[-1][5].endswith(".json")


def test_bench_compare_without_a_candidate_fails_and_runs_no_gate(tmp_path, monkeypatch):
    noxfile = load_noxfile(tmp_path, monkeypatch)
    session = Session()  # pytest ran, and pytest-benchmark wrote no candidate
    with pytest.raises(SessionError, match="nothing was compared"):
        noxfile.bench_compare(session)
    assert len(session.runs) == 1


NOXFILE_PROBE = """
import runpy
import sys

import nox

runpy.run_path({noxfile!r})  # the project's noxfile: its sessions and its settings


@nox.session(venv_backend="none")
def probe(session):
    session.run(sys.executable, "-c", "pass")
"""


def test_nox_prints_no_notice_about_uv(tmp_path):
    """nox looks for uv before every session, whatever its backend, and says "uv binary
    not found." when it is absent ($UV pointing nowhere makes sure it is)."""
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text(textwrap.dedent(NOXFILE_PROBE.format(noxfile=str(ROOT / "noxfile.py"))))
    completed = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(noxfile), "-s", "probe"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**_environment(), "UV": str(tmp_path / "no-uv-here")},
        timeout=120,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "Session probe was successful" in output
    assert "uv binary not found" not in output


def _environment() -> dict[str, str]:
    """This process's environment without pytest's and pytest-xdist's variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
