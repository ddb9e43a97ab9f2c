"""Spec validation (issue 30): every error of a spec at once, a Ray address refused
before anything runs, a batch larger than the training set, and the top-level width of a
spec that measures only accuracy."""

from __future__ import annotations

import re
import textwrap

import pytest

from playground.cli import main
from playground.registry import Registry
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec
from playground.run.spec_overrides import apply_overrides

TINY = """
name = "tiny"
seq_lens = [16]
d_model = 16
num_heads = 2
passes = ["forward"]
measures = ["speed"]
[timing]
min_run_time = 0.01
[[variants]]
name = "vanilla"
"""


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover(entry_points=False)


@pytest.fixture
def spec_file(tmp_path):
    def write(body: str) -> str:
        path = tmp_path / "spec.toml"
        path.write_text(textwrap.dedent(body))
        return str(path)

    return write


# --- every error at once -------------------------------------------------------------
def test_a_spec_with_several_errors_reports_all_of_them(spec_file, registry):
    body = (
        'name = "bad"\nseq_len = [8]\ndtype = "float8"\nbatch_size = "two"\n'
        'passes = ["backward"]\nbaseline = "vanilla"\n'
        "[timing]\nmin_runtime = 1\n"
        '[[variants]]\nname = "vanila"\n'
        '[[variants]]\nname = "linformer"\nk = [8, "x"]\n'
        '[[variants]]\nname = "vanilla"\n'
        '[[tasks]]\nname = "mqr"\n'
        '[[tasks]]\nname = "lookback"\nseq_len = -5\nseeds = 0\n'
    )
    path = spec_file(body)
    with pytest.raises(SpecError) as raised:
        load_spec(path, registry)
    message = str(raised.value)
    expected = [
        r"10 problems",
        r"key 'seq_len': unknown key; did you mean 'seq_lens'",
        r"key 'dtype': 'float8' is not one of",
        r"key 'batch_size': must be an integer",
        r"key 'passes': 'backward' is not one of",
        r"key 'timing.min_runtime': unknown key",
        r"variants\[0\]\.name.*did you mean 'vanilla'",
        r"variants\[1\]: option 'k' of variant 'linformer' must be an integer",
        r"tasks\[0\]\.name: no task named 'mqr'",
        r"tasks\[1\]\.seeds: must be a positive integer",
        r"tasks\[1\]: task 'lookback': seq_len must be at least 2",
    ]
    for pattern in expected:
        assert re.search(pattern, message), (pattern, message)
    assert message.startswith(f"{path}: ") and message.count("\n  - ") == 10
    # the baseline exists among the valid points: no spurious complaint about it
    assert "key 'baseline'" not in message


def test_a_spec_with_one_error_keeps_the_one_line_message(spec_file, registry):
    path = spec_file('dtype = "float8"\n' + TINY)
    with pytest.raises(SpecError) as raised:
        load_spec(path, registry)
    assert str(raised.value) == (
        f"{path}: key 'dtype': 'float8' is not one of float32, float64, bfloat16, float16"
    )


