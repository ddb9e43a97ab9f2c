"""Check that saved benchmark runs hold measured benchmarks: what `nox -s bench` runs on
the run it just saved, so that a baseline that measured nothing fails when it is saved,
not later when bench_compare finds nothing to compare.

    python -m playground.gates.measured [--role baseline] RUN.json [RUN.json ...]

Exit status: 0 every run holds at least one measured benchmark (each counted); 2 one does
not, or is not a saved run (the message says which and what to run).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from playground.errors import PlaygroundError
from playground.report.bench_history import read_saved_run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json")
    parser.add_argument("--role", default="saved run", help="what the run is, for messages")
    arguments = parser.parse_args(argv)
    try:
        for path in arguments.runs:
            run = read_saved_run(path)
            run.require_measured(
                arguments.role, "run `nox -s bench` again (it runs without pytest-xdist)"
            )
            print(
                f"{arguments.role} {path}: {len(run.measured_benchmarks())} measured "
                f"benchmarks (commit {run.commit})"
            )
    except PlaygroundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
