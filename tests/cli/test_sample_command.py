"""Issue 42: `playground sample RUN --prompt ...` generates from a run's kept weights
(before, it took ModelConfig and TransformerClassifier from the source), and a run that
kept none is one line naming the spec key that keeps them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from playground.cli import main
from playground.cli.samples import readable
from playground.model.sampling import generate
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry, configure
from playground.run import runner as runner_module
from playground.run.store import RunStore
from tests.cli import test_eval_command as lm_run

PROMPT = "the data "


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kept")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)
        run_dir = lm_run.train(root, "--save-weights")
    configure([])
    return run_dir


def by_hand(run_dir: Path, seed: str, prompt: bytes, new: int) -> bytes:
    """What a user had to write before: the model from its row, the weights, generate()."""
    (row,) = [r for r in RunStore(run_dir).rows() if r["eval_length"] == r["train_length"]]
    fields = {field.name for field in dataclasses.fields(ModelConfig)}
    config = ModelConfig(**{key: value for key, value in row["model"].items() if key in fields})
    model = TransformerClassifier(config, Registry.discover(entry_points=False))
    model.load_state_dict(torch.load(run_dir / row["weights"][seed], weights_only=True))
    tokens = torch.tensor([list(prompt)])
    return bytes(generate(model, tokens, new)[0].tolist())


def printed(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return out


def test_sample_continues_the_prompt_as_the_kept_model_does(kept, capsys):
    assert main(["sample", str(kept), "--prompt", PROMPT, "--max-new-tokens", "12"]) == 0
    header, text = printed(capsys).split("\n", 1)
    assert header == "alibi d_model=16 num_heads=2 num_layers=1 (seed 0)"
    expected = by_hand(kept, "0", PROMPT.encode(), 12)
    assert text.startswith(PROMPT + readable(expected) + "\n")
    assert (
        main(["sample", str(kept), "--prompt", PROMPT, "--max-new-tokens", "12", "--seed", "1"])
        == 0
    )
    out = printed(capsys)
    assert "(seed 1)" in out
    assert PROMPT + readable(by_hand(kept, "1", PROMPT.encode(), 12)) in out


def test_a_draw_at_a_temperature_is_the_same_for_the_same_seed(kept, capsys):
    argv = ["sample", str(kept), "--prompt", PROMPT, "--temperature", "3", "--max-new-tokens", "40"]
    assert main(argv) == 0
    first = printed(capsys)
    assert main(argv) == 0
    assert printed(capsys) == first
    assert main([*argv, "--draw-seed", "7"]) == 0
    assert printed(capsys) != first


def test_a_prompt_longer_than_the_training_length_keeps_its_end(kept, capsys):
    long = "x" * 10 + "y" * lm_run.L
    assert main(["sample", str(kept), "--prompt", long, "--max-new-tokens", "4"]) == 0
    out = " ".join(printed(capsys).split())
    assert "the prompt's first 10 bytes left out" in out
    assert "x" not in out.split("left out")[1]


def one_line_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.strip() and err.strip().count("\n") == 0, err
    return " ".join(err.split())


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--seed", "5"], "kept the weights of seed(s) 0, 1, not of seed 5; give --seed one"),
        (["--variant", "rope"], "no kept model of this run is variant 'rope'; the run kept: alibi"),
        (["--cell", "nope"], "no kept model of this run is cell 'nope'"),
        (["--prompt", ""], "give a prompt to continue"),
    ],
)
def test_a_choice_that_selects_nothing_is_one_line(kept, capsys, flags, expected):
    assert main(["sample", str(kept), "--prompt", PROMPT, *flags]) == 2
    assert expected in one_line_error(capsys)


def test_a_run_that_kept_no_weights_names_the_spec_key(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)
    run_dir = lm_run.train(tmp_path)
    capsys.readouterr()
    assert main(["sample", str(run_dir), "--prompt", PROMPT]) == 2
    message = one_line_error(capsys)
    assert "kept no trained weights" in message
    assert "save_weights = true (the spec key; or --save-weights)" in message
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert all("weights" not in row for row in rows)
