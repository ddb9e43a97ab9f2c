"""Shared fixtures: a registry built from nothing but the bundled plugins, and a helper
that writes plugin files into a temporary directory."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from playground.registry import Registry

# Under pytest-xdist each worker gets its share of the cores, so that workers do not
# oversubscribe them (torch would give every worker every core).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


@pytest.fixture
def write_plugin(tmp_path: Path) -> Callable[[str, str], Path]:
    """write_plugin("name.py", source) -> path, in a fresh plugin directory."""
    directory = tmp_path / "plugins"
    directory.mkdir()

    def write(filename: str, source: str) -> Path:
        path = directory / filename
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture
def bundled_registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.delenv("PLAYGROUND_PLUGINS_PATH", raising=False)
    return Registry.discover(entry_points=False)
