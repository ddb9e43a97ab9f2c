"""The `playground` command line.

    playground [--plugins-dir DIR] list | info NAME | plugins | check [NAME ... | --all]
    playground run SPEC [--device cpu|cuda] [--variants a,b] [--seq-lens ...] [--out DIR]
    playground run --resume RUN_DIR             [--threads N] on run and compare
    playground repair RUN_DIR                   set aside what a resume cannot read
    playground compare [--device ...]           the main job: experiments/quick.toml
    playground new NAME [--from VARIANT | --kind mod] [--dir DIR]   scaffold plugins/NAME.py
    playground plot RUN_DIR [--out DIR] [--format png|svg|pdf] | --benchmarks

Every command takes `--help`; `--plugins-dir` may also follow the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from playground import registry as registry_module
from playground.config import describe_options
from playground.contract import checked_kv_cache_per_token, flops_exponent
from playground.errors import HookError, PlaygroundError
from playground.registry import Registry, bundled_dir
from playground.report.pages import write_report
from playground.report.plots import FORMATS, plot_run
from playground.report.summary import print_accuracy, print_nodes, print_summary, write_summary
from playground.run.runner import Executor, Runner, check_device, executor_for, plan
from playground.run.spec import DTYPES, apply_overrides, load_spec
from playground.run.store import ENV, OVERRIDES, REJECTED, ROWS, SPEC, RunStore, unwritable

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
error_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 150)

STATUS_STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow"}


def _short(source: str) -> str:
    """A source path relative to the working directory, or to the folder holding the
    bundled plugins/ (so it reads `plugins/vanilla.py`), when it is below one of them."""
    for base in (Path.cwd(), bundled_dir("plugins").parent):
        try:
            return str(Path(source).relative_to(base))
        except ValueError:
            continue
    return source


def _print_load_errors(registry: Registry, to: Console = error_console) -> None:
    """One unwrapped line per load error: file and message stay greppable."""
    for error in registry.errors:
        to.print(f"[red]plugin error[/red] {_short(error.source)}: {error.message}", soft_wrap=True)


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
            f"[yellow]warning:[/yellow] plugin {escape(_short(info.source))} failed to load: "
            f"{escape(messages)} (its variants are left out; `playground plugins` lists them)",
            soft_wrap=True,
        )


QUIET_COMMANDS = ("plugins", "repair")
"""Commands that do not warn about failed plugins up front: `plugins` lists them itself,
`repair` resolves no variant."""


def command_list(registry: Registry, arguments: argparse.Namespace) -> int:
    table = Table(title="Attention variants")
    for column in ("name", "source", "complexity", "capabilities", "summary"):
        table.add_column(column)
    for name in registry.names():
        cls = registry.get(name)
        table.add_row(
            name,
            _short(registry.source_of(name)),
            f"O(n^{flops_exponent(cls):.1f})",
            ", ".join(cls.capabilities.features()),
            cls.summary,
        )
    console.print(table)
    console.print("complexity: growth of the variant's own flops() with n, at n = 65536.")
    return 0


def command_info(registry: Registry, arguments: argparse.Namespace) -> int:
    cls = registry.get(arguments.name)
    console.print(f"[bold]{cls.name}[/bold]: {cls.summary}")
    console.print(f"paper: {cls.paper}")
    console.print(f"source: {_short(registry.source_of(cls.name))}")
    console.print(f"capabilities: {', '.join(cls.capabilities.features())}")
    if cls.forward_kwargs:
        console.print(f"extra forward arguments: {', '.join(cls.forward_kwargs)}")
    console.print(
        f"fast path: {'yes' if cls.forward_fast is not None else 'no (runs the reference)'}"
    )
    flops = cls.flops(4096, 4096, 512, 8, **dataclasses.asdict(cls.Config()))
    console.print(f"flops at n=4096, d_model=512, 8 heads: {flops / 1e9:.1f} GFLOP per sequence")
    try:
        module = registry.build(cls.name, 512, 8)
    except Exception as error:  # a variant that cannot be built so must not hide the rest
        kept = f"not known (building it at d_model=512, 8 heads failed: {error})"
    else:
        try:
            cached = checked_kv_cache_per_token(module)
            kept = (
                "a fixed-size state" if cached is None else f"{cached} numbers per token and layer"
            )
        except HookError as error:  # a junk count is reported, never printed as a fact
            kept = f"not known ({error})"
    console.print(f"decoder cache at d_model=512, 8 heads: {escape(kept)}", soft_wrap=True)
    table = Table(title=f"options of {cls.name} (playground.build({cls.name!r}, **options))")
    for column in ("option", "type", "default", "meaning"):
        table.add_column(column)
    for option in describe_options(cls.Config):
        table.add_row(option.name, option.type, repr(option.default), option.doc)
    console.print(table)
    return 0


def command_plugins(registry: Registry, arguments: argparse.Namespace) -> int:
    table = Table(title="Plugins")
    for column in ("source", "found via", "variants", "status"):
        table.add_column(column)
    for info in registry.plugins:
        status = f"[red]{len(info.errors)} error(s), below[/red]" if info.errors else "[green]ok"
        table.add_row(_short(info.source), info.kind, ", ".join(info.variants) or "-", status)
    console.print(table)
    _print_load_errors(registry, to=console)
    return 1 if registry.errors else 0


def command_check(registry: Registry, arguments: argparse.Namespace) -> int:
    from playground.testing import CHECKS, iter_cases

    if not arguments.names and not arguments.all:
        error_console.print("name the variants to check, or pass --all (see `playground list`)")
        return 2
    names = registry.names() if arguments.all else arguments.names
    classes = [registry.get(name) for name in names]  # unknown names fail before any check
    checks = [c for c in CHECKS if not arguments.selection or arguments.selection in c.__name__]
    if not checks:
        names = ", ".join(check.__name__ for check in CHECKS)
        error_console.print(
            f"no check name contains {escape(arguments.selection)!r}; -k selects among: {names}",
            soft_wrap=True,
        )
        return 2
    table = Table(title="Contract checks")
    for column in ("variant", "impl", "check", "status", "reason"):
        table.add_column(column)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for case in iter_cases(classes, checks):
        result = case.evaluate()
        counts[result.status] += 1
        if result.status != "passed" or arguments.verbose:
            style = STATUS_STYLE[result.status]
            table.add_row(
                result.variant,
                result.impl,
                result.check,
                f"[{style}]{result.status}",
                result.reason,
            )
    console.print(table)
    console.print(
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"({len(classes)} variant{'s' if len(classes) != 1 else ''}; passed checks are listed with -v)"
    )
    # Under --all a plugin that failed to load (warned about above) is a variant that was
    # not checked.
    load_errors = registry.errors if arguments.all else []
    return 1 if counts["failed"] or load_errors else 0


def _interrupted(store: RunStore, count: int | None = None) -> int:
    done = (
        ""
        if count is None
        else f" after {count} new cells; every finished row is in {store.path(ROWS)}"
    )
    console.print(
        f"[yellow]interrupted[/yellow]{escape(done)}. Continue with: "
        f"playground run --resume {escape(str(store.directory))}",
        soft_wrap=True,
    )
    return 130


def _execute(registry: Registry, store: RunStore, spec, overrides: dict, executor: Executor) -> int:
    runner = Runner(spec, registry, store, console)
    try:
        runner.start(overrides)
        pending = len(runner.pending())
        console.print(
            f"[bold]{spec.name}[/bold]: {len(plan(spec))} cells ({pending} to run, on "
            f"{runner.threads} threads, {executor.name} executor) → {store.directory}"
        )
    except KeyboardInterrupt:
        return _interrupted(store)
    count, completed = runner.run(executor)
    try:  # a second Ctrl-C (while the figures are drawn, say) ends with the same hint
        lines = write_summary(store, runner.spec.baseline)
        print_summary(lines, console)
        print_accuracy(store.rows(), console)
        print_nodes(store.rows(), console)
        if store.rows():
            _plot_and_report(registry, store.directory, None, ("png",))
    except KeyboardInterrupt:
        return _interrupted(store, count)
    if not completed:
        return _interrupted(store, count)
    console.print(f"results: {store.directory}")
    rows = store.rows()
    errors = sum(row["status"] == "error" for row in rows)
    invalid = sum(row["status"] == "invalid" for row in rows)
    if errors:
        error_console.print(f"[red]{errors} cell(s) raised an error[/red] (see the table above)")
    if invalid:
        error_console.print(
            f"[red]{invalid} cell(s) returned something the contract forbids[/red] (status "
            f"invalid, see the table above; `playground check NAME` tells more)"
        )
    if errors or invalid:
        error_console.print("exit status 1")
        return 1
    return 0


def _overrides(arguments: argparse.Namespace) -> dict:
    seq_lens = None
    if getattr(arguments, "seq_lens", None):
        try:
            seq_lens = [int(n) for n in arguments.seq_lens.split(",")]
        except ValueError:
            raise PlaygroundError(
                f"--seq-lens takes comma-separated integers, like 256,512; got {arguments.seq_lens!r}"
            ) from None
        if any(n < 1 for n in seq_lens) or len(set(seq_lens)) != len(seq_lens):
            raise PlaygroundError(
                f"--seq-lens takes distinct positive lengths, like 256,512; got {arguments.seq_lens!r}"
            )
    variants = getattr(arguments, "variants", None)
    plugins_dirs = getattr(arguments, "plugins_dir", None) or []
    return {
        "device": arguments.device,
        "dtype": getattr(arguments, "dtype", None),
        "threads": arguments.threads,
        "accuracy_workers": getattr(arguments, "accuracy_workers", None),
        "executor": getattr(arguments, "executor", None),
        "address": getattr(arguments, "address", None),
        "seq_lens": seq_lens,
        "variants": variants.split(",") if variants else None,
        # absolute, so a resume from another working directory finds the same plugins
        "plugins_dirs": [str(Path(directory).resolve()) for directory in plugins_dirs],
    }


def command_run(registry: Registry, arguments: argparse.Namespace) -> int:
    if arguments.resume:
        given = [
            flag
            for flag, value in (
                ("SPEC", arguments.spec),
                ("--device", arguments.device),
                ("--dtype", arguments.dtype),
                ("--variants", arguments.variants),
                ("--seq-lens", arguments.seq_lens),
                ("--threads", arguments.threads),
            )
            if value
        ]
        if given:
            raise PlaygroundError(
                f"--resume runs the cells its run lacks with the spec and options it started "
                f"with; drop {', '.join(given)} (or start a new run without --resume)"
            )
        store = RunStore.existing(arguments.resume)
        store.rows()  # a damaged results.jsonl is refused before anything else
        if store.path(OVERRIDES).exists():
            overrides = store.read_json(OVERRIDES)
        else:  # a run from before overrides.json: they were in env.json
            env = store.read_json(ENV) if store.path(ENV).exists() else {}
            overrides = env.get("overrides", {})
        recorded = overrides.get("plugins_dirs") or []
        if recorded:  # the plugin directories the run started with, then any given now
            given = getattr(arguments, "plugins_dir", None) or []
            registry = registry_module.configure([*recorded, *given])
            warn_failed_plugins(registry, getattr(arguments, "warned_plugins", None))
        # where the cells run is not a measurement setting: a resume may choose anew
        lane = {
            "accuracy_workers": arguments.accuracy_workers,
            "executor": arguments.executor,
            "address": arguments.address,
        }
        spec = apply_overrides(
            load_spec(store.path(SPEC), registry), registry, {**overrides, **lane}
        )
        executor = executor_for(spec)
    else:
        if not arguments.spec:
            raise PlaygroundError(
                "give a spec file (or a shipped spec name such as quick), or --resume RUN_DIR"
            )
        overrides = _overrides(arguments)
        spec = apply_overrides(load_spec(arguments.spec, registry), registry, overrides)
        check_device(spec.device)
        executor = executor_for(spec)
        store = RunStore.create(arguments.out, spec.name)
    return _execute(registry, store, spec, overrides, executor)


def command_compare(registry: Registry, arguments: argparse.Namespace) -> int:
    overrides = _overrides(arguments)
    spec = apply_overrides(load_spec("quick", registry), registry, overrides)
    check_device(spec.device)
    executor = executor_for(spec)
    store = RunStore.create(arguments.out, spec.name)
    return _execute(registry, store, spec, overrides, executor)


def _plot_and_report(
    registry: Registry, run_dir: Path, out: Path | None, formats: Sequence[str]
) -> None:
    if out is not None and out.exists() and not out.is_dir():
        raise PlaygroundError(f"--out {out} is a file; give a directory for the figures")
    try:
        figures = plot_run(run_dir, out, formats, registry=registry)
    except OSError as error:
        where = Path(error.filename) if error.filename else out or run_dir
        raise unwritable(where, error, "give --out a directory you can write to") from None
    try:
        html, markdown = write_report(run_dir, figures)
    except OSError as error:
        where = Path(error.filename) if error.filename else run_dir
        raise unwritable(where, error, "check that the run directory is writable") from None
    console.print(f"{len(figures)} figures in {figures[0].parent if figures else run_dir}")
    console.print(f"report: {html} (and {markdown.name})")


def command_plot(registry: Registry, arguments: argparse.Namespace) -> int:
    if arguments.benchmarks:
        from playground.report.bench_history import plot_history

        out = Path(arguments.out or "bench_history.png")
        console.print(f"wrote {plot_history(Path(arguments.run_dir or '.benchmarks'), out)}")
        return 0
    if not arguments.run_dir:
        raise PlaygroundError(
            "give a run directory (results/<experiment>/<timestamp>/), or --benchmarks"
        )
    _plot_and_report(
        registry,
        Path(arguments.run_dir),
        Path(arguments.out) if arguments.out else None,
        [arguments.format],
    )
    return 0


def command_repair(registry: Registry, arguments: argparse.Namespace) -> int:
    store = RunStore.existing(arguments.run_dir)
    done = store.repair()
    if not done:
        console.print(f"nothing to repair in {escape(str(store.directory))}", soft_wrap=True)
        return 0
    for source, destination in done.moved:
        console.print(f"moved {escape(str(source))} to {escape(destination.name)}", soft_wrap=True)
    for line in done.lines:
        console.print(f"line {line.number} {escape(line.reason)}", soft_wrap=True)
    if done.lines:
        console.print(
            f"moved {len(done.lines)} line(s) to {escape(str(store.path(REJECTED)))} (kept "
            f"as they were)",
            soft_wrap=True,
        )
    console.print(
        f"resume with: playground run --resume {escape(str(store.directory))} (it measures "
        f"the cells of those lines again)",
        soft_wrap=True,
    )
    return 0


def command_new(registry: Registry, arguments: argparse.Namespace) -> int:
    from playground.cli.scaffold import create_variant

    if arguments.copy_from and arguments.kind != "reference":
        raise PlaygroundError("--from copies a variant's file; it does not combine with --kind")
    scaffold = create_variant(
        arguments.name, registry, arguments.dir, arguments.copy_from, arguments.kind
    )
    console.print(
        f"wrote {_short(str(scaffold.path))}: class {scaffold.class_name}, registered as "
        f"{scaffold.name!r}. Next:",
        markup=False,
    )
    steps = scaffold.next_steps()
    # Each line stays a runnable shell command: the purpose follows as a comment, after
    # at least two spaces however long the command (a long --dir path) is.
    width = max(len(command) for command, _ in steps)
    for command, purpose in steps:
        console.print(f"  {command:<{width}}  # {purpose}", markup=False, soft_wrap=True)
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a positive integer, like 2; got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--plugins-dir",
        action="append",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="also load every *.py in DIR as a plugin (repeatable; see also "
        "PLAYGROUND_PLUGINS_PATH)",
    )
    parser = argparse.ArgumentParser(
        prog="playground",
        description="Attention variants as plugins: list them, inspect them, check them "
        "against the contract suite.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = commands.add_parser(
        "list", parents=[common], help="table of variants: source, complexity, capabilities"
    )
    listing.set_defaults(handler=command_list)
    info = commands.add_parser(
        "info", parents=[common], help="one variant: paper, options, capabilities"
    )
    info.add_argument("name", help="variant name (see `playground list`)")
    info.set_defaults(handler=command_info)
    plugins = commands.add_parser(
        "plugins", parents=[common], help="every plugin source and its load errors"
    )
    plugins.set_defaults(handler=command_plugins)
    check = commands.add_parser(
        "check", parents=[common], help="run the contract suite; exit 1 on any failure"
    )
    check.add_argument("names", nargs="*", metavar="NAME", help="variants to check")
    check.add_argument("--all", action="store_true", help="check every registered variant")
    check.add_argument(
        "-k", dest="selection", metavar="TEXT", help="only checks whose name contains TEXT"
    )
    check.add_argument("-v", "--verbose", action="store_true", help="list passed checks too")
    check.set_defaults(handler=command_check)

    run = commands.add_parser(
        "run", parents=[common], help="measure the variants of an experiment spec"
    )
    run.add_argument("spec", nargs="?", help="a spec file, or a shipped spec: quick, scaling, ...")
    compare = commands.add_parser(
        "compare", parents=[common], help="the main job: the quick spec over every variant"
    )
    for sub in (run, compare):
        sub.add_argument("--device", choices=("cpu", "cuda"), help="override the spec's device")
        sub.add_argument("--variants", metavar="A,B", help="only these variants")
        sub.add_argument(
            "--dtype", choices=tuple(DTYPES), help="override the spec's dtype (float32, ...)"
        )
        sub.add_argument("--seq-lens", metavar="N,M", help="override the spec's sequence lengths")
        sub.add_argument(
            "--threads",
            type=_positive_int,
            metavar="N",
            help="torch threads to measure with (default: the spec's, else torch's own)",
        )
        sub.add_argument(
            "--accuracy-workers",
            type=_positive_int,
            metavar="N",
            help="one-thread processes that train accuracy seeds side by side (default: "
            "the spec's, else one per core on a CPU; 1 trains them in this process)",
        )
        sub.add_argument(
            "--executor",
            choices=("local", "ray"),
            help="where the cells run (default: the spec's, else local); ray needs "
            "pip install 'attention-playground[ray]'",
        )
        sub.add_argument(
            "--address",
            metavar="ADDR",
            help="the Ray cluster to join (default: RAY_ADDRESS, else a fresh local one)",
        )
        sub.add_argument(
            "--out", default="results", metavar="DIR", help="results root (default: results)"
        )
    run.add_argument("--resume", metavar="RUN_DIR", help="run only the cells RUN_DIR lacks")
    run.set_defaults(handler=command_run)
    compare.set_defaults(handler=command_compare)

    repair = commands.add_parser(
        "repair",
        parents=[common],
        help=f"move what a run directory cannot read aside (bad lines to {REJECTED})",
    )
    repair.add_argument("run_dir", metavar="RUN_DIR", help="results/<experiment>/<timestamp>")
    repair.set_defaults(handler=command_repair)

    new = commands.add_parser(
        "new", parents=[common], help="scaffold plugins/NAME.py: a variant that passes the suite"
    )
    new.add_argument("name", metavar="NAME", help="lower-case identifier; the file is NAME.py")
    new.add_argument(
        "--from",
        dest="copy_from",
        metavar="VARIANT",
        help="copy this registered variant's file, renamed (default: the readable template)",
    )
    new.add_argument(
        "--kind",
        choices=("reference", "mod"),
        default="reference",
        help="reference: exact attention spelled out (default); mod: a SoftmaxAttention with "
        "a score_mod and a mask_mod",
    )
    new.add_argument("--dir", metavar="DIR", help="write DIR/NAME.py instead of plugins/")
    new.set_defaults(handler=command_new)

    plot = commands.add_parser(
        "plot", parents=[common], help="figures and report.html of a run (or benchmark history)"
    )
    plot.add_argument(
        "run_dir", nargs="?", metavar="RUN_DIR", help="results/<experiment>/<timestamp>"
    )
    plot.add_argument("--out", metavar="DIR", help="where figures go (default: RUN_DIR/figures)")
    plot.add_argument("--format", choices=FORMATS, default="png", help="figure format")
    plot.add_argument(
        "--benchmarks",
        action="store_true",
        help="plot the history of saved pytest-benchmark runs (RUN_DIR defaults to .benchmarks)",
    )
    plot.set_defaults(handler=command_plot)
    return parser


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


if __name__ == "__main__":
    sys.exit(main())
