"""A row of results.jsonl is a `row_schema.Row`: every field a run writes is declared
there, and a line whose declared field holds another type is a bad line naming the key,
the type it must have and what it holds (`rows.row_problem`); keys declared nowhere stay
allowed."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path
from typing import get_type_hints

import pytest
from rich.console import Console

from playground.registry import Registry, configure
from playground.run import runner as runner_module
from playground.run.decode_cost import Bandwidth
from playground.run.instruments import GemmRate
from playground.run.reevaluate import evaluate_again
from playground.run.row_schema import Row
from playground.run.rows import field_check, parse_lines, row_problem
from playground.run.runner import Runner
from playground.run.spec_loading import load_spec
from playground.run.store import DamagedRun, RunStore
from tests.tasks.text_corpus import write_corpus

ROW = {
    "cell": "vanilla|n=64|forward",
    "variant": "vanilla",
    "label": "vanilla",
    "status": "ok",
    "seq_len": 64,
    "pass": "forward",
    "time_ms": 1.5,
}


def lines(*rows: dict) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("time_ms", "fast", "has 'time_ms' = 'fast' (a str), not float | None"),
        ("timed_runs", 2.5, "has 'timed_runs' = 2.5 (a float), not int"),
        ("timed_runs", True, "has 'timed_runs' = True (a bool), not int"),
        ("error", 404, "has 'error' = 404 (a int), not str | None"),
        ("options", [], "has 'options' = [] (a list), not dict[str, Any]"),
        ("flags", ["few runs", 3], "has 'flags' = ['few runs', 3] (a list), not list[str]"),
        ("peak_memory_bytes", None, "has 'peak_memory_bytes' = None (a None), not int"),
        (  # a sample without its continuation
            "samples",
            [{"seed": 0, "prompt": "the "}],
            "has 'samples' = [{'prompt': 'the ', 'seed': 0}] (a list), not list[Sample]",
        ),
    ],
)
def test_a_declared_field_of_another_type_is_a_bad_line_naming_it(field, value, reason):
    rows, bad, cut = parse_lines(lines(ROW, {**ROW, "cell": "other", field: value}))
    assert [row["cell"] for row in rows] == [ROW["cell"]] and not cut
    assert [(line.number, line.reason) for line in bad] == [(2, reason)]


def test_ints_for_floats_nulls_where_declared_and_undeclared_keys_are_rows():
    """JSON may write a whole float as an int; an undeclared key is an older or newer
    version's field, of any type."""
    row = {**ROW, "time_ms": 2, "time_iqr_ms": None, "decoded_past_context": "any", "new": [{}]}
    assert row_problem(row) is None
    rows, bad, _ = parse_lines(lines(row))
    assert rows == [row] and bad == []


def test_a_value_of_a_subclass_is_of_its_type_as_for_mypy():
    """A row being written may hold a GemmRate (a float; the Ray executor's failed cells
    do) or another float subclass; a bool stays no number."""
    assert row_problem({**ROW, "gemm_flops_per_s": GemmRate(1e11, 9e10)}) is None
    assert row_problem({**ROW, "time_ms": True}) == (
        "has 'time_ms' = True (a bool), not float | None"
    )


def test_a_run_holding_such_a_line_is_damaged_and_says_where(tmp_path):
    store = RunStore.create(tmp_path, "rows")
    store.path("results.jsonl").write_bytes(lines(ROW, {**ROW, "cell": "b", "time_ms": "fast"}))
    with pytest.raises(DamagedRun, match=r"line 2 has 'time_ms' = 'fast' \(a str\), not float"):
        store.rows()


def test_a_writer_cannot_append_a_field_of_another_type(tmp_path):
    store = RunStore.create(tmp_path, "rows")
    with pytest.raises(ValueError, match=r"has 'flags' = 'busy machine' \(a str\), not list"):
        store.append({**ROW, "flags": "busy machine"})
    assert store.rows() == []


def test_a_type_the_checks_do_not_know_is_refused_not_let_through():
    """The checks come from the schema's annotations: a field declared with a form they
    cannot check fails at import rather than passing every value."""
    with pytest.raises(TypeError, match="has no check"):
        field_check(tuple[int, int])
    assert field_check(list[int])([1, 2]) and not field_check(list[int])([1, 2.5])


# --- every field a run writes is declared ----------------------------------------------
OVERFLOW = """
    import playground

    Vanilla = playground.get_variant("vanilla")

    class Overflow(Vanilla):
        name = "overflow"
        summary = "vanilla whose flops() overflows at 24 tokens"

        @classmethod
        def flops(cls, n_q, n_k, *args, **options):
            return float("inf") if n_q >= 24 else super().flops(n_q, n_k, *args, **options)

    @playground.hookimpl
    def register_attention(register):
        register(Overflow)
"""

