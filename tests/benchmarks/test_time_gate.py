"""The time gate fails on a slow-down that every measurement shows, and only then: proven
on synthetic saved runs, with the re-measurement replaced by a stand-in that returns a
chosen run (one real re-measurement, at a smoke size, proves the pytest call)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from playground.bench_history import SavedRun, normalised_time, read_saved_run
from tests.benchmarks import time_gate
from tests.benchmarks.saved_runs import save_run

PEAKS = {name: 1 for name in ("vanilla-n512-forward", "longformer-n1024-forward")}
MINS = {"vanilla-n512-forward": 0.014, "longformer-n1024-forward": 0.150}
SLOW = "test_attention[longformer-n1024-forward]"


class Remeasurements:
    """Stands in for re-running pytest: hands back the given runs in turn (a candidate
    run alone, or a (baseline code, candidate code) pair measured side by side), and
    records which benchmarks it was asked to measure."""

    def __init__(self, *runs: Path | tuple[Path, Path]) -> None:
        self.runs = list(runs)
        self.asked: list[list[str]] = []

    def __call__(self, entries: Sequence[dict[str, Any]]) -> tuple[SavedRun | None, SavedRun]:
        self.asked.append([entry["name"] for entry in entries])
        if not self.runs:
            pytest.fail(f"the gate re-measured {self.asked[-1]} once more than expected")
        run = self.runs.pop(0)
        if isinstance(run, tuple):
            return read_saved_run(run[0]), read_saved_run(run[1])
        return None, read_saved_run(run)


def gate(storage: Path, candidate: Path, remeasure: Remeasurements) -> int:
    return time_gate.main([str(storage), "--candidate", str(candidate)], remeasure=remeasure)


def longformer_times(tmp_path: Path, number: int, factor: float) -> Path:
    """A run of the same code with Longformer `factor` times slower."""
    mins = {**MINS, "longformer-n1024-forward": MINS["longformer-n1024-forward"] * factor}
    return save_run(tmp_path / "candidates", number, PEAKS, mins_s=mins)


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    save_run(tmp_path / "store", 1, PEAKS, mins_s=MINS)
    return tmp_path / "store"


def test_normalised_time_is_the_median_ratio_to_the_reference_before_each_round(tmp_path):
    run = read_saved_run(save_run(tmp_path, 1, PEAKS, mins_s=MINS, reference_s=0.005))
    entry = {entry["name"]: entry for entry in run.attention_benchmarks()}[SLOW]
    assert normalised_time(entry) == pytest.approx(0.150 / 0.005)
    # A loaded round is divided by its own loaded reference, not by the fastest one.
    entry["extra_info"].update(round_times_s=[0.1, 0.8, 0.2], reference_times_s=[1, 4, 1])
    assert normalised_time(entry) == pytest.approx(0.2)
    del entry["extra_info"]["reference_times_s"]
    assert normalised_time(entry) is None


def test_unchanged_code_passes_without_remeasuring(storage, tmp_path, capsys):
    remeasure = Remeasurements()
    assert gate(storage, longformer_times(tmp_path, 2, 1.1), remeasure) == 0
    assert remeasure.asked == []
    assert "passed, no confirmed slow-down above 30% in 2 benchmarks" in capsys.readouterr().out


def test_a_uniformly_slower_machine_is_divided_out(storage, tmp_path, capsys):
    """Every benchmark and the reference matmul three times slower: a loaded machine,
    not slower code, so nothing is even a suspect."""
    loaded = save_run(
        tmp_path / "candidates",
        2,
        PEAKS,
        mins_s={name: 3 * seconds for name, seconds in MINS.items()},
        reference_s=3 * 0.005,
    )
    remeasure = Remeasurements()
    assert gate(storage, loaded, remeasure) == 0
    assert remeasure.asked == []
    # The same raw times against an unchanged reference would make both suspects.
    unloaded = save_run(
        tmp_path / "candidates", 3, PEAKS, mins_s={n: 3 * s for n, s in MINS.items()}
    )
    both = Remeasurements(unloaded, unloaded)
    assert gate(storage, unloaded, both) == 1
    assert both.asked[0] == sorted(f"test_attention[{name}]" for name in MINS)
    capsys.readouterr()


def test_a_confirmed_slow_down_fails_in_one_line_per_benchmark(storage, tmp_path, capsys):
    slower = longformer_times(tmp_path, 2, 1.5)
    remeasure = Remeasurements(
        longformer_times(tmp_path, 3, 1.45), longformer_times(tmp_path, 4, 1.6)
    )
    assert gate(storage, slower, remeasure) == 1
    assert remeasure.asked == [[SLOW], [SLOW]]  # the suspect alone, twice
    captured = capsys.readouterr()
    [line] = [line for line in captured.out.splitlines() if "SLOWER" in line]
    assert line == (
        f"  SLOWER   {SLOW}: +45% in every measurement (against the saved baseline: "
        f"normalised time +50%; working tree re-measured against it: +45%, +60%; "
        f"threshold +30%)"
    )
    assert "FAILED, 1 of 2 benchmarks slower by more than 30% in every measurement" in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_a_slow_down_the_remeasurement_does_not_show_passes(storage, tmp_path, capsys):
    remeasure = Remeasurements(longformer_times(tmp_path, 3, 1.02))
    assert gate(storage, longformer_times(tmp_path, 2, 1.8), remeasure) == 0
    assert remeasure.asked == [[SLOW]]  # cleared at once: no second re-measurement
    out = capsys.readouterr().out
    assert (
        f"  cleared  {SLOW}: +2% measured again (against the saved baseline: normalised time +80%; working tree re-measured against it: +2%;"
        in out
    )
    assert "(1 suspects cleared by re-measuring)" in out


def test_side_by_side_the_baseline_code_under_the_same_load_clears_a_suspect(
    storage, tmp_path, capsys
):
    """Re-measured on both codes at once, both 1.6 times slower in normalised time (a
    load that slows this benchmark more than the reference): not a slow-down."""
    loaded_baseline_code = longformer_times(tmp_path, 3, 1.6)
    loaded_candidate_code = longformer_times(tmp_path, 4, 1.6)
    remeasure = Remeasurements((loaded_baseline_code, loaded_candidate_code))
    assert gate(storage, longformer_times(tmp_path, 2, 1.6), remeasure) == 0
    assert f"{SLOW}: +0% measured again (against the saved baseline: normalised time +60%; " in (
        capsys.readouterr().out
    )


def test_side_by_side_both_figures_must_show_the_slow_down(storage, tmp_path, capsys):
    """Side by side, a normalised time 45 % up with the fastest round only 10 % up (the
    reference happened to meet a quieter moment): not confirmed."""
    baseline_code = save_run(tmp_path / "candidates", 3, PEAKS, mins_s=MINS, reference_s=0.005)
    candidate_mins = {**MINS, "longformer-n1024-forward": 0.165}
    quieter_reference = save_run(
        tmp_path / "candidates", 4, PEAKS, mins_s=candidate_mins, reference_s=0.0038
    )
    remeasure = Remeasurements((baseline_code, quieter_reference))
    assert gate(storage, longformer_times(tmp_path, 2, 1.5), remeasure) == 0
    assert "side by side, normalised time / fastest round: +45% / +10%;" in (
        capsys.readouterr().out
    )


def test_side_by_side_a_slower_candidate_code_fails(storage, tmp_path, capsys):
    baseline_code = longformer_times(tmp_path, 3, 1.0)
    slower_code = longformer_times(tmp_path, 4, 1.5)
    remeasure = Remeasurements((baseline_code, slower_code), (slower_code, slower_code))
    assert gate(storage, longformer_times(tmp_path, 2, 1.5), remeasure) == 0  # cleared 2nd
    remeasure = Remeasurements((baseline_code, slower_code), (baseline_code, slower_code))
    assert gate(storage, longformer_times(tmp_path, 5, 1.5), remeasure) == 1
    assert (
        "+50% in every measurement (against the saved baseline: normalised time +50%; side by "
        "side, normalised time / fastest round: +50% / +50%, +50% / +50%; threshold +30%)"
    ) in capsys.readouterr().out


def test_the_baseline_code_is_exported_from_its_commit(tmp_path):
    repository = tmp_path / "repository"
    (repository / "plugins").mkdir(parents=True)
    (repository / "plugins" / "mine.py").write_text("BASELINE = True\n")
    git = ["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "baseline"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    (repository / "plugins" / "mine.py").write_text("BASELINE = False\n")  # the candidate
    path = save_run(tmp_path / "store", 1, PEAKS, mins_s=MINS)
    data = json.loads(path.read_text())
    data["commit_info"] = {"id": commit.stdout.strip(), "dirty": False}
    path.write_text(json.dumps(data))
    with time_gate.SideBySide(read_saved_run(path), repository) as side_by_side:
        code = side_by_side._baseline_code()
        assert code is not None and code != repository
        assert (code / "plugins" / "mine.py").read_text() == "BASELINE = True\n"
    assert not code.exists()  # removed when the gate is done
    data["commit_info"]["dirty"] = True
    path.write_text(json.dumps(data))
    with time_gate.SideBySide(read_saved_run(path), repository) as side_by_side:
        assert side_by_side._baseline_code() is None
        assert f"saved from uncommitted code ({commit.stdout[:7]}*)" in side_by_side.note
        assert "commit before `nox -s bench`" in side_by_side.note


def test_the_second_remeasurement_can_clear_a_suspect(storage, tmp_path):
    remeasure = Remeasurements(
        longformer_times(tmp_path, 3, 1.7), longformer_times(tmp_path, 4, 1.1)
    )
    assert gate(storage, longformer_times(tmp_path, 2, 1.7), remeasure) == 0
    assert remeasure.asked == [[SLOW], [SLOW]]


def test_the_threshold_is_a_setting(storage, tmp_path):
    candidate = longformer_times(tmp_path, 2, 1.2)
    assert gate(storage, candidate, Remeasurements()) == 0  # 20 % is under the default 30
    again = longformer_times(tmp_path, 3, 1.2)
    arguments = [str(storage), "--candidate", str(candidate), "--threshold-percent", "10"]
    assert time_gate.main(arguments, remeasure=Remeasurements(again, again)) == 1


@pytest.mark.parametrize(
    ("candidate", "message"),
    [
        (dict(torch_threads=4), "not comparable (torch_threads 2 -> 4)"),
        (dict(threads=4), "different thread counts (2 -> 4); set PLAYGROUND_BENCH_THREADS=2"),
        (dict(system="Darwin"), "not comparable (system 'Linux' -> 'Darwin')"),
        (dict(torch_version="2.14.0"), "not comparable (torch_version '2.13.0' -> '2.14.0')"),
    ],
    ids=["machine-info-threads", "benchmark-threads", "system", "torch"],
)
def test_runs_that_differ_are_not_compared(storage, tmp_path, capsys, candidate, message):
    other = save_run(tmp_path / "candidates", 2, PEAKS, mins_s=MINS, **candidate)
    assert gate(storage, other, Remeasurements()) == 2
    assert message in capsys.readouterr().err


def test_a_baseline_without_reference_timings_asks_for_a_new_one(tmp_path, capsys):
    old = save_run(tmp_path / "store", 1, PEAKS, mins_s=MINS)
    data = json.loads(old.read_text())
    for entry in data["benchmarks"]:
        del entry["extra_info"]["reference_times_s"]  # as the suite saved them before
    old.write_text(json.dumps(data))
    assert gate(tmp_path / "store", longformer_times(tmp_path, 2, 1.0), Remeasurements()) == 2
    assert "saved without the reference timings" in capsys.readouterr().err


def test_nothing_to_compare_is_an_error_not_a_pass(tmp_path, capsys):
    candidate = longformer_times(tmp_path, 2, 1.0)
    assert gate(tmp_path / "missing", candidate, Remeasurements()) == 2
    save_run(tmp_path / "store", 1, {"vanilla-n64-forward": 1})
    assert gate(tmp_path / "store", candidate, Remeasurements()) == 2
    assert "share no benchmark" in capsys.readouterr().err


@pytest.mark.slow
def test_remeasuring_runs_the_suspects_alone(tmp_path):
    """The real re-measurement: pytest on the suspects' node ids, at their length."""
    suspect = read_saved_run(save_run(tmp_path, 1, {"vanilla-n32-forward": 1}))
    [entry] = suspect.attention_benchmarks()
    remeasured = time_gate.measure_with_pytest([entry], max_time_s=0.05)
    [again] = remeasured.attention_benchmarks()
    assert again["name"] == "test_attention[vanilla-n32-forward]"
    assert normalised_time(again) > 0
    assert again["extra_info"]["threads"] == remeasured.machine_info["torch_threads"]
    assert "peak_memory_bytes" not in again["extra_info"]  # time only: no profiling
