"""Every import path a plugin, the README or a task plugin uses keeps working: the
plugin-facing modules stay where an author imports them, whatever moves behind them
(issue 31). A rename or move that breaks one fails here, naming the path."""

from __future__ import annotations

import importlib
import runpy
import subprocess
import sys

import pytest

PUBLIC = {
    "playground": [
        "AttentionOutput", "AttentionVariant", "Capabilities", "ConfigError", "InvalidInput",
        "UnsupportedFeature", "VariantConfig", "SoftmaxAttention", "hookimpl", "build",
        "HookError", "VariantFailedToLoad",
    ],
    "playground.config": ["build_config", "VariantConfig"],
    "playground.contract": ["AttentionVariant", "AttentionOutput", "Capabilities"],
    "playground.errors": ["PlaygroundError", "ConfigError", "InvalidInput", "HookError"],
    "playground.hookspecs": ["hookimpl"],
    "playground.registry": ["Registry", "default_registry"],
    "playground.heads": [
        "add_projections", "attention_flops", "merge_heads", "project_heads",
        "project_output", "projection_flops", "split_heads",
    ],
    "playground.masks": [
        "allowed_keys", "empty_query_rows", "masked_softmax", "queries_without_keys",
    ],
    "playground.kernels": [
        "BAND_BLOCK", "banded_attention", "blocked_attention", "biased_attention",
        "hankel_biased_attention", "relative_bias_attention", "native",
    ],
    "playground.softmax_attention": ["SoftmaxAttention", "ExactAttention"],
    "playground.tasks": ["Task", "TaskData", "IGNORE"],
    "playground.testing": [
        "parametrize_with_checks", "check_attention", "property_search", "CHECKS",
    ],
    "playground.cli": ["main", "build_parser"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_imports_from_where_plugins_import_it(module):
    imported = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_root_all_names_exist():
    import playground

    assert all(hasattr(playground, name) for name in playground.__all__)


@pytest.mark.parametrize(
    "module",
    [
        "playground.cli.bench",
        "playground.report.bench_history",
        "playground",
        "playground.bench",  # the paths the README used before issue 31
        "playground.bench_history",
    ],
)
def test_the_readmes_python_m_commands_start(module):
    """`python -m MODULE --help` as the README runs them."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()


def test_the_entry_point_is_the_clis_main():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "playground"]
    assert script.value == "playground.cli:main"
    assert callable(script.load())


def test_a_plugin_file_written_like_the_shipped_ones_loads(tmp_path):
    """The shipped plugins import only the public paths above: each still runs alone."""
    from pathlib import Path

    plugins = Path(__file__).resolve().parents[1] / "plugins"
    for file in sorted(plugins.glob("*.py")):
        runpy.run_path(str(file))
