"""Every row the runner writes is true: it ran on the threads it records, a call that
breaks the contract is `invalid` (never `ok`, never timed), and no cell is planned twice."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from playground.cli import main
from playground.registry import Registry, bundled_dir, configure
from playground.report.summary import summarize
from playground.run.cells import plan
from playground.run.resume import resume
from playground.run.runner import Runner
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec
from playground.run.spec_overrides import apply_overrides
from playground.run.store import RunStore

# Each variant breaks the contract in one way, only when asked to (so the contract suite,
# which builds with defaults, is not what these tests are about).
BROKEN_OUTPUTS = """
    import torch
    import playground
    from playground import AttentionOutput

    Vanilla = playground.get_variant("vanilla")
    THREADS_SEEN = []

    class ThreadRecorder(Vanilla):
        name = "thread_recorder"
        summary = "vanilla that records torch.get_num_threads() inside every call"

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            THREADS_SEEN.append(torch.get_num_threads())
            return super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)

    class NanOutput(Vanilla):
        name = "nan_output"
        summary = "returns NaN"

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            result = super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)
            return AttentionOutput(result.output * float("nan"), None)

    class WrongShape(Vanilla):
        name = "wrong_shape"
        summary = "drops the last query"

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            result = super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)
            return AttentionOutput(result.output[:, :-1], None)

    class WrongDtype(Vanilla):
        name = "wrong_dtype"
        summary = "returns float64 in any run"

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            result = super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)
            return AttentionOutput(result.output.double(), None)

    class BareTensor(Vanilla):
        name = "bare_tensor"
        summary = "returns the output tensor itself"

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            return super().forward_fast(
                query, key, value, attention_mask, is_causal, need_weights
            ).output

    class LateNan(Vanilla):
        name = "late_nan"
        summary = "fine on the first call, NaN from the second on"
        calls = 0

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            result = super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)
            LateNan.calls += 1
            return result if LateNan.calls == 1 else AttentionOutput(result.output / 0.0 * 0.0, None)

    @playground.hookimpl
    def register_attention(register):
        for variant in (ThreadRecorder, NanOutput, WrongShape, WrongDtype, BareTensor, LateNan):
            register(variant)
"""

TINY = """
    name = "tiny"
    seq_lens = [16]
    d_model = 32
    num_heads = 2
    measures = ["speed", "memory"]

    [timing]
    min_run_time = 0.01
