"""The README's "What a plugin file holds" example is a working plugin that passes the
contract suite, so the README cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from playground.registry import Registry
from playground.testing import check_attention

README = Path(__file__).resolve().parent.parent / "README.md"


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
    workflow = (README.parent / "tests" / "test_workflow.py").read_text()
    calls = re.findall(r"\bplayground\(((?:\"[^\"]*\",? ?)+)\)", workflow)
    ran = [re.findall(r'"([^"]*)"', call) for call in calls]
    assert [command[1:] for command in commands] == ran
    assert all(command[0] == "playground" for command in commands)
