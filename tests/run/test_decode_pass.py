"""The runner's decode pass: rows with the time of one step, the state's bytes and the step
against reading the state once at the bandwidth measured in the same process; refusals
as rows; specs; figures. Wall-clock times are never asserted."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

import playground
from playground.cli import main
from playground.registry import default_registry
from playground.run import decode
from playground.run.decode import DECODE_RESERVE, measure_decode, memory_bandwidth, prefilled
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec

SPEC = """
    name = "decode_test"
    seq_lens = [32, 64]
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
        (v, n) for v in ("vanilla", "linear") for n in (32, 64)
    }
    for row in ok:
        assert row["pass"] == "decode" and row["time_ms"] > 0 and row["timed_runs"] >= 3
        assert row["bandwidth_bytes_per_s"] > 0
        assert row["decoded_past_context"] == DECODE_RESERVE
        limit = row["state_bytes"] / row["bandwidth_bytes_per_s"] * 1e3
        assert row["read_limit_ms"] == pytest.approx(limit)
        assert row["bandwidth_efficiency"] == pytest.approx(limit / row["time_ms"])
    state = {(r["variant"], r["seq_len"]): r["state_bytes"] for r in ok}
    assert state["vanilla", 64] > state["vanilla", 32]  # a cache grows with the context
    assert state["linear", 64] == state["linear", 32]  # a recurrent state does not


def test_a_variant_that_cannot_decode_gets_unsupported_rows(decode_run):
    rows, _ = decode_run
    refused = [r for r in rows if r["variant"] == "linformer"]
    assert refused and all(r["status"] == "unsupported" for r in refused)
    assert "decoding one token at a time" in refused[0]["error"]


def test_the_decode_figures_are_drawn(decode_run):
    _, run_dir = decode_run
    figures = {path.name for path in (run_dir / "figures").iterdir()}
    assert {"time_vs_n.png", "decode_state_vs_n.png"} <= figures
    summary = (run_dir / "summary.csv").read_text()
    assert "state_mib" in summary and "bandwidth_efficiency" in summary


def test_the_state_bytes_are_the_states_own():
    module = playground.build("gqa", 32, 4, num_kv_heads=1).eval()
    fields = measure_decode(module, 40, 2, torch.float32, "cpu", 1, bandwidth=1e9)
    assert fields["state_bytes"] == prefilled(module, 40, batch=2).nbytes / 2


def test_a_step_that_breaks_the_contract_is_refused(monkeypatch):
    module = playground.build("vanilla", 32, 4).eval()
    step = module.decode_step
    monkeypatch.setattr(
        module, "decode_step", lambda token, state: (step(token, state)[0] * torch.nan, state)
    )
    with pytest.raises(playground.PlaygroundError, match="NaN or inf"):
        measure_decode(module, 16, 1, torch.float32, "cpu", 1, bandwidth=1e9)


def test_the_bandwidth_is_a_rate_of_reading(monkeypatch):
    monkeypatch.setattr(decode, "BANDWIDTH_BYTES", 4 * 2**20)
    rate = memory_bandwidth(threads=1, min_run_time=0.05)
    assert 1e8 < rate < 1e13  # bytes per second of some real machine


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ('measures = ["memory"]', "'decode' times decoding steps: add 'speed'"),
        ('measures = ["speed", "fidelity"]', "'memory' and 'fidelity' measure whole passes"),
    ],
)
def test_specs_that_cannot_decode_are_refused(tmp_path, extra, words):
    text = SPEC.replace('measures = ["speed"]', extra)
    with pytest.raises(SpecError, match=words):
        load_spec(write(tmp_path, text), default_registry())


def test_the_shipped_decode_spec_loads():
    spec = load_spec(Path(__file__).parents[2] / "experiments" / "decode.toml", default_registry())
    assert spec.passes == ("decode",) and max(spec.seq_lens) >= 32768
