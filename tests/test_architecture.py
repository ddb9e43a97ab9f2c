"""The tree keeps the architecture docs/design.md describes: the import contracts in
pyproject.toml hold (and a planted upward import breaks them), no import cycle, no lazy
import but an optional dependency's, no module over 450 lines but the justified ones, and
no module inside the package importing the root package."""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "playground"

MAX_LINES = 450


def ceilings() -> dict[str, int]:
    """The modules docs/design.md allows past MAX_LINES, each with its ceiling: one cohesive
    job it justifies keeping in one file ("- `registry.py` (ceiling 600): ...")."""
    text = (ROOT / "docs" / "design.md").read_text()
    return {
        module: int(ceiling)
        for module, ceiling in re.findall(r"^- `([\w/]+\.py)` \(ceiling (\d+)\)", text, re.M)
    }


LAZY_IMPORTS_ALLOWED = {
    "ray": "the `ray` extra: the ray executor imports it only when it runs",
    "pytest": "only inside a test run: parametrize_with_checks and CheckCase.check",
    "transformers": "the `hf` extra: playground.hf imports it when a bridge is used",
}
"""Optional dependencies (in no part of [project].dependencies): a function imports them
so that the package imports without them. Any other import sits at the top of a module,
where the import contracts and a reader see it."""

PLANTED = "from playground.cli import main  # planted upward import\n"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the contracts of `cwd`/pyproject.toml, on the `playground`
    package found first from `cwd` (import-linter puts its working directory first on
    sys.path, ahead of the editable install's finder)."""
    script = Path(sysconfig.get_path("scripts")) / "lint-imports"
    if not script.is_file():
        pytest.fail(f'import-linter is not installed for {sys.executable}: pip install -e ".[dev]"')
    return subprocess.run(
        [str(script), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@functools.cache
def modules() -> dict[str, Path]:
    """The path of every module in the package, by dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, name: str) -> Iterator[tuple[str, ast.stmt, bool]]:
    """(imported module, statement, inside a function) for each import in a module; a
    `from X import y` imports module X.y when that is a module, else X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(node: ast.AST, lazy: bool) -> Iterator[tuple[str, ast.stmt, bool]]:
        for child in ast.iter_child_nodes(node):
            inside = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child, inside
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    yield (submodule if submodule in modules() else base), child, inside
            yield from walk(child, inside)

    yield from walk(ast.parse(path.read_text(), str(path)), False)


def where(path: Path, statement: ast.stmt) -> str:
    return f"{path.relative_to(ROOT)}:{statement.lineno}"


def test_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_planted_upward_import_breaks_the_contracts(tmp_path: Path):
    shutil.copytree(PACKAGE, tmp_path / "playground", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / "playground" / "errors.py").open("a") as errors:
        errors.write(PLANTED)
    result = lint_imports(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # The edge named proves the copy was analysed: the checkout has no such import.
    assert "playground.errors -> playground.cli" in output, output


def test_no_import_cycles():
    """Imports inside functions and under TYPE_CHECKING count: each is an edge a reader
    has to follow, and a cycle through one still ties the modules together."""
    graph = {
        name: {target for target, _, _ in imports(path, name) if target in modules()}
        for name, path in modules().items()
    }
    cycles = []
    state: dict[str, str] = {}  # "open" while on the DFS stack, then "done"

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target, [*stack, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_only_optional_dependencies_are_imported_lazily():
    lazy = {
        f"{where(path, statement)} imports {target}"
        for name, path in modules().items()
        for target, statement, inside in imports(path, name)
        if inside and target.partition(".")[0] not in LAZY_IMPORTS_ALLOWED
    }
    assert not lazy, "imports inside functions:\n" + "\n".join(sorted(lazy))


def test_lazily_imported_packages_are_optional():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {
        re.match(r"[\w.-]+", requirement).group().lower() for requirement in project["dependencies"]
    }
    assert not required & set(LAZY_IMPORTS_ALLOWED), "a required package needs no lazy import"


def test_no_module_is_over_the_line_limit():
    lines = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in modules().values()
    }
    allowed = ceilings()
    assert allowed, "docs/design.md lists no ceilings: the pattern above no longer reads it"
    long = {
        module: count for module, count in lines.items() if count > allowed.get(module, MAX_LINES)
    }
    assert not long, f"modules over {MAX_LINES} lines, or over their ceiling: {long}"
    needless = {module for module, ceiling in allowed.items() if lines.get(module, 0) <= MAX_LINES}
    assert not needless, f"ceilings docs/design.md no longer needs (now short): {needless}"


def test_no_module_imports_the_root_package():
    """`import playground` inside the package hides the real edge (the root imports the
    registry, the softmax attention, ...): a module imports the submodule it needs."""
    offenders = [
        where(path, statement)
        for name, path in modules().items()
        for target, statement, _ in imports(path, name)
        if target == "playground"
    ]
    assert not offenders, "imports of the root package: " + ", ".join(offenders)
