"""The runner's decode pass: rows with the time of one step, the state's bytes and the step
against reading the state once at the bandwidth measured in the same process (env.json);
refusals as rows; the timed callable's bookkeeping; flags. Wall-clock times are never
asserted."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

import playground
from playground.cli import main
from playground.contract import AttentionVariant
from playground.registry import default_registry
from playground.report.summary import summarize
from playground.run import decode_cost as decode
from playground.run.decode_cost import (
    CALLS_PER_TIMED_RUN,
    DECODE_RESERVE,
    MIN_BANDWIDTH_BYTES,
    MIN_DECODE_CONTEXT,
    STEPS_PER_RUN,
    bandwidth_buffer_bytes,
    measure_decode,
    memory_bandwidth,
    prefilled,
    steps_per_run,
)
from playground.run.instruments import (
    FLAG_EFFICIENCY_ABOVE_1,
    FLAG_RECOMPUTED,
    FLAG_WEIGHTS_DOMINATE,
)
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec

SPEC = """
    name = "decode_test"
    seq_lens = [160, 320]
    passes = ["decode"]
    measures = ["speed"]
    d_model = 32
    num_heads = 4
    threads = 1

    [[variants]]
    name = "vanilla"

    [[variants]]
    name = "linear"

    [[variants]]
    name = "linformer"
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory) -> tuple[list[dict], Path]:
    folder = tmp_path_factory.mktemp("decode")
    spec = write(folder, SPEC)
    main(["run", str(spec), "--out", str(folder / "results")])
    run_dir = next((folder / "results" / "decode_test").iterdir())
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    return rows, run_dir


def test_decode_rows_hold_step_time_state_bytes_and_bandwidth(decode_run):
    rows, _ = decode_run
    ok = [r for r in rows if r["status"] == "ok"]
    assert {(r["variant"], r["seq_len"]) for r in ok} == {
        (v, n) for v in ("vanilla", "linear") for n in (160, 320)
    }
    for row in ok:
        assert row["pass"] == "decode" and row["time_ms"] > 0 and row["timed_runs"] >= 3
        assert row["time_iqr_ms"] is not None
        k, n = row["steps_per_run"], row["seq_len"]
        assert 1 <= k <= STEPS_PER_RUN
        # two probe steps, time_call's warm-up run, then each timed run with two warm-ups,
        # all within DECODE_RESERVE tokens below the context, ending there when k is whole
        assert row["steps_from"] == n - DECODE_RESERVE
        assert row["steps_to"] == row["steps_from"] + 2 + k * (1 + row["timed_runs"] * 3)
        assert row["steps_to"] <= n and (k < STEPS_PER_RUN or row["steps_to"] == n)
        limit = row["state_bytes"] / row["bandwidth_bytes_per_s"] * 1e3
        assert row["read_limit_ms"] == pytest.approx(limit)
        assert row["bandwidth_efficiency"] == pytest.approx(limit / row["time_ms"])
    state = {(r["variant"], r["seq_len"]): r["state_bytes"] for r in ok}
    # vanilla keeps keys and values, 2 · n · d_model float32 numbers, and n "is real" bools:
    # the timed state was allocated once for exactly n tokens
    assert state["vanilla", 320] == 320 * (2 * 32 * 4 + 1)
    assert state["vanilla", 160] == 160 * (2 * 32 * 4 + 1)
    assert state["linear", 320] == state["linear", 160]  # a recurrent state does not grow


def test_the_bandwidth_is_measured_once_and_recorded_in_env(decode_run):
    rows, run_dir = decode_run
    env = json.loads((run_dir / "env.json").read_text())
    bandwidth = env["memory_bandwidth_bytes_per_s"]
    assert bandwidth > 0 and env["bandwidth_best_of"] == "start"
    (measured,) = env["bandwidth_measurements"]
    assert measured["buffer_bytes"] >= MIN_BANDWIDTH_BYTES
    assert {r["bandwidth_bytes_per_s"] for r in rows if r["status"] == "ok"} == {bandwidth}


def test_a_variant_that_cannot_decode_gets_unsupported_rows(decode_run):
    rows, _ = decode_run
    refused = [r for r in rows if r["variant"] == "linformer"]
    assert len(refused) == 2 and all(r["status"] == "unsupported" for r in refused)
    assert "decoding one token at a time" in refused[0]["error"]