def test_the_cli_prints_every_error_of_a_spec_and_makes_no_run(spec_file, tmp_path, capsys):
    path = spec_file('dtype = "float8"\nseed = "x"\n' + TINY)
    assert main(["run", path, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "2 problems" in err and "'float8'" in err and "key 'seed'" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# --- the Ray address -------------------------------------------------------------------
@pytest.mark.parametrize("address", ["", " ", "10.0.0.1", "10.0.0.1:", "host:99999", "a b:1"])
def test_a_malformed_address_is_refused_before_the_run_directory(
    spec_file, tmp_path, capsys, address
):
    path = spec_file(f'executor = "ray"\naddress = "{address}"\n' + TINY)
    assert main(["run", path, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "key 'address'" in err and "is not a Ray cluster address" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "address", ["auto", "local", "10.0.0.1:6379", "head-node.example:6379", "ray://h:10001"]
)
def test_well_formed_addresses_pass(spec_file, registry, address):
    path = spec_file(f'executor = "ray"\naddress = "{address}"\n' + TINY)
    assert load_spec(path, registry).address == address


def test_an_empty_address_on_the_command_line_is_refused_too(spec_file, registry):
    spec = load_spec(spec_file(TINY), registry)
    with pytest.raises(SpecError, match=r"--address: '' is not a Ray cluster address"):
        apply_overrides(spec, registry, {"executor": "ray", "address": ""})


# --- a batch larger than the training set ---------------------------------------------
@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("batch_size = 9000", r"tasks\[0\]\.batch_size: 9000 is more than the 8192 training"),
        (
            "curriculum = [{ seq_len = 32, batch_size = 9000 }]",
            r"tasks\[0\]\.curriculum\[0\]\.batch_size: 9000 is more than the 8192 training "
            r"examples task 'lookback\(seq_len=32\)'",
        ),
    ],
)
def test_a_batch_larger_than_the_training_set_is_refused(spec_file, registry, table, message):
    body = f'name = "acc"\nmeasures = ["accuracy"]\n[[tasks]]\nname = "lookback"\n{table}\n'
    with pytest.raises(SpecError, match=message):
        load_spec(spec_file(body), registry)
    ok = body.replace("9000", "8192")
    assert load_spec(spec_file(ok), registry).tasks


# --- the top-level width of an accuracy-only spec ------------------------------------
def test_an_accuracy_only_spec_trains_at_its_top_level_width(spec_file, registry):
    body = (
        'name = "acc"\nmeasures = ["accuracy"]\nd_model = 128\nnum_heads = 8\n'
        '[[tasks]]\nname = "lookback"\n'
        '[[tasks]]\nname = "lookback"\nseq_len = 32\nd_model = 32\n'
        '[[variants]]\nname = "vanilla"\n'
    )
    first, second = load_spec(spec_file(body), registry).tasks
    assert (first.d_model, first.num_heads) == (128, 8)
    assert first.label == "lookback d_model=128 num_heads=8"
    assert (second.d_model, second.num_heads) == (32, 8)  # its own width, the spec's heads


def test_a_spec_that_also_measures_speed_keeps_the_tasks_small_model(spec_file, registry):
    body = TINY.replace('measures = ["speed"]', 'measures = ["speed", "accuracy"]')
    (task,) = load_spec(spec_file(body + '[[tasks]]\nname = "lookback"\n'), registry).tasks
    assert (task.d_model, task.num_heads) == (64, 4) and task.label == "lookback"


def test_an_inherited_width_that_does_not_divide_names_where_it_came_from(spec_file, registry):
    body = (
        'name = "acc"\nmeasures = ["accuracy"]\nnum_heads = 6\nd_model = 96\n'
        '[[tasks]]\nname = "lookback"\nd_model = 64\n'
    )
    with pytest.raises(
        SpecError, match=r"tasks\[0\]\.d_model: 64 .* \(the spec's top-level num_heads\)"
    ):
        load_spec(spec_file(body), registry)


# --- the decode pass ------------------------------------------------------------------
def test_decode_refuses_a_context_too_short_to_time_steps_in(spec_file, registry):
    decoding = TINY.replace('passes = ["forward"]', 'passes = ["forward", "decode"]')
    with pytest.raises(SpecError, match=r"key 'seq_lens': \[16\] too short to decode at"):
        load_spec(spec_file(decoding), registry)
    spec = load_spec(spec_file(decoding.replace("seq_lens = [16]", "seq_lens = [64]")), registry)
    assert spec.passes == ("forward", "decode")
    with pytest.raises(SpecError, match=r"\[8\] too short to decode at.*--seq-lens 8,64 merged"):
        load_spec(
            spec_file(decoding.replace("seq_lens = [16]", "seq_lens = [64]")),
            registry,
            {"seq_lens": [8, 64]},
        )
    assert load_spec(spec_file(TINY), registry, {"seq_lens": [8]}).seq_lens == (8,)


def test_decode_without_speed_says_what_to_add(spec_file, registry):
    accuracy_only = TINY.replace('passes = ["forward"]', 'passes = ["decode"]').replace(
        'measures = ["speed"]', 'measures = ["accuracy"]\nseq_lens = [64]'
    )
    with pytest.raises(SpecError, match="'decode' times decoding steps: add 'speed'"):
        load_spec(spec_file(accuracy_only.replace("seq_lens = [16]\n", "")), registry)
