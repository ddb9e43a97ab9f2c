"""The README and the other docs stay true to the tree: the README's plugin example passes
the contract suite, its walkthrough is what the workflow test runs, every path, module,
shipped spec and link the docs name exists, and every measured result on docs/results.md
says how it was measured, when and where."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from playground.registry import Registry
from playground.testing import check_attention

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
DOCS = [README, RESULTS, ROOT / "DEVELOPERS.md", ROOT / "docs" / "design.md"]

# Placeholders the docs use in commands (`plugins/NAME.py`, `playground run SPEC`).
PLACEHOLDER = re.compile(r"[A-Z]{3,}")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def prose(doc: Path) -> str:
    """The doc's text outside fenced code blocks (the README's layout tree is a drawing of
    the package, not a list of paths)."""
    return re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_example_plugin_passes_the_contract_suite(write_plugin):
    section = README.read_text().split("### What a plugin file holds", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    path = write_plugin("scaled_cosine.py", example)
    registry = Registry.discover([path.parent], entry_points=False)
    assert not registry.errors
    report = check_attention("cosine", registry=registry)
    assert report.ok, report.failures


def test_readme_walkthrough_is_what_the_workflow_test_runs():
    section = README.read_text().split("## Write a new variant", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    commands = [line.split("#", 1)[0].split() for line in block.splitlines() if line.strip()]
    workflow = (ROOT / "tests" / "cli" / "test_workflow.py").read_text()
    calls = re.findall(r"\bplayground\(((?:\"[^\"]*\",? ?)+)\)", workflow)
    ran = [re.findall(r'"([^"]*)"', call) for call in calls]
    assert [command[1:] for command in commands] == ran
    assert all(command[0] == "playground" for command in commands)


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_path_the_docs_name_exists(doc):
    named = re.findall(
        r"`((?:playground|tests|tools|experiments|plugins|docs|\.ci)/[\w./-]*)`", prose(doc)
    )
    missing = sorted(
        {path for path in named if not PLACEHOLDER.search(path)}
        - {path for path in named if (ROOT / path).exists()}
    )
    assert not missing, f"{doc.name} names paths that are not in the tree: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_module_the_docs_run_exists(doc):
    """`python -m X` in a doc names a module of this checkout or an installed one."""
    missing = []
    for module in set(re.findall(r"python -m ([\w.]+)", doc.read_text(encoding="utf-8"))):
        path = ROOT.joinpath(*module.split("."))
        here = path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()
        if (ROOT / module.split(".")[0]).is_dir():
            found = here or (path / "__init__.py").is_file()
        else:
            found = importlib.util.find_spec(module) is not None
        if not found:
            missing.append(module)
    assert not missing, f"{doc.name} runs modules that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_shipped_spec_the_docs_run_exists(doc):
    names = set(re.findall(r"playground run (\w+)", doc.read_text(encoding="utf-8")))
    missing = sorted(
        name
        for name in names - {"experiments"}
        if not PLACEHOLDER.fullmatch(name) and not (ROOT / "experiments" / f"{name}.toml").is_file()
    )
    assert not missing, f"{doc.name} runs specs that are not in experiments/: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_relative_link_resolves(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", prose(path), flags=re.M)
            if anchor not in {slug(heading) for heading in headings}:
                broken.append(target)
    assert not broken, f"{doc.name} has links to nothing: {broken}"


def test_every_result_says_its_command_date_and_machine():
    sections = re.split(r"^## ", RESULTS.read_text(encoding="utf-8"), flags=re.M)[1:]
    assert sections
    for section in sections:
        heading, text = section.split("\n", 1)
        lowered = text.lower()
        assert "command" in lowered, f"'{heading}' gives no command"
        assert DATE.search(text), f"'{heading}' gives no date"
        assert "machine" in lowered, f"'{heading}' gives no machine"


def test_readme_points_to_the_results_page_instead_of_holding_measurements():
    text = prose(README)
    assert "docs/results.md" in text
    stale = re.findall(
        r"[Mm]easured (?:on (?:this|a|an|\d)\b|here)|\b\d-core\b|GFLOP/s per core|\d min \d+ s",
        text,
    )
    assert not stale, (
        f"measurements belong on docs/results.md, with command, date, machine: {stale}"
    )
