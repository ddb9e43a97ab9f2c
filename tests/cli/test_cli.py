"""The command line: every command runs, reports plugin errors, and exits non-zero on
failure."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from playground.cli import build_parser, main
from playground.registry import configure

BROKEN_CAUSAL_PLUGIN = """
    import playground
    from tests.broken_variants import LeaksFuture

    @playground.hookimpl
    def register_attention(register):
        register(LeaksFuture)
"""


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_shows_name_source_complexity_capabilities(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "vanilla" in out and "plugins/vanilla.py" in out and "O(n^2.0)" in out
    assert "causal" in out and "padding_mask" in out


def test_info_shows_paper_options_and_capabilities(capsys):
    code, out, _ = run(capsys, "info", "vanilla")
    assert code == 0
    for text in ("Vaswani et al. 2017", "dropout", "float", "0.0", "bias", "need_weights"):
        assert text in out


@pytest.mark.parametrize(
    ("name", "cache"),
    [
        # float32 keys and values of 512 (gqa: 2 of 8 heads, 128), and a real-token flag
        ("vanilla", "4,097 bytes per token and layer"),
        ("gqa", "1,025 bytes per token and layer"),
        ("sliding_window", "fixed size"),  # W = 512 keys, reached by 1024
        ("linear", "fixed size"),
        ("linformer", "none: variant 'linformer' does not support decoding"),
    ],
)
def test_info_shows_the_decoding_state(capsys, name, cache):
    """Read from states prefilled at 1024 and 4096 tokens, so it cannot disagree with them."""
    code, out, _ = run(capsys, "info", name)
    assert code == 0 and cache in " ".join(out.split())


def test_info_of_unknown_variant_suggests_and_exits_2(capsys):
    code, _, err = run(capsys, "info", "vanila")
    assert code == 2 and "did you mean 'vanilla'" in err


def test_plugins_lists_sources_and_load_errors(capsys, write_plugin):
    bad = write_plugin("explodes.py", "raise ImportError('needs triton')\n")
    code, out, _ = run(capsys, "plugins", "--plugins-dir", str(bad.parent))
    assert code == 1
    assert "plugins/vanilla.py" in out and "explodes.py" in out and "needs triton" in out


def test_list_still_works_and_reports_a_broken_plugin(capsys, write_plugin):
    bad = write_plugin("explodes.py", "import not_installed_anywhere\n")
    code, out, err = run(capsys, "--plugins-dir", str(bad.parent), "list")
    assert code == 0 and "vanilla" in out
    assert "explodes.py" in err and "not_installed_anywhere" in err


def test_check_passes_for_vanilla(capsys):
    """The command's wiring (the whole suite on vanilla runs in test_contract_suite)."""
    code, out, _ = run(capsys, "check", "vanilla", "-k", "causality")
    assert code == 0
    assert "2 passed, 0 failed" in out  # check_causality on both paths


def test_check_fails_with_exit_1_for_a_broken_variant(capsys, write_plugin):
    plugin = write_plugin("leaky.py", BROKEN_CAUSAL_PLUGIN)
    code, out, _ = run(
        capsys, "check", "broken_leaks_future", "--plugins-dir", str(plugin.parent), "-k", "caus"
    )
    assert code == 1
    assert "check_causality" in out and "leaks the future" in out


def test_check_all_fails_when_a_plugin_did_not_load(capsys, write_plugin):
    bad = write_plugin("syntax.py", "def (:\n")
    code, _, err = run(capsys, "--plugins-dir", str(bad.parent), "check", "--all", "-k", "shape")
    assert code == 1 and "SyntaxError" in err


def test_check_without_names_asks_for_them(capsys):
    code, _, err = run(capsys, "check")
    assert code == 2 and "--all" in err


def test_check_k_selects_checks(capsys):
    code, out, _ = run(capsys, "check", "vanilla", "-k", "causality", "-v")
    assert code == 0 and "check_causality" in out and "check_float64" not in out


def test_every_command_has_help():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, subparser in commands.items():
        assert subparser.format_help().startswith("usage: playground " + name)


def test_console_script_is_installed():
    beside_python = Path(sys.executable).parent / "playground"
    executable = str(beside_python) if beside_python.exists() else shutil.which("playground")
    assert executable, "the `playground` console script is not on PATH; pip install -e ."
    completed = subprocess.run([executable, "--help"], capture_output=True, text=True, check=False)
    assert completed.returncode == 0 and "--plugins-dir" in completed.stdout


def test_plot_benchmarks_draws_the_saved_history(capsys, tmp_path):
    from tests.gates.saved_runs import save_run

    storage = tmp_path / ".benchmarks"
    for number in (1, 2):
        save_run(storage, number, {"vanilla-n512-forward": 1}, {"vanilla-n512-forward": 0.001})
    out = tmp_path / "history.png"
    code, stdout, _ = run(capsys, "plot", "--benchmarks", str(storage), "--out", str(out))
    assert code == 0 and out.stat().st_size > 10_000 and str(out) in stdout


def test_plot_of_an_empty_run_directory_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "spec.toml").write_text('name = "x"\n')
    code, _, err = run(capsys, "plot", str(tmp_path))
    assert code == 2 and "nothing to plot" in err
