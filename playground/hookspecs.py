"""Hook specifications: what a plugin module may implement.

A plugin is any module with functions decorated by `playground.hookimpl`; each hook is
called once per plugin with a `register` callable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("playground")
hookimpl = pluggy.HookimplMarker("playground")


@hookspec
def register_attention(register: Callable[[type], None]) -> None:
    """Call `register(VariantClass)` for each attention variant the plugin provides.

    The class must subclass `playground.AttentionVariant`."""


@hookspec
def register_tasks(register: Callable[[Any], None]) -> None:
    """Call `register(TaskClass)` for each synthetic task the plugin provides."""
