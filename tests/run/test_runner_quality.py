"""How sure a run's numbers are, said beside them: timed runs and spread, flags for a
large spread, an efficiency above 1, a non-finite flops() and a busy machine, the GEMM
ceiling measured more than once, exponents with their error, a baseline that was not
run, and one process at a time per run directory. Rows written before these fields
existed keep loading, summarising and resuming."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

import playground.run.measurer as measurer_module
import playground.run.runner as runner_module
from playground.registry import Registry, configure
from playground.report.summary import summarize, write_summary
from playground.report.tables import exponent_entries, print_summary, summary_entries
from playground.run.fidelity import CAUSAL_REFERENCE
from playground.run.instruments import (
    FLAG_BUSY,
    FLAG_EFFICIENCY_ABOVE_1,
    FLAG_FEW_RUNS,
    FLAG_FLOPS_NOT_FINITE,
    FLAG_LARGE_SPREAD,
    FLAG_PASS_ORDER,
)
from playground.run.runner import Runner
from playground.run.spec_loading import load_spec
from playground.run.spec_overrides import apply_overrides, size_overrides
from playground.run.store import LOCK, RunLocked, RunStore

TINY = """
    name = "tiny"
    seq_lens = [16]
    d_model = 32
    num_heads = 2
    passes = ["forward"]
    measures = ["speed"]
    baseline = "vanilla"

    [timing]
    min_run_time = 0.01
"""

OVERFLOW = """
    import playground

    Vanilla = playground.get_variant("vanilla")

    class Overflow(Vanilla):
        name = "overflow"
        summary = "vanilla whose flops() overflows past the registry's probe"

        @classmethod
        def flops(cls, n_q, n_k, *args, **options):
            return float("inf") if n_q >= 128 else super().flops(n_q, n_k, *args, **options)

    @playground.hookimpl
    def register_attention(register):
        register(Overflow)
