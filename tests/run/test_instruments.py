"""The measuring primitives report what happened, exactly where that is possible."""

from __future__ import annotations

import json
import os
import pickle
import time

import pytest
import torch

from playground.model import linear_layers
from playground.run import instruments as measure
from playground.run.instruments import (
    FLAG_BUSY,
    FLAG_EFFICIENCY_ABOVE_1,
    FLAG_FEW_RUNS,
    FLAG_FLOPS_NOT_FINITE,
    FLAG_LARGE_SPREAD,
    MIN_TIMED_RUNS,
    GemmRate,
    cost_flags,
    fit_exponent,
    fit_scaling,
    gemm_fields,
    gemm_flops_per_second,
    gemm_rate_of,
    peak_memory_bytes,
    spread,
    time_call,
)


def test_peak_memory_of_a_known_allocation_is_its_size():
    assert peak_memory_bytes(lambda: torch.empty(1000, 1000)) == 4_000_000


def test_peak_memory_sees_a_freed_temporary():
    def allocate_free_allocate():
        big = torch.empty(1000, 1000)  # 4 MB
        small = torch.empty(500, 1000)  # 2 MB: 6 MB held here
        del big
        later = torch.empty(250, 1000)  # 1 MB: 3 MB held
        return small, later

    assert peak_memory_bytes(allocate_free_allocate) == 6_000_000


def test_peak_memory_is_repeatable():
    fn = lambda: torch.randn(300, 300).softmax(-1) @ torch.randn(300, 300)  # noqa: E731
    assert peak_memory_bytes(fn) == peak_memory_bytes(fn) > 0


def test_fit_exponent_recovers_known_powers():
    sizes = [512, 1024, 2048, 4096]
    assert fit_exponent(sizes, [3 * n**2 for n in sizes]) == pytest.approx(2.0)
    assert fit_exponent(sizes, [7 * n for n in sizes]) == pytest.approx(1.0)


def test_fit_exponent_rejects_too_few_points():
    with pytest.raises(ValueError, match="at least two"):
        fit_exponent([1024], [1.0])


def test_time_call_times_the_call():
    calls = []
    timing = time_call(lambda: calls.append(1), min_run_time=0.01)
    assert timing.median_s > 0 and timing.runs >= 1 and len(calls) > timing.runs


def test_time_call_runs_every_call_on_the_threads_it_records():
    seen: list[int] = []
    timing = time_call(lambda: seen.append(torch.get_num_threads()), min_run_time=0.01)
    assert timing.threads == torch.get_num_threads()
    assert set(seen) == {timing.threads}


@pytest.mark.parametrize("threads", [1, 2])
def test_time_call_uses_the_thread_count_asked_for(threads):
    before = torch.get_num_threads()
    seen: list[int] = []
    timing = time_call(lambda: seen.append(torch.get_num_threads()), 0.01, threads=threads)
    assert timing.threads == threads and set(seen) == {threads}
    assert torch.get_num_threads() == before  # restored afterwards


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_time_call_refuses_a_thread_count_that_is_not_positive(threads):
    with pytest.raises(ValueError, match="positive integer"):
        time_call(lambda: None, 0.01, threads=threads)


def test_peak_memory_prints_nothing_to_the_terminal(capfd):
    peak_memory_bytes(lambda: torch.empty(1000, 1000))
    assert capfd.readouterr() == ("", "")


def test_peak_memory_passes_on_what_the_call_itself_writes(capfd):
    def noisy() -> None:
        os.write(1, b"to stdout\n")
        os.write(2, b"to stderr\n")
        torch.empty(10)

    peak_memory_bytes(noisy)
    assert capfd.readouterr() == ("to stdout\n", "to stderr\n")


def test_a_slow_call_is_timed_often_enough_for_a_spread():
    # Slower than min_run_time: blocked_autorange alone would time it once (IQR 0).
    timing = time_call(lambda: time.sleep(0.003), min_run_time=0.002)
    assert timing.runs >= MIN_TIMED_RUNS and timing.iqr_s is not None


