"""Every import path a plugin, the README or a task plugin uses keeps working: the
plugin-facing modules stay where an author imports them, whatever moves behind them
(issue 31). A rename or move that breaks one fails here, naming the path. And the shipped
plugins and the `playground new` templates use only those paths: their imports are parsed,
so a plugin that reaches into a private module fails here too (issue 44)."""

from __future__ import annotations

import ast
import importlib
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from playground.cli.scaffold import TEMPLATES, render_template

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"

PUBLIC = {
    "playground": [
        "AttentionOutput", "AttentionVariant", "Capabilities", "ConfigError", "InvalidInput",
        "UnsupportedFeature", "VariantConfig", "SoftmaxAttention", "hookimpl", "build",
        "HookError", "VariantFailedToLoad", "SoftmaxConfig", "require_positive",
        "require_range", "picture_width",
    ],
    "playground.config": ["build_config", "VariantConfig"],
    "playground.contract": ["AttentionVariant", "AttentionOutput", "Capabilities"],
    "playground.errors": ["PlaygroundError", "ConfigError", "InvalidInput", "HookError"],
    "playground.hookspecs": ["hookimpl"],
    "playground.registry": ["Registry", "default_registry"],
    "playground.heads": [
        "add_projections", "attention_flops", "merge_heads", "project_heads",
        "project_output", "projection_flops", "split_heads", "prefill_key_value_cache",
    ],
    "playground.masks": [
        "allowed_keys", "empty_query_rows", "masked_softmax", "queries_without_keys",
        "causal_mask",
    ],
    "playground.decoding": [
        "DecodingState", "TokenCache", "cached_attention", "real_tokens",
        "refuse_forward_arguments",
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


def public_attribute(module: str, attributes: list[str]) -> str | None:
    """The dotted path `module.a.b...` reads, or None when it stays on public paths: a
    PUBLIC module's attribute is either a submodule that is itself a PUBLIC key (the walk
    goes on) or one of its public names (what the name holds is its own business)."""
    for attribute in attributes:
        if f"{module}.{attribute}" in PUBLIC:
            module = f"{module}.{attribute}"
        elif attribute in PUBLIC.get(module, ()):
            return None
        else:
            return f"{module}.{attribute}"
    return None


def attribute_chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """`a.b.c` -> ("a", ["b", "c"]); None when the chain does not start at a plain name."""
    attributes: list[str] = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        attributes.insert(0, value.attr)
        value = value.value
    return (value.id, attributes) if isinstance(value, ast.Name) else None


def non_public_uses(source: str, origin: str) -> list[str]:
    """Each place where `source` imports from playground, or reads an attribute of an
    imported playground module, outside PUBLIC, as "origin:line: what". Every import
    counts, those inside functions and under `if TYPE_CHECKING` included, as ast.walk
    visits the whole tree."""
    tree = ast.parse(source, filename=origin)
    found: list[str] = []
    bound_modules: dict[str, str] = {}  # local name -> the playground module it holds
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "playground":
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in PUBLIC:
                    bound_modules[alias.asname or alias.name] = submodule
                elif alias.name not in PUBLIC.get(node.module, ()):
                    found.append(f"{origin}:{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "playground":
                    continue
                if alias.name not in PUBLIC:
                    found.append(f"{origin}:{node.lineno}: import {alias.name}")
                elif alias.asname:
                    bound_modules[alias.asname] = alias.name
                else:  # `import playground.masks` binds `playground`
                    bound_modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain = attribute_chain(node)
        if chain is None or chain[0] not in bound_modules:
            continue
        # ast.walk meets `x.a.b` and its inner `x.a` both: one report per line and path.
        path = public_attribute(bound_modules[chain[0]], chain[1])
        if path is not None and f"{origin}:{node.lineno}: {path}" not in found:
            found.append(f"{origin}:{node.lineno}: {path}")
    return found


def non_public_imports(directory: Path) -> list[str]:
    """non_public_uses over every plugin file (`*.py`) in `directory`."""
    return [
        use
        for file in sorted(directory.glob("*.py"))
        for use in non_public_uses(file.read_text(encoding="utf-8"), file.name)
    ]


def test_the_shipped_plugins_import_only_public_paths():
    assert sorted(PLUGINS.glob("*.py")), f"no plugin files found in {PLUGINS}"
    found = non_public_imports(PLUGINS)
    assert not found, "plugins import past the public paths:\n" + "\n".join(found)


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_the_scaffold_templates_import_only_public_paths(kind):
    source, _ = render_template("my_attention", kind)
    assert "import playground" in source
    found = non_public_uses(source, f"{kind} template")
    assert not found, "\n".join(found)


def test_a_plugin_reaching_into_a_private_module_is_named(tmp_path):
    """The check can fail: each way of reaching past PUBLIC is reported, with its line."""
    (tmp_path / "sneaky.py").write_text(
        "import playground\n"
        "import playground.kernels.mod_grid\n"
        "from playground.kernels.mod_grid import index_grid\n"
        "from playground.masks import allowed_keys, private_helper\n"
        "if TYPE_CHECKING:\n"
        "    from playground.run.spec import RunSpec\n"
        "def later():\n"
        "    from playground import registry as reg\n"
        "    from playground import heads\n"
        "    return heads.split_heads, heads._scale, playground.model.cpu_detection, reg.Registry\n",
        encoding="utf-8",
    )
    (tmp_path / "fine.py").write_text(
        "import playground\nfrom playground.masks import allowed_keys\n"
        "x = playground.SoftmaxAttention.Config, playground.masks.masked_softmax\n",
        encoding="utf-8",
    )
    assert non_public_imports(tmp_path) == [
        "sneaky.py:2: import playground.kernels.mod_grid",
        "sneaky.py:3: from playground.kernels.mod_grid import index_grid",
        "sneaky.py:4: from playground.masks import private_helper",
        "sneaky.py:6: from playground.run.spec import RunSpec",
        "sneaky.py:10: playground.heads._scale",
        "sneaky.py:10: playground.model",
    ]


def test_a_plugin_file_written_like_the_shipped_ones_loads():
    """Each shipped plugin still runs alone, its imports resolving."""
    for file in sorted(PLUGINS.glob("*.py")):
        runpy.run_path(str(file))
