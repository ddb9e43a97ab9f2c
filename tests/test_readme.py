"""The README's "write your own variant" example is a working plugin that passes the
contract suite, so the README cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from playground.registry import Registry
from playground.testing import check_attention

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_plugin_passes_the_contract_suite(write_plugin):
    section = README.read_text().split("## Write your own variant", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    path = write_plugin("scaled_cosine.py", example)
    registry = Registry.discover([path.parent], entry_points=False)
    assert not registry.errors
    report = check_attention("cosine", registry=registry)
    assert report.ok, report.failures