def test_one_timed_run_has_no_spread_rather_than_an_iqr_of_zero():
    assert spread([0.5]) == (0.5, None)
    timing = time_call(lambda: time.sleep(0.003), min_run_time=0.002, min_runs=1)
    assert timing.runs == 1 and timing.iqr_s is None and timing.relative_iqr is None


def test_cost_flags_name_what_makes_a_number_doubtful():
    assert cost_flags(time_s=1.0, iqr_s=0.05, runs=5, efficiency=0.5, load=1.0, cores=2) == []
    assert cost_flags(runs=1) == [FLAG_FEW_RUNS]
    assert cost_flags(time_s=1.0, iqr_s=0.5) == [FLAG_LARGE_SPREAD]
    assert cost_flags(efficiency=1.37) == [FLAG_EFFICIENCY_ABOVE_1]
    assert cost_flags(efficiency=None, flops=float("inf")) == [FLAG_FLOPS_NOT_FINITE]
    assert cost_flags(load=5.0, cores=2) == [FLAG_BUSY]


def test_a_fit_from_three_lengths_has_an_error_and_from_two_is_a_two_point_slope():
    sizes = [512, 1024, 2048]
    exact = fit_scaling(sizes, [n**2 for n in sizes])
    assert exact.exponent == pytest.approx(2) and exact.stderr == pytest.approx(0, abs=1e-9)
    assert not exact.uncertain and "±" in exact.text()
    two = fit_scaling(sizes[:2], [1.0, 4.0])
    assert two.stderr is None and two.uncertain and two.text() == "2.00 (2-point slope)"
    negative = fit_scaling(sizes, [87.9, 15.0, 40.0])  # a swing, not a law
    assert negative.uncertain and "uncertain" in negative.text()


def _faked_libraries(monkeypatch, seconds: dict[str, float]) -> list[str]:
    """Time each library's product as `seconds` says (per call), as if oneDNN computed
    here (on an AMD CPU it is the faster), telling the products apart by whether oneDNN's
    linear ran; returns the names timed, in order."""
    timed: list[str] = []
    onednn_calls: list[int] = []

    def onednn_linear(x, weight, bias=None):
        onednn_calls.append(1)
        return x @ weight.t()

    def fastest_block_s(product, min_run_time, threads):
        onednn_calls.clear()
        product()
        timed.append("onednn" if onednn_calls else "matmul")
        return seconds[timed[-1]]

    monkeypatch.setattr(measure, "_fastest_block_s", fastest_block_s)
    monkeypatch.setattr(linear_layers, "onednn_linear", onednn_linear)
    monkeypatch.setattr(linear_layers, "onednn_computes", lambda device, dtype: True)
    return timed


@pytest.mark.parametrize(
    ("seconds", "faster"),
    [({"matmul": 2.0, "onednn": 1.0}, "onednn"), ({"matmul": 1.0, "onednn": 4.0}, "matmul")],
)
def test_the_gemm_ceiling_is_the_faster_library_and_keeps_both_rates(monkeypatch, seconds, faster):
    timed = _faked_libraries(monkeypatch, seconds)
    rate = gemm_flops_per_second(size=4)
    flops = 2 * 4**3
    assert sorted(timed) == ["matmul", "onednn"]
    assert rate.matmul_flops_per_s == flops / seconds["matmul"]
    assert rate.onednn_flops_per_s == flops / seconds["onednn"]
    assert float(rate) == flops / seconds[faster] and rate.library == faster
    assert gemm_fields(rate) == {
        "gemm_flops_per_s": flops / seconds[faster],
        "gemm_matmul_flops_per_s": flops / seconds["matmul"],
        "gemm_onednn_flops_per_s": flops / seconds["onednn"],
        "gemm_library": faster,
    }


def test_the_gemm_ceiling_times_onednn_only_where_it_computes(monkeypatch):
    timed = _faked_libraries(monkeypatch, {"matmul": 1.0, "onednn": 0.5})
    monkeypatch.setattr(linear_layers, "onednn_computes", lambda device, dtype: False)
    rate = gemm_flops_per_second(size=4)
    assert timed == ["matmul"] and rate.onednn_flops_per_s is None and rate.library == "matmul"
    assert float(rate) == rate.matmul_flops_per_s == 2 * 4**3


