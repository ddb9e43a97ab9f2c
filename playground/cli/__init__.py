"""The `playground` command line: main() parses the arguments, loads the plugins and runs
the command, turning the errors a user can fix into one line and an exit status.

    playground [--plugins-dir DIR] list | info NAME | plugins | check [NAME ... | --all]
    playground run SPEC [--device cpu|cuda] [--variants a,b [--no-baseline]] [--seq-lens ...]
                        [--steps N] [--seeds N] [--d-model N] [--num-layers N] [--out DIR]
    playground run --resume RUN_DIR             [--threads N] on run and compare
    playground eval RUN_DIR --eval-lengths N,M  score kept language models at new lengths
    playground sample RUN_DIR --prompt TEXT     continue a prompt with kept language models
    playground repair RUN_DIR                   set aside what a resume cannot read
    playground compare [--device ...]           the main job: experiments/quick.toml
    playground new NAME [--from VARIANT | --kind mod] [--dir DIR]   scaffold plugins/NAME.py
    playground plot RUN_DIR [--out DIR] [--format png|svg|pdf] | --benchmarks

Every command takes `--help`; `--plugins-dir` may also follow the command. The parser is
in parser.py, the commands in variants.py, runs.py and samples.py, the shared console in
output.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape

from playground import registry as registry_module
from playground.cli.output import QUIET_COMMANDS, error_console, warn_failed_plugins
from playground.cli.parser import build_parser
from playground.errors import PlaygroundError

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        registry = registry_module.configure(getattr(arguments, "plugins_dir", None) or ())
        arguments.warned_plugins = set()
        if arguments.command not in QUIET_COMMANDS:
            warn_failed_plugins(registry, arguments.warned_plugins)
        return arguments.handler(registry, arguments)
    except PlaygroundError as error:
        error_console.print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        error_console.print("[yellow]interrupted[/yellow]")
        return 130
    except OSError as error:  # a place the command had to read or write
        where = f" {error.filename}" if error.filename else ""
        error_console.print(
            f"[red]error:[/red] cannot use{escape(where)}: {escape(error.strerror or str(error))}; "
            f"check that the path exists and that you may write there",
            soft_wrap=True,
        )
        return 2
