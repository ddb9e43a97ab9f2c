"""The argument parser of the `playground` command: every command, its options and help
text, and the function that handles it."""

from __future__ import annotations

import argparse

from playground.cli.runs import (
    command_compare,
    command_eval,
    command_plot,
    command_repair,
    command_run,
    command_verdict,
)
from playground.cli.samples import command_sample
from playground.cli.variants import (
    command_check,
    command_info,
    command_list,
    command_new,
    command_plugins,
)
from playground.report.plots import FORMATS
from playground.run.spec import DTYPES, SIZE_FLAGS
from playground.run.store import REJECTED

SIZE_HELP = {
    "steps": "training steps of every task (and curriculum stage), over the spec's",
    "seeds": "seeds of every task, over the spec's",
    "d_model": "model width: the cost cells' and every task's, over the spec's",
    "num_layers": "layers of every task's model, over the spec's",
}
"""Help for the size flags (SIZE_FLAGS): merged into the spec and validated as its keys are."""


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
        sub.add_argument(
            "--save-weights",
            action="store_true",
            help="keep every trained model's weights in the run (for `playground eval` and "
            "`playground sample`)",
        )
        sub.add_argument(
            "--no-baseline",
            action="store_true",
            help="with --variants, leave the spec's baseline out (by default it runs beside "
            "them, for the speed-ups)",
        )
        for key, flag in SIZE_FLAGS.items():
            sub.add_argument(
                flag,
                dest=key,
                type=int,
                metavar="N",
                help=SIZE_HELP[key],
            )
    run.add_argument("--resume", metavar="RUN_DIR", help="run only the cells RUN_DIR lacks")
    run.set_defaults(handler=command_run)
    compare.set_defaults(handler=command_compare)

    evaluate = commands.add_parser(
        "eval",
        parents=[common],
        help="score a run's kept language models at new lengths, appending rows",
    )
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="results/<experiment>/<timestamp>")
    evaluate.add_argument(
        "--eval-lengths",
        required=True,
        metavar="N,M",
        help="evaluation lengths, like 4096,8192 (a length a cell has already is skipped)",
    )
    evaluate.set_defaults(handler=command_eval)

    repair = commands.add_parser(
        "repair",
        parents=[common],
        help=f"move what a run directory cannot read aside (bad lines to {REJECTED})",
    )
    repair.add_argument("run_dir", metavar="RUN_DIR", help="results/<experiment>/<timestamp>")
    repair.set_defaults(handler=command_repair)

    sample = commands.add_parser(
        "sample",
        parents=[common],
        help="continue a prompt with a run's kept language models (save_weights = true)",
    )
    sample.add_argument("run_dir", metavar="RUN_DIR", help="results/<experiment>/<timestamp>")
    sample.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    sample.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=64,
        metavar="N",
        help="bytes to generate (default: 64)",
    )
    sample.add_argument(
        "--variant", metavar="NAME", help="only this variant's models (its name or setup label)"
    )
    sample.add_argument("--cell", metavar="CELL", help="only this cell's model (its row's cell)")
    sample.add_argument(
        "--seed",
        type=int,
        metavar="K",
        help="the training seed whose weights generate (default: each cell's first)",
    )
    sample.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="0 (the default) takes the most likely byte; above 0 draws from the softmax at T",
    )
    sample.add_argument(
        "--top-k", type=_positive_int, metavar="K", help="draw among the K likeliest"
    )
    sample.add_argument(
        "--draw-seed",
        type=int,
        default=0,
        metavar="S",
        help="seed of the draws at a temperature above 0 (default: 0)",
    )
    sample.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where to run the model"
    )
    sample.set_defaults(handler=command_sample)

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

    verdict = commands.add_parser(
        "verdict",
        parents=[common],
        help="each setup against the baseline on every quality metric: difference, 95%% "
        "interval, better/worse/indistinguishable, cost (also written to verdict.csv)",
    )
    verdict.add_argument("run_dir", metavar="RUN_DIR", help="results/<experiment>/<timestamp>")
    verdict.add_argument(
        "--baseline", metavar="NAME", help="the setup to compare with (default: the spec's)"
    )
    verdict.add_argument(
        "--at",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="hold every sweep at one grid point (e.g. learning_rate=0.003): the verdict "
        "had the run trained there alone; repeatable; printed, not written",
    )
    verdict.set_defaults(handler=command_verdict)
    return parser