def test_a_gemm_ceiling_survives_json_and_pickle_with_both_rates():
    rate = GemmRate(5e10, 9e10)
    recorded = json.loads(json.dumps(gemm_fields(rate)))
    again = gemm_rate_of(recorded)
    assert isinstance(again, GemmRate) and float(again) == 9e10
    assert (again.matmul_flops_per_s, again.onednn_flops_per_s) == (5e10, 9e10)
    unpickled = pickle.loads(pickle.dumps(rate))
    assert float(unpickled) == 9e10 and unpickled.onednn_flops_per_s == 9e10
    # A run recorded before the two rates: its plain number; none at all: None.
    assert gemm_rate_of({"gemm_flops_per_s": 7e10}) == 7e10
    assert gemm_rate_of({}) is None
    assert gemm_fields(7e10) == {
        "gemm_flops_per_s": 7e10,
        "gemm_matmul_flops_per_s": None,
        "gemm_onednn_flops_per_s": None,
        "gemm_library": None,
    }


def test_the_gemm_ceiling_measures_both_libraries_here():
    rate = gemm_flops_per_second(size=256, min_run_time=0.01)
    assert rate.matmul_flops_per_s > 0
    if linear_layers.onednn_computes("cpu", torch.float32):
        assert rate.onednn_flops_per_s is not None and rate.onednn_flops_per_s > 0
    assert float(rate) == max(rate.matmul_flops_per_s, rate.onednn_flops_per_s or 0.0)


ONE_CELL = """
name = "gemm_reference"
variants = ["vanilla"]
seq_lens = [16]
d_model = 32
num_heads = 2
passes = ["forward"]
measures = ["speed"]

[timing]
min_run_time = 0.01
"""


@pytest.mark.parametrize(
    ("matmul", "onednn", "faster"), [(4e10, 8e10, "onednn"), (8e10, 4e10, "matmul")]
)
def test_env_json_and_every_row_record_the_reference_and_both_rates(
    bundled_registry, tmp_path, monkeypatch, matmul, onednn, faster
):
    from playground.run import runner as runner_module
    from playground.run.runner import Runner
    from playground.run.spec_loading import load_spec
    from playground.run.store import RunStore

    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(ONE_CELL)
    ceilings = iter([GemmRate(matmul, onednn), GemmRate(1e10, None)])  # start, then end
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: next(ceilings))
    store = RunStore.create(tmp_path / "results", "gemm_reference")
    runner = Runner(load_spec(spec_path, bundled_registry), bundled_registry, store)
    runner.start()
    runner.measure_pending()
    reference = max(matmul, onednn)
    env = json.loads(store.path("env.json").read_text())
    assert env["gemm_flops_per_s"] == reference and env["gemm_library"] == faster
    assert (env["gemm_matmul_flops_per_s"], env["gemm_onednn_flops_per_s"]) == (matmul, onednn)
    first = env["gemm_measurements"][0]
    assert (first["flops_per_s"], first["matmul_flops_per_s"], first["onednn_flops_per_s"]) == (
        reference,
        matmul,
        onednn,
    )
    rows = store.rows()
    assert rows and all(row["status"] == "ok" for row in rows)
    for row in rows:
        assert row["gemm_flops_per_s"] == reference and row["gemm_library"] == faster
        assert (row["gemm_matmul_flops_per_s"], row["gemm_onednn_flops_per_s"]) == (matmul, onednn)
        assert row["efficiency"] == pytest.approx(row["flops"] / row["time_ms"] * 1e3 / reference)
    # A slower measurement later (matmul only, another device say) changes nothing.
    runner.record_gemm(store.read_json("env.json"), "end")
    env = json.loads(store.path("env.json").read_text())
    assert env["gemm_best_of"] == "start" and env["gemm_flops_per_s"] == reference
    assert (env["gemm_matmul_flops_per_s"], env["gemm_onednn_flops_per_s"]) == (matmul, onednn)
    assert env["gemm_measurements"][1]["onednn_flops_per_s"] is None