def test_the_summary_gains_time_per_token_state_and_bandwidth_efficiency(decode_run):
    rows, run_dir = decode_run
    figures = {path.name for path in (run_dir / "figures").iterdir()}
    assert {"decode_time_vs_n.png", "decode_state_vs_n.png"} <= figures
    assert "time_vs_n.png" not in figures  # no whole pass was measured
    header, *lines = (run_dir / "summary.csv").read_text().splitlines()
    assert {"time_ms", "state_mib", "bandwidth_efficiency"} <= set(header.split(","))
    vanilla = next(r for r in rows if r["variant"] == "vanilla" and r["seq_len"] == 320)
    assert any(line.startswith("vanilla,vanilla,decode,320,ok,") for line in lines)
    report = (run_dir / "report.md").read_text()
    assert "time per generated token" in report and "BW eff." in report
    (line,) = [x for x in summarize(rows) if x.label == "vanilla" and x.seq_len == 320]
    assert line.state_mib == vanilla["state_bytes"] / 2**20
    assert line.bandwidth_efficiency == vanilla["bandwidth_efficiency"]


def test_decode_runs_alongside_the_whole_passes(tmp_path):
    text = SPEC.replace('passes = ["decode"]', 'passes = ["forward", "decode"]')
    text = text.replace('measures = ["speed"]', 'measures = ["speed", "memory", "fidelity"]')
    text = text.replace("seq_lens = [160, 320]", "seq_lens = [160]")
    main(
        [
            "run",
            str(write(tmp_path, text)),
            "--out",
            str(tmp_path / "results"),
            "--variants",
            "vanilla",
        ]
    )
    run_dir = next((tmp_path / "results" / "decode_test").iterdir())
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    decoding, forward = sorted(rows, key=lambda row: row["pass"])
    assert (decoding["pass"], forward["pass"]) == ("decode", "forward")
    assert forward["peak_memory_bytes"] > 0 and "fidelity_rel_error" in forward
    assert "state_bytes" not in forward and "bandwidth_efficiency" not in forward
    assert decoding["state_bytes"] > 0 and "peak_memory_bytes" not in decoding
    assert "fidelity_rel_error" not in decoding
    figures = {path.stem for path in (run_dir / "figures").iterdir()}
    assert {"time_vs_n", "memory_vs_n", "decode_time_vs_n", "decode_state_vs_n"} <= figures


def test_the_state_bytes_are_the_states_own():
    module = playground.build("gqa", 32, 4, num_kv_heads=1).eval()
    fields = measure_decode(module, 40, 2, torch.float32, "cpu", 1, bandwidth=1e9)
    own = prefilled(module, 40, batch=2).nbytes
    assert fields["state_bytes"] == own / 2  # per sequence
    assert fields["read_limit_ms"] == pytest.approx(own / 1e9 * 1e3)  # the whole batch's
    assert fields["state_type"] == "TokenCache"


def test_a_step_that_breaks_the_contract_is_refused(monkeypatch):
    module = playground.build("vanilla", 32, 4).eval()
    step = module.decode_step
    monkeypatch.setattr(
        module, "decode_step", lambda token, state: (step(token, state)[0] * torch.nan, state)
    )
    with pytest.raises(playground.PlaygroundError, match="NaN or inf"):
        measure_decode(module, 40, 1, torch.float32, "cpu", 1, bandwidth=1e9)


def test_a_timed_run_is_fewer_steps_when_one_step_is_slow_or_the_context_short():
    assert steps_per_run(1e-5) == STEPS_PER_RUN
    assert steps_per_run(decode.TARGET_RUN_S / 3.5) == 3
    assert steps_per_run(10.0) == 1
    assert DECODE_RESERVE == 2 + STEPS_PER_RUN * (1 + decode.TIMED_RUNS * CALLS_PER_TIMED_RUN)
    assert steps_per_run(1e-5, room=MIN_DECODE_CONTEXT - 1) == 1
    assert steps_per_run(1e-5, room=2 + 3 * decode.CALLS_PER_CELL) == 3


def test_a_short_context_is_timed_below_it_and_a_too_short_one_refused():
    module = playground.build("vanilla", 32, 4)
    fields = measure_decode(module, 40, 1, torch.float32, "cpu", 1, bandwidth=1e9)
    k = fields["steps_per_run"]
    assert fields["steps_from"] == 1 and k <= 2  # (40 - 1 - 2) // 16 runs' worth of room
    assert fields["steps_to"] == 3 + k * decode.CALLS_PER_CELL <= 40
    assert fields["state_bytes"] == 40 * (2 * 32 * 4 + 1)
    with pytest.raises(playground.PlaygroundError, match=f"seq_lens of {MIN_DECODE_CONTEXT}"):
        measure_decode(module, MIN_DECODE_CONTEXT - 1, 1, torch.float32, "cpu", 1, 1e9)