EVERY_KIND = """
    name = "every_kind"
    seq_lens = [24]
    batch_size = 1
    d_model = 16
    num_heads = 2
    passes = ["forward", "forward_backward", "decode"]
    measures = ["speed", "memory", "fidelity", "accuracy"]
    accuracy_workers = 1
    threads = 1  # tiny models: more threads only wait for each other
    save_weights = true

    [timing]
    min_run_time = 0.001

    [[variants]]
    name = "alibi"
    learnable_slopes = true

    [[variants]]
    name = "linformer"
    k = 4
    seq_len = 24

    [[variants]]
    name = "overflow"

    [[tasks]]
    name = "mqar"
    variants = ["alibi", "linformer"]
    seq_len = 12
    num_pairs = 2
    steps = 2
    batch_size = 4
    seeds = 2
    d_model = 16
    num_heads = 2
    learning_rate = [1e-3, 1e-2]
    curriculum = [{ seq_len = 8, num_pairs = 1, steps = 1, batch_size = 4 }]

    [[tasks]]
    name = "mqar"
    variants = ["alibi"]
    seq_len = 12
    num_pairs = 2
    steps = 2
    batch_size = 4
    seeds = 2
    d_model = 16
    num_heads = 2
    eval_lengths = [24]

    [[tasks]]
    name = "lm"
    variants = ["alibi", "linformer"]
    corpus = "CORPUS"
    seq_len = 48
    eval_bytes = 768
    sample_bytes = 4
    prompt = "the "
    eval_lengths = [96]
    passkey_fraction = 0.5
    passkey_depths = [0.0, 1.0]
    passkey_trials = 2
    steps = 2
    batch_size = 4
    seeds = 2
    d_model = 16
    num_heads = 2
    num_layers = 1
"""


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.mark.slow
def test_every_field_a_run_writes_is_declared(tmp_path: Path, write_plugin, monkeypatch):
    """Cost cells of every pass (fidelity, a score_mod variant, a flops() that overflows,
    a variant that cannot decode), a swept curriculum task, a task scored at a further
    length, a language task with the passkey probe, a further evaluation length and
    weights kept, then `playground eval` at another length: each key of each row must be
    declared in playground/run/row_schema.py."""
    monkeypatch.setattr(
        runner_module, "gemm_flops_per_second", lambda *a, **k: GemmRate(1e11, 9e10)
    )
    monkeypatch.setattr(runner_module, "memory_bandwidth", lambda *a: Bandwidth(1e10, 2**20, 1))
    registry = Registry.discover([write_plugin("overflow.py", OVERFLOW).parent], entry_points=False)
    corpus = write_corpus(tmp_path / "corpus", files=10, size=3000)
    path = tmp_path / "spec.toml"
    path.write_text(textwrap.dedent(EVERY_KIND).replace("CORPUS", str(corpus)))
    store = RunStore.create(tmp_path / "results", "every_kind")
    runner = Runner(load_spec(str(path), registry), registry, store, Console(file=io.StringIO()))
    runner.start()
    assert runner.measure_pending()[1]
    assert evaluate_again(store.directory, registry, [144], announce=lambda _: None) > 0

    declared = set(get_type_hints(Row))
    rows = store.rows()
    for row in rows:
        undeclared = sorted(set(row) - declared)
        assert not undeclared, f"{row['cell']} writes {undeclared}: declare them in row_schema"
    written = set().union(*rows)
    # The run reached every writer: a field of each.
    assert {
        "gemm_library",
        "pass",
        "time_iqr_ms",
        "peak_memory_bytes",
        "fidelity_local_max_abs_error",
        "score_mod_path",
        "cpu_kernel",
        "flops_note",
        "steps_per_run",
        "bandwidth_efficiency",
        "curriculum",
        "sweep",
        "accuracy_ci95_low",
        "state_source",
        "learned_per_seed",
        "validation_per_seed",
        "bits_per_byte_ci95_high",
        "bigram_bits_per_byte",
        "position_bucket",
        "bits_per_byte_by_position_ci95",
        "passkey_exact_per_seed",
        "passkey_chance_log_likelihood",
        "samples",
        "corpus_fingerprint",
        "weights",
        "evaluated_at",
    } <= written
    assert {"ok", "unsupported"} <= {row["status"] for row in rows}
    further = [row for row in rows if "|eval_len=" in row["cell"]]
    assert {row.get("metric") for row in further} == {"accuracy", "bits_per_byte"}
