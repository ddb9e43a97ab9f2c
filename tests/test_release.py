"""The release habits of issue 44: one version, said the same in pyproject.toml, the
package and the changelog's newest release."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import playground

ROOT = Path(__file__).parents[1]


def test_the_version_is_said_once_everywhere():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert playground.__version__ == declared
    releases = re.findall(
        r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$", (ROOT / "CHANGELOG.md").read_text(), re.M
    )
    assert releases and releases[0] == declared, "CHANGELOG.md's newest release is not the version"
