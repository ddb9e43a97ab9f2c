"""`python -m playground.cli.bench`: the per-variant cost table, forward and forward+backward."""

from __future__ import annotations

import pytest

from playground.cli import bench


@pytest.fixture
def fixed_gemm(monkeypatch):
    """The sweep's own measurements are what these tests look at; a GEMM rate measured
    twice per call would only add seconds."""
    monkeypatch.setattr(bench, "gemm_flops_per_second", lambda threads=None: 1e11)


@pytest.mark.parametrize("pass_name", ["forward", "forward_backward"])
def test_bench_prints_a_row_per_length_and_the_exponents(
    pass_name, capsys, monkeypatch, fixed_gemm
):
    monkeypatch.setenv("COLUMNS", "200")
    arguments = ["--variants", "vanilla,alibi", "--seq-lens", "16,32", "--min-run-time", "0.01"]
    bench.main([*arguments, "--pass", pass_name, "--option", "alibi.learnable_slopes=true"])
    out = capsys.readouterr().out
    assert f"pass: {pass_name}" in out
    assert out.count("│ vanilla") == 3 and out.count("│ alibi") == 3  # 2 lengths + exponents
    assert "ok" in out


def test_bench_passes_cost_the_backward_too():
    forward = bench.pass_cost("vanilla", 64, d_model=32, num_heads=4, min_run_time=0.01)
    both = bench.pass_cost(
        "vanilla", 64, d_model=32, num_heads=4, min_run_time=0.01, pass_name="forward_backward"
    )
    assert both.flops == 3 * forward.flops


def test_bench_records_a_refused_length_and_goes_on(capsys, monkeypatch, fixed_gemm):
    monkeypatch.setenv("COLUMNS", "200")
    bench.main(["--variants", "linformer", "--seq-lens", "16,100000", "--min-run-time", "0.01"])
    out = capsys.readouterr().out
    assert out.count("│ linformer") == 2


def test_bench_rejects_an_unknown_variant(fixed_gemm):
    with pytest.raises(SystemExit, match="error"):
        bench.main(["--variants", "no_such_variant", "--seq-lens", "16"])


def test_bench_says_a_two_length_exponent_is_a_two_point_slope(capsys, monkeypatch, fixed_gemm):
    monkeypatch.setenv("COLUMNS", "250")
    bench.main(["--variants", "vanilla", "--seq-lens", "16,32", "--min-run-time", "0.01"])
    out = capsys.readouterr().out
    assert "2-point slope" in out and "flags" in out


def test_bench_flags_an_efficiency_above_one(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(bench, "gemm_flops_per_second", lambda threads=None: 1.0)
    bench.main(["--variants", "vanilla", "--seq-lens", "16", "--min-run-time", "0.01"])
    out = capsys.readouterr().out
    assert "efficiency > 1" in out and "faster than the measured matmul ceiling" in out