"""


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.fixture
def registry(write_plugin):
    path = write_plugin("overflow.py", OVERFLOW)
    return Registry.discover([path.parent], entry_points=False)


@pytest.fixture
def fixed_gemm(monkeypatch):
    """A GEMM ceiling that costs nothing: these tests look at what is done with it."""
    values = iter([1e11, 3e11, 3e11, 3e11])
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: next(values))


def make_runner(registry, tmp_path, console=None, **overrides):
    path = tmp_path / "spec.toml"
    path.write_text(textwrap.dedent(TINY))
    spec = load_spec(str(path), registry, size_overrides(overrides))
    spec = apply_overrides(spec, registry, overrides)
    store = RunStore.create(tmp_path / "results", spec.name)
    return Runner(spec, registry, store, console or Console(file=io.StringIO())), store


def test_a_timed_row_has_a_spread_load_and_flags(registry, tmp_path, fixed_gemm, monkeypatch):
    monkeypatch.setattr(runner_module, "load_average", lambda: 99.0)  # env.json's
    monkeypatch.setattr(measurer_module, "load_average", lambda: 99.0)  # the row's
    runner, store = make_runner(registry, tmp_path, variants=["vanilla"])
    runner.start()
    runner.measure_pending()
    (row,) = store.rows()
    assert row["timed_runs"] >= 3 and row["time_iqr_ms"] is not None
    assert row["load_average"] == 99.0 and row["cores"] >= 1
    assert FLAG_BUSY in row["flags"]
    env = json.loads(store.path("env.json").read_text())
    assert "load_average" in env and env["cores"] >= 1


def test_an_efficiency_above_one_is_flagged(registry, tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1.0)
    runner, store = make_runner(registry, tmp_path, variants=["vanilla"])
    runner.start()
    runner.measure_pending()
    (row,) = store.rows()
    assert row["efficiency"] > 1 and FLAG_EFFICIENCY_ABOVE_1 in row["flags"]
    (line,) = write_summary(store, "vanilla")
    assert FLAG_EFFICIENCY_ABOVE_1 in line.flags and line.flags in summary_entries(line)


def test_a_flops_count_that_overflows_is_flagged_not_an_infinite_efficiency(
    registry, tmp_path, fixed_gemm
):
    runner, store = make_runner(registry, tmp_path, variants=["overflow"], seq_lens=[128])
    runner.start()
    runner.measure_pending()
    (row,) = store.rows()
    assert row["status"] == "ok" and row["time_ms"] > 0  # the time stands
    assert {"efficiency", "flops", "gflops_per_s"}.isdisjoint(row)  # not measured, not inf
    assert FLAG_FLOPS_NOT_FINITE in row["flags"] and "overflow.flops(128, 128)" in row["flops_note"]
    text = store.path("results.jsonl").read_text()
    assert "Infinity" not in text and "NaN" not in text  # plain JSON, readable anywhere
    (line,) = write_summary(store)
    assert line.efficiency is None and FLAG_FLOPS_NOT_FINITE in line.flags


def test_the_gemm_is_measured_again_at_the_end_and_the_best_kept(
    registry, tmp_path, fixed_gemm, monkeypatch
):
    monkeypatch.setattr(runner_module, "GEMM_AGAIN_AFTER_S", 0.0)
    runner, store = make_runner(registry, tmp_path, variants=["vanilla"])
    runner.start()
    runner.measure_pending()
    env = json.loads(store.path("env.json").read_text())
    assert [entry["at"] for entry in env["gemm_measurements"]] == ["start", "end"]
    assert env["gemm_flops_per_s"] == 3e11 and env["gemm_best_of"] == "end"
    (row,) = store.rows()
    assert row["gemm_flops_per_s"] == 1e11  # what was known when it was measured
    (line,) = write_summary(store)  # restated against the best ceiling
    assert line.efficiency == pytest.approx(row["efficiency"] / 3)


# --- the summary of old and odd rows -------------------------------------------------------
def cost_row(n, time_ms, **fields):
    return {
        "cell": f"v|n={n}|forward",
        "label": "v",
        "variant": "v",
        "pass": "forward",
        "seq_len": n,
        "status": "ok",
        "time_ms": time_ms,
        "error": None,
        **fields,
    }


def test_a_row_timed_once_shows_no_spread_and_says_so():
    # An old-format row: one timed run, IQR 0, no flags or load fields.
    (line,) = summarize([cost_row(2048, 900.0, time_iqr_ms=0.0, timed_runs=1)])
    assert line.time_iqr_ms is None and FLAG_FEW_RUNS in line.flags
    entries = summary_entries(line)
    assert entries[4] == "-" and FLAG_FEW_RUNS in entries


def test_a_large_spread_is_flagged():
    (line,) = summarize([cost_row(512, 15.0, time_iqr_ms=9.0, timed_runs=5)])
    assert line.time_iqr_ms == 9.0 and FLAG_LARGE_SPREAD in line.flags


def test_a_forward_slower_than_its_forward_backward_is_flagged():
    forward = cost_row(512, 1249.0)
    both = cost_row(512, 741.0, **{"pass": "forward_backward", "cell": "v|n=512|fb"})
    lines = summarize([forward, both])
    assert all(FLAG_PASS_ORDER in line.flags for line in lines)
    both["time_ms"] = 2000.0
    assert not any(FLAG_PASS_ORDER in line.flags for line in summarize([forward, both]))


def test_exponents_carry_their_uncertainty():
    three = [cost_row(n, t) for n, t in ((512, 1.0), (1024, 4.1), (2048, 15.9))]
    two = [cost_row(n, t) for n, t in ((512, 1.0), (1024, 4.0))]
    noisy = [cost_row(n, t) for n, t in ((512, 80.0), (1024, 10.0), (2048, 50.0))]
    for rows in (two, noisy):
        for row in rows:
            row["label"] = row["variant"] = "w" if rows is two else "z"
    lines = summarize(three + two + noisy)
    entries = {row[0]: row[2] for row in exponent_entries(lines)}
    assert "±" in entries["v"] and "uncertain" not in entries["v"]
    assert entries["w"] == "2.00 (2-point slope)"
    assert "uncertain" in entries["z"] and entries["z"].startswith("-")


def test_a_baseline_that_was_not_run_is_said(registry, tmp_path, fixed_gemm):
    out = Console(record=True, width=200, file=io.StringIO())
    runner, store = make_runner(registry, tmp_path, console=out, variants=["alibi"])
    runner.start()
    runner.measure_pending()
    assert "baseline 'vanilla' is not among the variants run" in out.export_text()
    lines = write_summary(store, runner.spec.baseline)  # the CLI's call: baseline None
    assert lines[0].baseline_missing == "vanilla"
    assert "no baseline run" in summary_entries(lines[0])
    printed = Console(record=True, width=200, file=io.StringIO())
    print_summary(lines, printed)
    assert "baseline 'vanilla' was not run" in printed.export_text()


def test_an_old_format_run_resumes_and_summarises(registry, tmp_path, fixed_gemm):
    runner, store = make_runner(registry, tmp_path, variants=["vanilla", "alibi"])
    runner.start()
    runner.close()
    old = {
        "cell": "vanilla|n=16|forward",
        "variant": "vanilla",
        "label": "vanilla",
        "options": {},
        "pass": "forward",
        "seq_len": 16,
        "status": "ok",
        "error": None,
        "time_ms": 1.0,
        "time_iqr_ms": 0.0,
        "timed_runs": 1,
        "efficiency": 0.5,
        "gemm_flops_per_s": 1e11,
        "flops": 5e7,
    }
    store.append(old)
    assert [cell.id for cell in runner.pending()] == ["alibi|n=16|forward"]
    resumed = Runner(runner.spec, registry, RunStore.existing(store.directory), runner.console)
    resumed.start()
    resumed.measure_pending()
    lines = {line.label: line for line in write_summary(store, "vanilla")}
    assert lines["vanilla"].time_iqr_ms is None and FLAG_FEW_RUNS in lines["vanilla"].flags
    assert lines["alibi"].speedup_vs_baseline is not None


# --- one process per run directory --------------------------------------------------------
def test_a_second_lock_on_a_run_is_refused_naming_the_lock_and_the_holder(tmp_path):
    store = RunStore.create(tmp_path, "x")
    with store.lock(), pytest.raises(RunLocked, match=rf"{LOCK} is locked by process \d+"):
        store.lock()
    store.lock().release()  # free again once released


def test_a_run_held_by_another_process_is_not_measured_again(registry, tmp_path, fixed_gemm):
    runner, store = make_runner(registry, tmp_path, variants=["vanilla"])
    holder = textwrap.dedent(
        f"""
        import fcntl, sys
        f = open({str(store.path(LOCK))!r}, "a+")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write("4242\\n"); f.flush()
        print("held", flush=True)
        sys.stdin.read()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match="process 4242"):
            runner.start()
        assert not store.path("results.jsonl").exists()
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    runner.start()  # the holder ended: the lock is free
    runner.measure_pending()
    assert len(store.rows()) == 1


def test_the_lock_is_released_after_a_run(registry, tmp_path, fixed_gemm):
    runner, store = make_runner(registry, tmp_path, variants=["vanilla"])
    runner.start()
    runner.measure_pending()
    assert Path(store.path(LOCK)).exists() and runner.lock is None
    store.lock().release()
    assert math.isfinite(store.rows()[0]["time_ms"])


def test_the_summary_says_which_fidelity_reference_was_causal():
    row = cost_row(64, 1.0, fidelity_rel_error=0.0, fidelity_reference=CAUSAL_REFERENCE)
    lines = summarize([row])
    assert lines[0].fidelity_reference == CAUSAL_REFERENCE
    printed = Console(record=True, width=200, file=io.StringIO())
    print_summary(lines, printed)
    assert "fidelity of v is against causal exact attention" in printed.export_text()