def test_the_recompute_default_and_a_state_below_the_weights_are_flagged():
    recomputing = playground.build("vanilla", 32, 4).eval()
    recomputing.prefill_state = AttentionVariant.prefill_state.__get__(recomputing)
    recomputing.step_state = AttentionVariant.step_state.__get__(recomputing)
    fields = measure_decode(recomputing, 256, 1, torch.float32, "cpu", 1, bandwidth=1e9)
    assert fields["state_type"] == "RecomputeState" and FLAG_RECOMPUTED in fields["flags"]
    cached = measure_decode(
        playground.build("vanilla", 32, 4), 256, 1, torch.float32, "cpu", 1, bandwidth=1e9
    )
    assert FLAG_RECOMPUTED not in cached["flags"]
    assert cached["state_bytes"] > cached["weight_bytes"]  # 64 KiB of cache, 17 KiB of weights
    assert FLAG_WEIGHTS_DOMINATE not in cached["flags"]
    linear = measure_decode(
        playground.build("linear", 32, 4), 256, 1, torch.float32, "cpu", 1, bandwidth=1e9
    )
    assert linear["state_bytes"] < linear["weight_bytes"]
    assert FLAG_WEIGHTS_DOMINATE in linear["flags"]


def test_the_bandwidth_is_a_rate_of_reading():
    measured = memory_bandwidth(threads=1, min_run_time=0.05, buffer_bytes=4 * 2**20)
    assert measured.buffer_bytes == 4 * 2**20 and measured.threads == 1
    assert 1e8 < measured.bytes_per_s < 1e13  # bytes per second of some real machine


def test_the_bandwidth_buffer_shrinks_when_memory_is_short(monkeypatch):
    monkeypatch.setattr(decode, "available_memory", lambda device: 16 * 2**30)
    assert bandwidth_buffer_bytes("cpu") == decode.BANDWIDTH_BYTES
    monkeypatch.setattr(decode, "available_memory", lambda device: 400 * 2**20)
    assert bandwidth_buffer_bytes("cpu") == 100 * 2**20
    monkeypatch.setattr(decode, "available_memory", lambda device: 2**20)
    assert bandwidth_buffer_bytes("cpu") == MIN_BANDWIDTH_BYTES


def test_the_summary_restates_bandwidth_efficiency_against_the_best_bandwidth():
    row = {
        "cell": "vanilla|n=64|decode",
        "variant": "vanilla",
        "label": "vanilla",
        "pass": "decode",
        "seq_len": 64,
        "status": "ok",
        "node": "here",
        "threads": 1,
        "time_ms": 1.0,
        "timed_runs": 5,
        "time_iqr_ms": 0.01,
        "state_bytes": 2**20,
        "bandwidth_bytes_per_s": 1e9,
        "bandwidth_efficiency": 1.2,
        "flags": [FLAG_EFFICIENCY_ABOVE_1],
    }
    (own,) = summarize([row])
    assert own.bandwidth_efficiency == 1.2 and FLAG_EFFICIENCY_ABOVE_1 in own.flags
    (restated,) = summarize([row], ceilings={("here", 1, "bandwidth_bytes_per_s"): 2e9})
    assert restated.bandwidth_efficiency == pytest.approx(0.6)
    assert FLAG_EFFICIENCY_ABOVE_1 not in restated.flags


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('measures = ["memory"]', "'decode' times decoding steps: add 'speed'"),
        ('measures = ["speed", "fidelity"]', "'memory' and 'fidelity' measure whole passes"),
        ("seq_lens = [16, 160]", r"\[16\] too short to decode at"),
    ],
)
def test_specs_that_cannot_decode_are_refused(tmp_path, extra, words):
    key = extra.split(" =")[0]
    text = SPEC.replace(next(x for x in SPEC.splitlines() if x.strip().startswith(key)), extra)
    with pytest.raises(SpecError, match=words):
        load_spec(write(tmp_path, text), default_registry())


def test_the_shipped_decode_spec_loads():
    spec = load_spec(Path(__file__).parents[2] / "experiments" / "decode.toml", default_registry())
    assert spec.passes == ("decode",) and spec.measures == ("speed",)
    assert sorted(spec.seq_lens) == [1024, 4096, 16384, 32768]
    assert spec.d_model == 512 and spec.num_heads == 8 and spec.batch_size == 1
