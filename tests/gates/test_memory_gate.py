"""The memory gate fails on any growth of a saved peak memory, and only then: proven on
synthetic saved runs in pytest-benchmark's storage layout."""

from __future__ import annotations

import subprocess
import sys

import pytest

from playground.gates import memory as memory_gate
from tests.gates.saved_runs import save_run

BASE = {"vanilla-n512-forward": 1_048_576, "linformer-n512-forward_backward": 3_000_000}


def test_unchanged_memory_passes(tmp_path, capsys):
    save_run(tmp_path, 1, BASE)
    save_run(tmp_path, 2, BASE)
    assert memory_gate.main([str(tmp_path)]) == 0
    assert "passed, no growth in 2 benchmarks" in capsys.readouterr().out


def test_one_byte_of_growth_fails_and_names_the_benchmark(tmp_path, capsys):
    save_run(tmp_path, 1, BASE)
    save_run(tmp_path, 2, {**BASE, "vanilla-n512-forward": 1_048_577})
    assert memory_gate.main([str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "GREW  test_attention[vanilla-n512-forward]: 1,048,576 -> 1,048,577 bytes" in (
        captured.out
    )
    assert "FAILED, 1 of 2 benchmarks grew" in captured.err


def test_shrinking_passes_and_is_reported(tmp_path, capsys):
    save_run(tmp_path, 1, BASE)
    save_run(tmp_path, 2, {**BASE, "linformer-n512-forward_backward": 2_000_000})
    assert memory_gate.main([str(tmp_path)]) == 0
    assert "shrank  test_attention[linformer-n512-forward_backward]" in capsys.readouterr().out


def test_compares_the_newest_run_with_the_one_just_before_it(tmp_path):
    save_run(tmp_path, 1, {**BASE, "vanilla-n512-forward": 1})  # an old, smaller baseline
    save_run(tmp_path, 2, BASE)
    save_run(tmp_path, 3, BASE)
    save_run(tmp_path, 4, BASE, machine="Darwin-CPython-3.12-64bit")  # another machine's
    with pytest.raises(memory_gate.PlaygroundError, match=r"only one saved run in .*Darwin"):
        memory_gate.baseline_and_latest(memory_gate.load_saved_runs(tmp_path))
    save_run(tmp_path, 5, {**BASE, "vanilla-n512-forward": 2_000_000})
    previous, latest = memory_gate.baseline_and_latest(memory_gate.load_saved_runs(tmp_path))
    assert (previous.path.name[:4], latest.path.name[:4]) == ("0003", "0005")
    assert memory_gate.main([str(tmp_path)]) == 1


def test_candidate_is_checked_against_the_newest_saved_run(tmp_path, capsys):
    """bench_compare's mode: the candidate (--benchmark-json) is not in the storage, so
    the baseline `nox -s bench` saved stays the baseline however often it runs."""
    storage = tmp_path / "store"
    save_run(storage, 1, {**BASE, "vanilla-n512-forward": 1})
    save_run(storage, 2, BASE)
    same = save_run(tmp_path / "candidates", 3, BASE)
    grown = save_run(tmp_path / "candidates", 4, {**BASE, "vanilla-n512-forward": 1_048_580})
    assert memory_gate.main([str(storage), "--candidate", str(same)]) == 0
    assert memory_gate.main([str(storage), "--candidate", str(grown)]) == 1
    assert "1,048,576 -> 1,048,580 bytes (+4" in capsys.readouterr().out
    assert memory_gate.main([str(tmp_path / "empty"), "--candidate", str(grown)]) == 2


def test_new_benchmarks_are_not_compared(tmp_path):
    save_run(tmp_path, 1, BASE)
    save_run(tmp_path, 2, {**BASE, "myattn-n512-forward": 10**9})
    assert memory_gate.main([str(tmp_path)]) == 0


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda s: save_run(s, 1, BASE), "only one saved run"),
        (lambda s: None, "no saved benchmark runs"),
        (
            lambda s: (save_run(s, 1, BASE), save_run(s, 2, BASE, torch_threads=4)),
            "not comparable (torch_threads 2 -> 4)",
        ),
        (
            lambda s: (save_run(s, 1, BASE), save_run(s, 2, {"vanilla-n64-forward": 1})),
            "share no benchmark",
        ),
    ],
    ids=["one-run", "empty", "threads-differ", "nothing-in-common"],
)
def test_no_valid_baseline_is_an_error_not_a_pass(tmp_path, capsys, setup, message):
    (tmp_path / "store").mkdir()
    setup(tmp_path / "store")
    assert memory_gate.main([str(tmp_path / "store")]) == 2
    assert message in capsys.readouterr().err


def test_script_exit_status(tmp_path):
    """The way `nox -s bench_compare` runs it: as a script, its exit status the verdict."""
    save_run(tmp_path, 1, BASE)
    save_run(tmp_path, 2, {**BASE, "vanilla-n512-forward": 2_000_000})
    completed = subprocess.run(
        [sys.executable, "-m", "playground.gates.memory", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "+951,424" in completed.stdout