"""


@pytest.fixture
def registry(write_plugin):
    path = write_plugin("broken_outputs.py", BROKEN_OUTPUTS)
    return Registry.discover([path.parent], entry_points=False)


@pytest.fixture
def spec_file(tmp_path):
    def write(body: str = TINY, extra: str = "") -> str:
        path = tmp_path / "spec.toml"
        path.write_text(textwrap.dedent(body) + textwrap.dedent(extra))
        return str(path)

    return write


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


def run_spec(registry, path, tmp_path, **overrides):
    spec = apply_overrides(load_spec(path, registry), registry, overrides)
    store = RunStore.create(tmp_path / "results", spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    runner.measure_pending()
    return runner, store


# --- threads -----------------------------------------------------------------------
@pytest.mark.parametrize("threads", [None, 1, 2])
def test_every_call_runs_on_the_threads_its_row_records(registry, spec_file, tmp_path, threads):
    seen = sys.modules[registry.get("thread_recorder").__module__].THREADS_SEEN
    seen.clear()
    extra = "" if threads is None else f"threads = {threads}\n"
    path = spec_file(TINY.replace('name = "tiny"', f'name = "tiny"\n{extra}'))
    before = torch.get_num_threads()
    _, store = run_spec(registry, path, tmp_path, variants=["thread_recorder"])
    expected = before if threads is None else threads
    rows = store.rows()
    assert [row["threads"] for row in rows] == [expected, expected]
    assert json.loads(store.path("env.json").read_text())["threads"] == expected
    assert seen and set(seen) == {expected}  # every call: warm-up, timed, profiled
    assert torch.get_num_threads() == before  # the process's own count is restored


def test_a_resume_keeps_the_thread_count_its_run_started_with(registry, spec_file, tmp_path):
    path = spec_file(TINY.replace('name = "tiny"', 'name = "tiny"\nthreads = 1'))
    overrides = {"variants": ["vanilla"]}
    _, store = run_spec(registry, path, tmp_path, **overrides)
    rows = store.path("results.jsonl")
    rows.write_text(rows.read_text().splitlines(keepends=True)[0])
    # Even where the spec itself would now say otherwise, env.json's count wins.
    spec = apply_overrides(load_spec(store.path("spec.toml"), registry), registry, overrides)
    spec = dataclasses.replace(spec, threads=2)
    resumed = Runner(spec, registry, RunStore.existing(store.directory))
    resumed.start()
    resumed.measure_pending()
    assert [row["threads"] for row in store.rows()] == [1, 1]


def test_a_run_from_before_overrides_json_resumes_with_env_json_overrides(
    registry, spec_file, tmp_path
):
    store = RunStore.create(tmp_path / "results", "tiny")
    store.write_text("spec.toml", Path(spec_file()).read_text())
    store.write_json("env.json", {"overrides": {"variants": ["vanilla"], "seq_lens": [8]}})
    resumed = resume(store.directory, registry, lane={"accuracy_workers": 2})
    assert [variant.label for variant in resumed.spec.variants] == ["vanilla"]
    assert resumed.spec.seq_lens == (8,) and resumed.spec.accuracy_workers == 2
    assert resumed.overrides == {"variants": ["vanilla"], "seq_lens": [8]}
    assert resumed.registry is registry  # no plugin directories recorded: the caller's


def test_every_row_says_where_it_ran_and_what_it_is_compared_against(registry, spec_file, tmp_path):
    runner, store = run_spec(registry, spec_file(), tmp_path, variants=["vanilla"])
    for row in store.rows():
        assert row["node"] and row["gemm_flops_per_s"] == runner.gemm_flops > 0


# --- invalid outputs -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        ("nan_output", r"non-finite value\(s\)"),
        ("wrong_shape", r"shape \(1, 15, 32\), not \(B, N, d_model\) = \(1, 16, 32\)"),
        ("wrong_dtype", r"torch.float64 in a torch.float32 run"),
        ("bare_tensor", r"returned a Tensor, not an AttentionOutput"),
        ("late_nan", r"non-finite value\(s\)"),
    ],
)
def test_a_call_that_breaks_the_contract_is_invalid_in_both_passes(
    registry, spec_file, tmp_path, variant, reason
):
    registry.get("late_nan").calls = 0
    _, store = run_spec(registry, spec_file(), tmp_path, variants=[variant])
    rows = store.rows()
    assert [row["pass"] for row in rows] == ["forward", "forward_backward"]
    for row in rows:
        assert row["status"] == "invalid", row
        assert row["error"] and re.search(reason, row["error"]), row["error"]
        assert "time_ms" not in row and "peak_memory_bytes" not in row  # not a measurement


def test_invalid_rows_are_not_measurements_in_the_summary(registry, spec_file, tmp_path):
    _, store = run_spec(registry, spec_file(), tmp_path, variants=["vanilla", "nan_output"])
    lines = {(line.label, line.pass_name): line for line in summarize(store.rows())}
    broken = lines[("nan_output", "forward")]
    assert broken.status == "invalid" and broken.time_ms is None
    assert broken.speedup_vs_baseline is None and broken.time_exponent is None
    assert lines[("vanilla", "forward")].status == "ok"


def test_an_invalid_cell_makes_the_command_exit_1(registry, spec_file, tmp_path, capsys):
    plugins = Path(registry.source_of("nan_output")).parent
    argv = ["run", spec_file(), "--variants", "nan_output", "--out", str(tmp_path)]
    assert main([*argv, "--plugins-dir", str(plugins)]) == 1
    captured = capsys.readouterr()
    assert "invalid" in captured.out and "non-finite" in captured.out
    assert "returned something the contract forbids" in captured.err


# --- one row per cell ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("seq_lens = [16, 32, 16]\n", r"key 'seq_lens': lists 16 more than once"),
        ('passes = ["forward", "forward"]\n', r"key 'passes': lists 'forward' more than once"),
        ('measures = ["speed", "speed"]\n', r"key 'measures': lists 'speed' more than once"),
        (
            '[[variants]]\nname = "vanilla"\n[[variants]]\nname = "vanilla"\n',
            r"the setup 'vanilla' is listed more than once",
        ),
        (
            '[[variants]]\nname = "linformer"\nseq_len = 64\nk = [8, 16, 8]\n',
            r"the setup 'linformer\(k=8, seq_len=64\)' is listed more than once",
        ),
        (
            '[[tasks]]\nname = "lookback"\n[[tasks]]\nname = "lookback"\n',
            r"key 'tasks': the task 'lookback' is listed more than once",
        ),
    ],
)
def test_a_spec_that_repeats_a_cell_is_refused_naming_the_repeat(
    bundled_registry, spec_file, extra, message
):
    body = 'name = "dup"\nd_model = 32\nnum_heads = 2\n'
    if "seq_lens" not in extra:
        body += "seq_lens = [16]\n"
    with pytest.raises(SpecError, match=message):
        load_spec(spec_file(body, extra), bundled_registry)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--variants", "vanilla,linformer,vanilla", "--variants names 'vanilla' more than once"),
        ("--seq-lens", "16,32,16", "lists 16 more than once"),
    ],
)
def test_a_command_line_that_repeats_a_cell_is_refused(
    spec_file, tmp_path, capsys, flag, value, message
):
    assert main(["run", spec_file(), flag, value, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "tiny").exists()


def test_repeated_overrides_are_refused_where_they_are_validated(bundled_registry, spec_file):
    """--variants by apply_overrides; --seq-lens, merged into the spec, by load_spec, with
    the spec's own rule and a note naming the flag."""
    spec = load_spec(spec_file(), bundled_registry)
    with pytest.raises(SpecError, match="'vanilla' more than once"):
        apply_overrides(spec, bundled_registry, {"variants": ["vanilla", "vanilla"]})
    with pytest.raises(SpecError, match=r"lists 16 more than once.*--seq-lens 16,16 merged"):
        load_spec(spec_file(), bundled_registry, {"seq_lens": [16, 16]})


