"""Shared fixtures: a registry built from nothing but the bundled plugins, and a helper
that writes plugin files into a temporary directory."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from playground.registry import Registry


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
