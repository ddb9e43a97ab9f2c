"""`playground sample RUN --prompt TEXT`: what a run's kept language models write after a
prompt (playground.run.sample), one model after another."""

from __future__ import annotations

import argparse

from rich.markup import escape

from playground.cli.output import console
from playground.registry import Registry
from playground.run.measurer import check_device
from playground.run.sample import samples


def readable(data: bytes) -> str:
    """Bytes as text: UTF-8 with replacement characters, control characters but newlines
    and tabs shown as \\xNN (a byte-level model may write any byte)."""
    text = data.decode("utf-8", errors="replace")
    return "".join(
        char if char.isprintable() or char in "\n\t" else f"\\x{ord(char):02x}" for char in text
    )


def command_sample(registry: Registry, arguments: argparse.Namespace) -> int:
    check_device(arguments.device)
    made = samples(
        arguments.run_dir,
        registry,
        arguments.prompt,
        max_new_tokens=arguments.max_new_tokens,
        variant=arguments.variant,
        cell=arguments.cell,
        seed=arguments.seed,
        temperature=arguments.temperature,
        top_k=arguments.top_k,
        draw_seed=arguments.draw_seed,
        device=arguments.device,
        plugins_dirs=getattr(arguments, "plugins_dir", None) or [],
    )
    for sample in made:
        left_out = (
            f", the prompt's first {sample.left_out} bytes left out (past its training length)"
            if sample.left_out
            else ""
        )
        console.print(
            f"[bold]{escape(sample.setup)}[/bold] (seed {sample.seed}{left_out})", soft_wrap=True
        )
        console.print(
            f"[dim]{escape(readable(sample.prompt))}[/dim]{escape(readable(sample.continuation))}",
            soft_wrap=True,
            highlight=False,
        )
        console.print()
    return 0