def test_every_shipped_spec_loads_and_plans_unique_cell_ids(bundled_registry):
    names = sorted(path.stem for path in bundled_dir("experiments").glob("*.toml"))
    assert {"quick", "mqar", "mqar_full", "mqar_zoo"} <= set(names)
    for name in names:
        ids = [cell.id for cell in plan(load_spec(name, bundled_registry))]
        assert ids and len(ids) == len(set(ids)), name


# --- a name, not a path ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../x", "/tmp/elsewhere", "", "a b", "x/y", ".", "..", "-x"])
def test_a_spec_name_that_is_not_a_name_is_refused(bundled_registry, spec_file, name):
    with pytest.raises(SpecError, match=r"key 'name': .* is not a name"):
        load_spec(spec_file(TINY.replace('"tiny"', json.dumps(name))), bundled_registry)


def test_a_path_as_name_writes_nothing_outside_out(spec_file, tmp_path, capsys):
    out = tmp_path / "deep" / "out"
    path = spec_file(TINY.replace('"tiny"', '"../../escaped"'))
    assert main(["run", path, "--variants", "vanilla", "--out", str(out)]) == 2
    assert "is not a name" in capsys.readouterr().err
    assert not (tmp_path / "escaped").exists() and not out.exists()


def test_a_run_directory_is_always_inside_out(tmp_path):
    with pytest.raises(Exception, match="is a path, not a name"):
        RunStore.create(tmp_path / "out", "../x")
    store = RunStore.create(tmp_path / "out", "quick")
    assert store.directory.resolve().is_relative_to((tmp_path / "out").resolve())
