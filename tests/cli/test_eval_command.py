"""`playground eval RUN --eval-lengths ...` through the command line (issue 32): a run
trained with --save-weights is scored again at new lengths, appending rows and exiting 0;
lengths that cannot be read, a run that kept no weights and a run that is not there are
one-line errors with a non-zero exit status."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from playground.cli import main
from playground.registry import configure
from playground.run import runner as runner_module
from playground.run.store import RunStore
from tests.tasks.text_corpus import write_corpus

L = 16

SPEC = """\
    name = "lm_cli"
    measures = ["accuracy"]
    accuracy_workers = 1

    [[variants]]
    name = "alibi"

    [[tasks]]
    name = "lm"
    corpus = "{corpus}"
    seq_len = {L}
    eval_bytes = 512
    eval_lengths = [{double}]
    sample_bytes = 8
    steps = 3
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


@pytest.fixture(autouse=True)
def _no_gemm(monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)


def train(tmp_path: Path, *flags: str) -> Path:
    """A finished one-cell LM run (alibi, two seeds) of the tiny spec; its directory."""
    corpus = write_corpus(tmp_path / "corpus", files=10, size=3000)
    spec = tmp_path / "lm_cli.toml"
    spec.write_text(textwrap.dedent(SPEC).format(corpus=corpus, L=L, double=2 * L))
    out = tmp_path / "results"
    assert main(["run", str(spec), "--out", str(out), "--threads", "1", *flags]) == 0
    configure([])
    (run_dir,) = (out / "lm_cli").iterdir()
    return run_dir


def one_line_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.strip() and err.strip().count("\n") == 0, err
    return err


@pytest.fixture
def kept(tmp_path: Path, capsys) -> Path:
    run_dir = train(tmp_path, "--save-weights")  # the flag, not the spec key
    capsys.readouterr()
    return run_dir


def test_eval_appends_a_row_per_new_length_and_exits_0(kept, capsys):
    rows = RunStore(kept).rows()
    assert [row["eval_length"] for row in rows] == [L, 2 * L]
    assert all(set(row["weights"]) == {"0", "1"} for row in rows)
    assert main(["eval", str(kept), "--eval-lengths", f"{4 * L},{8 * L}"]) == 0
    out, _ = capsys.readouterr()
    assert "2 row(s) appended" in " ".join(out.split())
    after = RunStore(kept).rows()
    assert after[: len(rows)] == rows
    assert [row["eval_length"] for row in after[len(rows) :]] == [4 * L, 8 * L]
    assert all(row["status"] == "ok" for row in after)
    # Again, with a length already there: nothing is appended, and that is not an error.
    assert main(["eval", str(kept), "--eval-lengths", f"{2 * L},{8 * L}"]) == 0
    out, _ = capsys.readouterr()
    assert "nothing to evaluate" in out and "0 row(s) appended" in " ".join(out.split())
    assert RunStore(kept).rows() == after


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ("0,x", "--eval-lengths takes comma-separated integers"),
        ("64,", "--eval-lengths takes comma-separated integers"),
        ("0,64", "--eval-lengths takes distinct positive lengths"),
        ("64,64", "--eval-lengths takes distinct positive lengths"),
        ("4096", "eval_bytes = 512"),
    ],
)
def test_lengths_that_cannot_be_used_are_one_line_errors(kept, capsys, lengths, expected):
    before = (kept / "results.jsonl").read_bytes()
    code = main(["eval", str(kept), "--eval-lengths", lengths])
    assert code != 0
    assert expected in " ".join(one_line_error(capsys).split())
    assert (kept / "results.jsonl").read_bytes() == before


def test_a_run_without_weights_and_a_missing_run_are_one_line_errors(tmp_path, capsys):
    run_dir = train(tmp_path)
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--eval-lengths", f"{4 * L}"]) != 0
    assert "save_weights = true (the spec key; or --save-weights)" in " ".join(
        one_line_error(capsys).split()
    )
    missing = tmp_path / "results" / "lm_cli" / "nothing-here"
    assert main(["eval", str(missing), "--eval-lengths", f"{4 * L}"]) != 0
    assert "nothing-here" in one_line_error(capsys)
