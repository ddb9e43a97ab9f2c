"""Console output shared by the commands: the stdout and stderr consoles, how a plugin's
source path is shown, and the warnings about plugins that failed to load."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from playground.registry import Registry, bundled_dir

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
error_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 150)


VERDICT_STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow"}


def short_path(source: str) -> str:
    """A source path relative to the working directory, or to the folder holding the
    bundled plugins/ (so it reads `plugins/vanilla.py`), when it is below one of them."""
    for base in (Path.cwd(), bundled_dir("plugins").parent):
        try:
            return str(Path(source).relative_to(base))
        except ValueError:
            continue
    return source


def print_load_errors(registry: Registry, to: Console = error_console) -> None:
    """One unwrapped line per load error: file and message stay greppable."""
    for error in registry.errors:
        to.print(
            f"[red]plugin error[/red] {short_path(error.source)}: {error.message}", soft_wrap=True
        )


def warn_failed_plugins(registry: Registry, warned: set[str] | None = None) -> None:
    """One stderr line per plugin that failed to load, naming its file and error: a
    command that resolves variants must never leave one out without a word (the
    `playground plugins` command is the detailed view). Sources in `warned` were already
    named (a resume reloads the registry) and are added to it."""
    warned = set() if warned is None else warned
    for info in registry.failed_plugins():
        if info.source in warned:
            continue
        warned.add(info.source)
        messages = "; ".join(error.message for error in info.errors)
        error_console.print(
            f"[yellow]warning:[/yellow] plugin {escape(short_path(info.source))} failed to load: "
            f"{escape(messages)} (its variants are left out; `playground plugins` lists them)",
            soft_wrap=True,
        )


QUIET_COMMANDS = ("plugins", "repair")
"""Commands that do not warn about failed plugins up front: `plugins` lists them itself,
`repair` resolves no variant."""
