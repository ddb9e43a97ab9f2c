"""The command line's error cases: each is one clear line with the way out, never a
traceback. Interrupts (during the GEMM, twice in a row), places that cannot be written,
--threads, and `check -k` that selects nothing."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import playground.cli
import playground.cli.runs
import playground.run.runner
from playground.cli import main
from playground.registry import configure
from playground.run.store import RunStore

TINY = """
    name = "tiny"
    seq_lens = [8, 16]
    d_model = 32
    num_heads = 2
    measures = ["speed"]

    [timing]
    min_run_time = 0.01
"""

INTERRUPTING_PLUGIN = """
    import playground

    Vanilla = playground.get_variant("vanilla")

    class Interrupting(Vanilla):
        name = "interrupting"
        summary = "vanilla that raises Ctrl-C at n = 16"

        def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
            if query.shape[1] == 16:
                raise KeyboardInterrupt
            return super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)

    @playground.hookimpl
    def register_attention(register):
        register(Interrupting)
"""


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.fixture
def spec_path(tmp_path: Path) -> str:
    path = tmp_path / "tiny.toml"
    path.write_text(textwrap.dedent(TINY))
    return str(path)


def only_run_dir(out: Path) -> Path:
    (run_dir,) = (out / "tiny").iterdir()
    return run_dir


def one_clean_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.count("\n") == 1, err
    return err


# --- 5. resume survives an interrupt during the GEMM --------------------------------------
def test_ctrl_c_during_the_gemm_resumes_only_the_cells_asked_for(
    spec_path, tmp_path, capsys, monkeypatch
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(playground.run.runner, "gemm_flops_per_second", interrupted)
    argv = ["run", spec_path, "--variants", "vanilla", "--seq-lens", "8", "--threads", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 130
    run_dir = only_run_dir(tmp_path)
    assert f"playground run --resume {run_dir}" in capsys.readouterr().out
    monkeypatch.undo()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "2 cells (2 to run, on 1 threads, local executor)" in capsys.readouterr().out
    rows = RunStore(run_dir).rows()
    assert {(row["variant"], row["seq_len"], row["threads"]) for row in rows} == {("vanilla", 8, 1)}
    assert len(rows) == 2
    assert json.loads((run_dir / "env.json").read_text())["gemm_flops_per_s"] > 0


# --- 7. a second Ctrl-C --------------------------------------------------------------------
@pytest.mark.parametrize("during", ["plot", "summary"])
def test_ctrl_c_twice_ends_with_the_resume_hint(
    spec_path, tmp_path, capsys, monkeypatch, write_plugin, during
):
    plugin = write_plugin("interrupting.py", INTERRUPTING_PLUGIN)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    target = "plot_run" if during == "plot" else "print_summary"
    monkeypatch.setattr(playground.cli.runs, target, interrupted)
    argv = ["run", spec_path, "--variants", "interrupting", "--out", str(tmp_path)]
    assert main([*argv, "--plugins-dir", str(plugin.parent)]) == 130
    out, err = capsys.readouterr()
    run_dir = only_run_dir(tmp_path)
    assert "Traceback" not in out + err
    assert "interrupted after 2 new cells" in out  # n = 8, both passes
    assert f"Continue with: playground run --resume {run_dir}" in out


def test_ctrl_c_while_a_finished_run_is_plotted_still_says_how_to_continue(
    spec_path, tmp_path, capsys, monkeypatch
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(playground.cli.runs, "plot_run", interrupted)
    argv = ["run", spec_path, "--variants", "vanilla", "--seq-lens", "8", "--out", str(tmp_path)]
    assert main(argv) == 130
    out, _ = capsys.readouterr()
    assert f"playground run --resume {only_run_dir(tmp_path)}" in out


def test_ctrl_c_in_any_other_command_is_one_line(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(playground.cli.registry_module, "configure", interrupted)
    assert main(["list"]) == 130
    assert "interrupted" in one_clean_error(capsys)


# --- 8. places that cannot be written ---------------------------------------------------------
@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    return path


@pytest.mark.parametrize("command", ["run", "compare"])
@pytest.mark.parametrize("under", [False, True], ids=["out is a file", "out under a file"])
def test_an_unwritable_out_is_one_line(spec_path, a_file, capsys, command, under):
    out = a_file / "x" if under else a_file
    argv = [command, *([spec_path] if command == "run" else [])]
    argv += ["--variants", "vanilla", "--seq-lens", "8", "--out", str(out)]
    assert main(argv) == 2
    err = one_clean_error(capsys)
    assert "cannot write" in err and str(a_file) in err and "give --out a directory" in err
    assert a_file.read_text() == "not a directory\n"


def test_a_run_directory_that_cannot_take_a_file_is_one_line(spec_path, tmp_path, capsys):
    argv = ["run", spec_path, "--variants", "vanilla", "--seq-lens", "8", "--out", str(tmp_path)]
    assert main(argv) == 0
    run_dir = only_run_dir(tmp_path)
    (run_dir / "summary.csv").unlink()
    (run_dir / "summary.csv").mkdir()  # a directory where the summary must be written
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 2
    err = one_clean_error(capsys)
    assert f"cannot write {run_dir / 'summary.csv'}" in err


@pytest.fixture
def finished_run(spec_path, tmp_path, capsys) -> Path:
    argv = ["run", spec_path, "--variants", "vanilla", "--seq-lens", "8", "--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    return only_run_dir(tmp_path)


@pytest.mark.parametrize("under", [False, True], ids=["a file", "under a file"])
def test_plot_out_that_is_a_file_is_one_line(finished_run, a_file, capsys, under):
    out = a_file / "figures" if under else a_file
    assert main(["plot", str(finished_run), "--out", str(out)]) == 2
    err = one_clean_error(capsys)
    assert str(a_file) in err and ("is a file" in err or "cannot write" in err)


def test_plot_into_a_run_directory_whose_figures_is_a_file(finished_run, capsys):
    figures = finished_run / "figures"
    for path in figures.iterdir():
        path.unlink()
    figures.rmdir()
    figures.write_text("in the way\n")
    assert main(["plot", str(finished_run)]) == 2
    assert f"cannot write {figures}" in one_clean_error(capsys)


@pytest.mark.parametrize(
    "where", ["a file", "under a file", "impossible"], ids=["a file", "under a file", "proc"]
)
def test_new_dir_that_cannot_hold_the_file_is_one_line(a_file, capsys, where):
    directory = {"a file": a_file, "under a file": a_file / "sub", "impossible": None}[where]
    directory = directory or Path("/proc/playground-cannot-be-here")
    assert main(["new", "unwritable_probe", "--dir", str(directory)]) == 2
    err = one_clean_error(capsys)
    assert str(directory) in err and "--dir" in err
    assert a_file.read_text() == "not a directory\n"


# --- 1. --threads on the command line --------------------------------------------------------
def test_threads_flag_sets_the_rows_and_env(spec_path, tmp_path):
    argv = ["run", spec_path, "--variants", "vanilla", "--seq-lens", "8", "--threads", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    run_dir = only_run_dir(tmp_path)
    assert {row["threads"] for row in RunStore(run_dir).rows()} == {1}
    assert json.loads((run_dir / "env.json").read_text())["threads"] == 1


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_threads_flag_takes_a_positive_integer(spec_path, capsys, value):
    with pytest.raises(SystemExit) as exited:
        main(["run", spec_path, "--threads", value])
    assert exited.value.code == 2
    assert "--threads: takes a positive integer" in capsys.readouterr().err


def test_resume_refuses_threads_it_would_ignore(finished_run, capsys):
    assert main(["run", "--resume", str(finished_run), "--threads", "2"]) == 2
    assert "drop --threads" in capsys.readouterr().err


# --- 10. check -k that selects nothing --------------------------------------------------------
def test_check_k_that_selects_no_check_exits_2_and_lists_them(capsys):
    from playground.testing import CHECKS

    code = main(["check", "vanilla", "-k", "no_such_check"])
    _, err = capsys.readouterr()
    assert code == 2 and "no check name contains 'no_such_check'" in err
    assert all(check.__name__ in err for check in CHECKS)
