"""The time gate times every shared benchmark in paired rounds on the baseline's code and
the working tree, and fails on a slow-down measured twice, and only then: proven with the
paired measurement replaced by a stand-in that returns chosen ratios; the real workers are
proven at a small size (the ratios they measure are not asserted: tests assert no
timings)."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from playground.errors import PlaygroundError
from playground.gates import paired as paired_module
from playground.gates import time as time_gate
from playground.gates.paired import WORKER_FILE, PairedMeasurer, PairedRounds
from playground.report.bench_history import normalised_time, read_saved_run
from tests.gates.saved_runs import save_run

PEAKS = {name: 1 for name in ("vanilla-n512-forward", "longformer-n1024-forward")}
MINS = {"vanilla-n512-forward": 0.014, "longformer-n1024-forward": 0.150}
SLOW = "test_attention[longformer-n1024-forward]"
FAST = "test_attention[vanilla-n512-forward]"
ROOT = Path(__file__).resolve().parents[2]


def rounds(name: str, ratio: float | tuple[float, ...], blocks: int = 9) -> PairedRounds:
    """Paired rounds in which the candidate's code takes `ratio` times the baseline's in
    every block, or the given ratio in each block."""
    ratios = ratio if isinstance(ratio, tuple) else (ratio,) * blocks
    candidate = tuple(0.01 * r for r in ratios for _ in range(2))
    return PairedRounds(name, (0.01,) * len(candidate), candidate)


class Paired:
    """Stands in for the two workers: hands back, per benchmark, the given measurements in
    turn (a ratio for every block, or each block's), 1.0 for a benchmark not named, and
    records what it was asked to time."""

    def __init__(self, **ratios: list[float | tuple[float, ...]]) -> None:
        self.ratios = {f"test_attention[{k.replace('_', '-')}]": v for k, v in ratios.items()}
        self.asked: list[str] = []

    def __call__(self, entry: dict[str, Any]) -> PairedRounds:
        name = entry["name"]
        self.asked.append(name)
        queue = self.ratios.get(name, [1.0])
        return rounds(name, queue.pop(0) if len(queue) > 1 else queue[0])


def gate(storage: Path, candidate: Path, paired: Paired, *extra: str) -> int:
    return time_gate.main([str(storage), "--candidate", str(candidate), *extra], measure=paired)


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    save_run(tmp_path / "store", 1, PEAKS, mins_s=MINS)
    return tmp_path / "store"


@pytest.fixture
def candidate(tmp_path: Path) -> Path:
    return save_run(tmp_path / "candidates", 2, PEAKS, mins_s=MINS)


def test_normalised_time_is_the_median_ratio_to_the_reference_before_each_round(tmp_path):
    run = read_saved_run(save_run(tmp_path, 1, PEAKS, mins_s=MINS, reference_s=0.005))
    entry = {entry["name"]: entry for entry in run.attention_benchmarks()}[SLOW]
    assert normalised_time(entry) == pytest.approx(0.150 / 0.005)
    # A loaded round is divided by its own loaded reference, not by the fastest one.
    entry["extra_info"].update(round_times_s=[0.1, 0.8, 0.2], reference_times_s=[1, 4, 1])
    assert normalised_time(entry) == pytest.approx(0.2)
    del entry["extra_info"]["reference_times_s"]
    assert normalised_time(entry) is None


def test_unchanged_code_passes_and_every_benchmark_is_timed_once(storage, candidate, capsys):
    paired = Paired(longformer_n1024_forward=[1.1])
    assert gate(storage, candidate, paired) == 0
    assert sorted(paired.asked) == [SLOW, FAST]
    out = capsys.readouterr().out
    assert "passed, no slow-down above 30% in 2 benchmarks (slowest " + SLOW + ": +10%)" in out


def test_the_saved_times_are_not_compared(storage, tmp_path, capsys):
    """A candidate run three times slower (a loaded machine while the suite ran) is not a
    slow-down: only the paired rounds are."""
    loaded = save_run(tmp_path / "c", 2, PEAKS, mins_s={n: 3 * s for n, s in MINS.items()})
    assert gate(storage, loaded, Paired()) == 0
    capsys.readouterr()


SPREAD = (1.1, 1.6, 1.5, 1.7, 1.2)
"""Five blocks whose median, 1.5, is slower, but whose interval (1.1 to 1.7) holds 1.3."""


def test_a_clear_slow_down_fails_at_once_in_one_line_per_benchmark(storage, candidate, capsys):
    paired = Paired(longformer_n1024_forward=[1.5])
    assert gate(storage, candidate, paired) == 1
    assert paired.asked.count(SLOW) == 1 and paired.asked.count(FAST) == 1
    captured = capsys.readouterr()
    [line] = [line for line in captured.err.splitlines() if "SLOWER" in line]
    assert line == f"  SLOWER   {SLOW}: +50% (9 blocks)"
    assert "FAILED, 1 of 2 benchmarks more than 30% slower than on abcdef0" in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_a_slow_down_in_doubt_is_measured_until_settled(storage, candidate, capsys):
    paired = Paired(longformer_n1024_forward=[SPREAD, (1.5,) * 5, (1.5,) * 5])
    assert gate(storage, candidate, paired) == 1
    assert paired.asked.count(SLOW) == 3
    assert (
        f"  SLOWER   {SLOW}: +50% (median of 15 blocks in 3 measurements: +50%, +50%, +50%)"
        in capsys.readouterr().err
    )


def test_a_burst_of_load_on_one_measurement_is_outvoted(storage, candidate, capsys):
    paired = Paired(longformer_n1024_forward=[(1.0, 1.05, 1.9, 2.0, 1.0), (1.02,) * 5, (1.02,) * 5])
    assert gate(storage, candidate, paired) == 0
    assert paired.asked.count(SLOW) == 3
    out = capsys.readouterr().out
    assert f"ok       {SLOW}: +2% (median of 15 blocks in 3 measurements: +5%, +2%, +2%)" in out


def test_a_slow_down_measured_under_the_threshold_once_is_measured_again(storage, candidate):
    """Measured +24% (a burst of load on the baseline's rounds), with blocks up to +50%:
    measured again, the median of all blocks fails it, where the first alone passed."""
    paired = Paired(longformer_n1024_forward=[(1.24, 1.1, 1.5, 1.45, 1.2), (1.5,) * 5, (1.5,) * 5])
    assert gate(storage, candidate, paired) == 1
    unchanged = Paired(longformer_n1024_forward=[1.1])  # settled under the threshold: once
    assert gate(storage, candidate, unchanged) == 0 and unchanged.asked.count(SLOW) == 1


def test_measurements_stop_at_the_limit_and_the_median_decides(storage, candidate):
    paired = Paired(longformer_n1024_forward=[SPREAD])  # never settles
    assert gate(storage, candidate, paired) == 1
    assert paired.asked.count(SLOW) == time_gate.MAX_MEASUREMENTS


def test_the_interval_of_five_blocks_is_their_range():
    verdict = time_gate.Verdict(SLOW, [rounds(SLOW, SPREAD)])
    assert verdict.interval == pytest.approx((1.1, 1.7)) and verdict.slowdown == pytest.approx(1.5)
    assert not verdict.settled(0.3) and verdict.settled(0.05) and verdict.settled(0.8)


def test_the_threshold_is_a_setting(storage, candidate):
    assert gate(storage, candidate, Paired(longformer_n1024_forward=[1.2])) == 0
    assert (
        gate(
            storage, candidate, Paired(longformer_n1024_forward=[1.2]), "--threshold-percent", "10"
        )
        == 1
    )


def test_blocks_of_two_pairs_cancel_the_order_of_the_rounds():
    """Rounds ran A B, B A, ...: a round right after the other code's 20 % slower. Per
    pair the ratios are 1.2 and 1/1.2 in turn; per block of two pairs they are 1."""
    baseline = (1.0, 1.2) * 9  # after itself, then after the candidate
    candidate = (1.2, 1.0) * 9
    paired = PairedRounds(SLOW, baseline, candidate)
    assert paired.blocks == pytest.approx([1.0] * 9)
    assert paired.slowdown == pytest.approx(1.0)
    slower = PairedRounds(SLOW, baseline, tuple(1.5 * t for t in candidate))
    assert slower.slowdown == pytest.approx(1.5)
    # The median resists a burst of load on a few rounds of one side.
    burst = list(slower.candidate_s)
    burst[0:4] = [t * 3 for t in burst[0:4]]
    assert PairedRounds(SLOW, baseline, tuple(burst)).slowdown == pytest.approx(1.5)


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
    assert gate(storage, other, Paired()) == 2
    assert message in capsys.readouterr().err


def test_a_baseline_without_its_thread_count_asks_for_a_new_one(tmp_path, capsys):
    for folder in ("store", "candidates"):
        path = save_run(tmp_path / folder, 1, PEAKS, mins_s=MINS)
        data = json.loads(path.read_text())
        for benchmark in data["benchmarks"]:
            del benchmark["extra_info"]["threads"]  # as a run saved before threads were kept
        path.write_text(json.dumps(data))
    assert gate(tmp_path / "store", path, Paired()) == 2
    assert "does not record the threads" in capsys.readouterr().err


def test_nothing_to_compare_is_an_error_not_a_pass(tmp_path, candidate, capsys):
    assert gate(tmp_path / "missing", candidate, Paired()) == 2
    save_run(tmp_path / "store", 1, {"vanilla-n64-forward": 1})
    assert gate(tmp_path / "store", candidate, Paired()) == 2
    assert "share no benchmark" in capsys.readouterr().err


def test_nothing_timed_on_both_codes_is_an_error_not_a_pass(storage, candidate, capsys):
    assert (
        time_gate.main([str(storage), "--candidate", str(candidate)], measure=lambda e: "gone") == 2
    )
    assert "no benchmark could be timed on both codes" in capsys.readouterr().err


def git_repository(path: Path, files: dict[str, str]) -> str:
    """A repository with `files` committed; its commit id."""
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "baseline"], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


BEFORE_THE_GATES_MOVED = {
    "playground/__init__.py": "",
    "tests/benchmarks/paired.py": "",
    "tests/benchmarks/time_gate.py": "",
}
"""A commit from before the gates moved to playground/gates/: its worker module is gone
from the path the time gate starts (`python -m playground.gates.paired`)."""


def test_the_baseline_code_is_exported_from_its_commit(tmp_path):
    repository = tmp_path / "repository"
    commit = git_repository(
        repository, {"plugins/mine.py": "BASELINE = True\n", "playground/gates/paired.py": ""}
    )
    (repository / "plugins" / "mine.py").write_text("BASELINE = False\n")  # the candidate
    code = time_gate.export_commit(commit, commit[:7], tmp_path / "out", repository)
    assert (code / "plugins" / "mine.py").read_text() == "BASELINE = True\n"


@pytest.mark.parametrize(
    ("files", "commit", "message"),
    [
        ({"playground/gates/paired.py": ""}, None, "saved from uncommitted code (abcdef0*)"),
        ({"playground/gates/paired.py": ""}, "0" * 40, "git could not export"),
        ({"plugins/mine.py": ""}, "HEAD", "predates the paired rounds"),
        (BEFORE_THE_GATES_MOVED, "HEAD", "it has no playground/gates/paired.py"),
    ],
    ids=["uncommitted", "unknown-commit", "older-commit", "before-the-gates-moved"],
)
def test_a_baseline_whose_code_cannot_be_timed_says_what_to_do(tmp_path, files, commit, message):
    repository = tmp_path / "repository"
    head = git_repository(repository, files)
    with pytest.raises(PlaygroundError, match="save a new baseline") as raised:
        time_gate.export_commit(
            head if commit == "HEAD" else commit, "abcdef0*", tmp_path / "out", repository
        )
    assert message in str(raised.value)


def test_a_baseline_from_before_the_gates_moved_is_refused_not_timed(
    tmp_path, candidate, capsys, monkeypatch
):
    """Its code has no worker to start: the gate says to save a new baseline (exit 2),
    with no traceback and no worker started."""
    repository = tmp_path / "repository"
    commit = git_repository(repository, BEFORE_THE_GATES_MOVED)
    path = save_run(tmp_path / "store", 1, PEAKS, mins_s=MINS)
    data = json.loads(path.read_text())
    data["commit_info"]["id"] = commit
    path.write_text(json.dumps(data))
    monkeypatch.setattr(
        time_gate, "export_commit", functools.partial(time_gate.export_commit, root=repository)
    )
    monkeypatch.setattr(time_gate, "PairedMeasurer", None)  # started, it would fail loudly
    assert time_gate.main([str(tmp_path / "store"), "--candidate", str(candidate)]) == 2
    captured = capsys.readouterr()
    assert (
        f"time gate: the baseline's commit {commit[:7]} predates the paired rounds this gate "
        f"times with (it has no playground/gates/paired.py); save a new baseline with "
        f"`nox -s bench`" in captured.err
    )
    assert "Traceback" not in captured.out + captured.err


def test_the_gate_refuses_an_uncommitted_baseline(tmp_path, candidate, capsys):
    path = save_run(tmp_path / "store", 1, PEAKS, mins_s=MINS)
    data = json.loads(path.read_text())
    data["commit_info"]["dirty"] = True
    path.write_text(json.dumps(data))
    assert time_gate.main([str(tmp_path / "store"), "--candidate", str(candidate)]) == 2
    assert "saved from uncommitted code (abcdef0*)" in capsys.readouterr().err


def entry(label: str, seq_len: int, pass_name: str) -> dict[str, Any]:
    return {
        "name": f"test_attention[{label}-n{seq_len}-{pass_name}]",
        "params": {"variant": label},
        "extra_info": {"variant": label, "seq_len": seq_len, "pass_name": pass_name},
    }


@pytest.mark.slow
def test_the_workers_time_rounds_on_their_own_code(monkeypatch):
    """The real workers: both on this checkout, one with an injected slow-down (which only
    the candidate's sees). What they measure is load-dependent and not asserted."""
    monkeypatch.setenv("PLAYGROUND_BENCH_INJECT_SLOWDOWN", "vanilla=2")
    with PairedMeasurer(ROOT, ROOT, threads=1, device="cpu") as paired:
        measured = paired.measure(entry("vanilla", 32, "forward"))
        assert isinstance(measured, PairedRounds)
        assert len(measured.blocks) >= paired_module.MIN_BLOCKS and measured.injected is not None
        assert "no variant 'nonexistent'" in paired.measure(entry("nonexistent", 32, "forward"))
        with pytest.raises(PlaygroundError, match="KeyError"):
            paired.baseline.ask(op="build")  # a malformed request: an error, the worker lives
        assert isinstance(paired.measure(entry("vanilla", 32, "forward_backward")), PairedRounds)
        before = (paired.baseline.process.pid, paired.candidate.process.pid)
        assert isinstance(paired.measure(entry("vanilla", 32, "forward_backward")), PairedRounds)
        after = (paired.baseline.process.pid, paired.candidate.process.pid)
        assert set(before).isdisjoint(after)  # measured again: by two new processes


def test_a_worker_that_dies_is_reported_with_its_errors(tmp_path):
    """A worker whose code is missing a module it imports cannot start, and says why."""
    code = tmp_path / "code"
    (code / WORKER_FILE).parent.mkdir(parents=True)
    (code / WORKER_FILE).write_text("import playground_lost_module\n")
    with (
        PairedMeasurer(code, ROOT, threads=1, device="cpu") as paired,
        pytest.raises(PlaygroundError, match=r"benchmark worker on .* ended") as raised,
    ):
        paired.measure(entry("vanilla", 32, "forward"))
    assert "No module named 'playground_lost_module'" in str(raised.value)


@pytest.mark.parametrize(
    "files",
    [{}, {"playground/__init__.py": "", "tests/benchmarks/paired.py": ""}],
    ids=["no-project", "before-the-gates-moved"],
)
def test_a_code_without_its_own_worker_is_refused_before_one_starts(tmp_path, files):
    """Without its own copy of the worker (no project, or a tree from before the gates
    moved), `python -m` there would find the installed checkout's worker instead: no
    worker starts."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    with pytest.raises(PlaygroundError, match=r"has no playground/gates/paired\.py: its code"):
        PairedMeasurer(tmp_path, ROOT, threads=1, device="cpu")
