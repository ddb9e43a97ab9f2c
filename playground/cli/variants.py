"""The commands about variants: list, info, plugins, check and new (scaffold a plugin)."""

from __future__ import annotations

import argparse
import dataclasses

from rich.markup import escape
from rich.table import Table

from playground.cli.output import (
    VERDICT_STYLE,
    console,
    error_console,
    print_load_errors,
    short_path,
)
from playground.cli.scaffold import create_variant
from playground.config import describe_options
from playground.contract import AttentionVariant, flops_exponent
from playground.errors import PlaygroundError, UnsupportedFeature
from playground.hf.support import bridges
from playground.registry import Registry
from playground.run.decode_cost import prefilled
from playground.softmax_attention import SoftmaxAttention
from playground.testing import CHECKS, iter_cases


def command_list(registry: Registry, arguments: argparse.Namespace) -> int:
    table = Table(title="Attention variants")
    for column in ("name", "source", "complexity", "capabilities", "summary"):
        table.add_column(column)
    for name in registry.names():
        cls = registry.get(name)
        table.add_row(
            name,
            short_path(registry.source_of(name)),
            f"O(n^{flops_exponent(cls):.1f})",
            ", ".join(cls.capabilities_for(cls.Config()).features()),
            cls.summary,
        )
    console.print(table)
    console.print("complexity: growth of the variant's own flops() with n, at n = 65536.")
    return 0


def command_info(registry: Registry, arguments: argparse.Namespace) -> int:
    cls = registry.get(arguments.name)
    console.print(f"[bold]{cls.name}[/bold]: {cls.summary}")
    console.print(f"paper: {cls.paper}")
    console.print(f"source: {short_path(registry.source_of(cls.name))}")
    features = cls.capabilities_for(cls.Config()).features()
    console.print(f"capabilities at the default options: {', '.join(features)}")
    if cls.forward_kwargs:
        console.print(f"extra forward arguments: {', '.join(cls.forward_kwargs)}")
    console.print(
        f"fast path: {'yes' if cls.forward_fast is not None else 'no (runs the reference)'}"
    )
    flops = cls.flops(4096, 4096, 512, 8, **dataclasses.asdict(cls.Config()))
    console.print(f"flops at n=4096, d_model=512, 8 heads: {flops / 1e9:.1f} GFLOP per sequence")
    console.print(f"decoding state at d_model=512, 8 heads: {escape(state_size(registry, cls))}")
    if issubclass(cls, SoftmaxAttention):
        module = cls(d_model=512, num_heads=8)  # typed as the SoftmaxAttention it is
        console.print(f"score_mod path: {escape(str(module.score_mod_structure()))}")
        console.print(f"CPU kernel, float32: {escape(str(module.cpu_kernel()))}")
    for line in bridges(cls):
        console.print(f"transformers bridge, {escape(line)}")
    table = Table(title=f"options of {cls.name} (playground.build({cls.name!r}, **options))")
    for column in ("option", "type", "default", "meaning"):
        table.add_column(column)
    for option in describe_options(cls.Config):
        table.add_row(option.name, option.type, repr(option.default), option.doc)
    console.print(table)
    return 0


STATE_LENGTHS = (1024, 4096)
"""Context lengths at which `playground info` prefills a state and reads its bytes."""


def state_size(registry: Registry, cls: type[AttentionVariant]) -> str:
    """What a decoding state of `cls` holds per sequence (float32) at STATE_LENGTHS, read
    from states prefilled there (`DecodingState.nbytes`), and the growth per token."""
    try:
        module = registry.build(cls.name, 512, 8).eval()
        sizes = [prefilled(module, n).nbytes for n in STATE_LENGTHS]
    except UnsupportedFeature as refused:
        return f"none: {refused}"
    except Exception as error:  # a variant that fails here must not hide the rest of info
        return f"not known (prefilling a state failed: {type(error).__name__}: {error})"
    (short, long), (n_short, n_long) = sizes, STATE_LENGTHS
    growth = (long - short) / (n_long - n_short)
    per_token = "fixed size" if growth == 0 else f"{growth:,.0f} bytes per token and layer"
    return f"{short / 2**20:.2f} MiB at {n_short} tokens, {long / 2**20:.2f} MiB at {n_long} ({per_token})"


def command_plugins(registry: Registry, arguments: argparse.Namespace) -> int:
    table = Table(title="Plugins")
    for column in ("source", "found via", "variants", "status"):
        table.add_column(column)
    for info in registry.plugins:
        status = f"[red]{len(info.errors)} error(s), below[/red]" if info.errors else "[green]ok"
        table.add_row(short_path(info.source), info.kind, ", ".join(info.variants) or "-", status)
    console.print(table)
    print_load_errors(registry, to=console)
    return 1 if registry.errors else 0


def command_check(registry: Registry, arguments: argparse.Namespace) -> int:
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
    for column in ("variant", "impl", "check", "verdict", "reason"):
        table.add_column(column)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for case in iter_cases(classes, checks):
        result = case.evaluate()
        counts[result.verdict] += 1
        if result.verdict != "passed" or arguments.verbose:
            style = VERDICT_STYLE[result.verdict]
            table.add_row(
                result.variant,
                result.impl,
                result.check,
                f"[{style}]{result.verdict}",
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


def command_new(registry: Registry, arguments: argparse.Namespace) -> int:
    if arguments.copy_from and arguments.kind != "reference":
        raise PlaygroundError("--from copies a variant's file; it does not combine with --kind")
    scaffold = create_variant(
        arguments.name, registry, arguments.dir, arguments.copy_from, arguments.kind
    )
    console.print(
        f"wrote {short_path(str(scaffold.path))}: class {scaffold.class_name}, registered as "
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
