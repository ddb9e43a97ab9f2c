"""A non-editable install finds the bundled plugins too, not only a checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_install_finds_bundled_plugins(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-compile",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    shipped = sorted(p.name for p in (target / "playground" / "_bundled" / "plugins").glob("*.py"))
    in_checkout = sorted(p.name for p in (ROOT / "plugins").glob("*.py"))
    assert shipped == in_checkout
    # Run from an unrelated directory with only the installed copy importable first.
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import playground, playground.registry as r; "
            "print(playground.__file__); print(r.bundled_dir('plugins')); print(playground.list_variants())",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    module_file, plugins_dir, variants = completed.stdout.splitlines()
    assert module_file.startswith(str(target))
    assert plugins_dir == str(target / "playground" / "_bundled" / "plugins")
    assert "vanilla" in variants
