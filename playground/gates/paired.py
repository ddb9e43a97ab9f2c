"""Paired rounds: a benchmark timed on two codes at once, in rounds that take turns, so
that both meet the same load.

On a machine shared with other jobs a benchmark's time follows the load on the cores,
which changes within seconds. Two measurements taken one after the other, even a minute
apart, can meet different loads and disagree by more than any threshold worth having. So
the time gate does not compare runs: it holds the benchmark built in two worker
processes, one on the baseline's code (its commit, exported from git) and one on the
working tree, and times one round on each in turn, A B, B A, A B, ... (the order swapped
every pair, so that each side runs as often right after the other as right after
itself). Each block of two pairs compares rounds a fraction of a second apart; the
median over the blocks is the slow-down.

    python -m playground.gates.paired --threads 2 [--device cpu]
                                        a worker (what PairedMeasurer starts, with its
                                        working directory in the code to time)

A worker reads one JSON request per line on stdin and answers one JSON line on stdout:
`{"op": "build", "label": "longformer", "seq_len": 1024, "pass_name": "forward"}` builds
and warms up the benchmark (calls.py) and answers its call's duration; `{"op": "round",
"iterations": k}` times k calls and answers the time per call.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from playground.errors import PlaygroundError, UnsupportedFeature
from playground.gates.calls import build_call, labelled_points
from playground.gates.slowdown import SLOWDOWN_ENV
from playground.registry import default_registry
from playground.run.spec_loading import load_spec

WORKER_MODULE = "playground.gates.paired"
"""What a worker runs, from the code it times: each side its own copy of this module."""
WORKER_FILE = Path(*WORKER_MODULE.split(".")).with_suffix(".py")
"""That module's file in a checkout, which a baseline's exported commit must have."""

ROUND_MIN_S = 0.02
"""A round repeats a short call until it lasts this long: a millisecond call timed alone
is at the mercy of one scheduler tick."""
PAIR_BUDGET_S = 1.0
"""Each side's rounds of a benchmark last about this long in all..."""
MIN_BLOCKS = 5
MAX_BLOCKS = 15
"""...within these bounds, in blocks of two pairs (an odd count, for a median that is one
block's ratio)."""


@dataclass(frozen=True)
class PairedRounds:
    """One benchmark timed in alternating rounds on the baseline's code and the
    candidate's: each round's time per call, in the order the rounds ran on each side."""

    benchmark: str
    baseline_s: tuple[float, ...]
    candidate_s: tuple[float, ...]
    injected: float | None = None
    """The slow-down injected into the candidate's call ($PLAYGROUND_BENCH_INJECT_SLOWDOWN)."""

    @property
    def blocks(self) -> list[float]:
        """Per block of two pairs (A B, B A), the candidate's total time over the
        baseline's. A round right after the other code's meets the caches that code left,
        one right after its own the caches it left; in a block each side has one of each,
        so the order's effect cancels (per pair it did not: the ratios fell in two groups
        10-20 % apart, and their median jumped between them)."""
        pairs = zip(
            self.baseline_s[0::2],
            self.baseline_s[1::2],
            self.candidate_s[0::2],
            self.candidate_s[1::2],
            strict=True,
        )
        return [(c0 + c1) / (b0 + b1) for b0, b1, c0, c1 in pairs]

    @property
    def slowdown(self) -> float:
        """The median block's ratio (1.5 = the candidate's code 50 % slower)."""
        return statistics.median(self.blocks)

    def describe(self) -> str:
        injected = f", {self.injected:.2f}x injected" if self.injected else ""
        return f"{self.slowdown - 1:+.0%} ({len(self.blocks)} blocks{injected})"


class Worker:
    """A worker process timing benchmarks on the code in `code`."""

    def __init__(self, code: Path, threads: int, device: str, env: dict[str, str]) -> None:
        # Without its own copy of this module, `python -m` in `code` would find the
        # installed checkout's instead, and time that checkout's gates on `code`'s package.
        if not (code / WORKER_FILE).is_file():
            raise PlaygroundError(
                f"{code} has no {WORKER_FILE.as_posix()}: its code predates the paired "
                f"rounds this gate times with, and cannot be timed"
            )
        self.code = code
        # stderr to a file: a pipe nobody reads could fill and block the worker
        self.errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                WORKER_MODULE,
                "--threads",
                str(threads),
                "--device",
                device,
            ],
            cwd=code,
            env={**env, "PYTHONPATH": str(code)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError:
            line = ""
        if not line:
            self.process.wait()
            self.errors.seek(0)
            raise PlaygroundError(
                f"the benchmark worker on {self.code} ended (exit {self.process.returncode}) "
                f"while asked {request}:\n{self.errors.read()[-3000:]}"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise PlaygroundError(f"the benchmark worker on {self.code}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.errors.close()


class PairedMeasurer:
    """Two workers, on the baseline's code and the candidate's, timing in turns. The
    injected slow-down ($PLAYGROUND_BENCH_INJECT_SLOWDOWN) stands for a change in the
    candidate's code, so only its worker sees it."""

    def __init__(self, baseline_code: Path, candidate_code: Path, threads: int, device: str):
        self.arguments = (baseline_code, candidate_code, threads, device)
        self.measured: dict[str, int] = {}
        self._start()

    def _start(self) -> None:
        baseline_code, candidate_code, threads, device = self.arguments
        candidate_env = dict(os.environ)
        baseline_env = {k: v for k, v in candidate_env.items() if k != SLOWDOWN_ENV}
        self.baseline = Worker(baseline_code, threads, device, baseline_env)
        self.candidate = Worker(candidate_code, threads, device, candidate_env)

    def __enter__(self) -> PairedMeasurer:
        return self

    def __exit__(self, *_: object) -> None:
        self.baseline.close()
        self.candidate.close()

    def measure(self, entry: dict[str, Any]) -> PairedRounds | str:
        """The saved benchmark `entry` timed in paired rounds, or why it cannot be.

        Measured again, a benchmark is timed by two new worker processes: on a loaded
        machine the scheduler can favour one process's threads over the other's for many
        seconds, which the alternation does not cancel but new processes redraw."""
        if self.measured.get(entry["name"]):
            self.baseline.close()
            self.candidate.close()
            self._start()
        self.measured[entry["name"]] = self.measured.get(entry["name"], 0) + 1
        request = dict(
            op="build",
            label=entry.get("params", {}).get("variant", entry["extra_info"]["variant"]),
            seq_len=int(entry["extra_info"]["seq_len"]),
            pass_name=entry["extra_info"]["pass_name"],
        )
        built = {}
        for side, worker in (("baseline", self.baseline), ("candidate", self.candidate)):
            answer = worker.ask(**request)
            if "skip" in answer:
                return f"not run on the {side}'s code: {answer['skip']}"
            if Path(answer["playground"]).resolve().parent != worker.code.resolve():
                raise PlaygroundError(
                    f"the {side}'s worker imported playground from {answer['playground']}, "
                    f"not from {worker.code}; run the gate from the project's checkout"
                )
            built[side] = answer
        call_s = max(answer["call_s"] for answer in built.values())
        iterations = max(1, math.ceil(ROUND_MIN_S / call_s))
        blocks = math.ceil(PAIR_BUDGET_S / (2 * iterations * call_s))
        blocks = min(MAX_BLOCKS, max(MIN_BLOCKS, blocks + (blocks + 1) % 2))
        for worker in (self.baseline, self.candidate):  # one untimed round each
            worker.ask(op="round", iterations=iterations)
        rounds: dict[str, list[dict[str, float]]] = {"baseline": [], "candidate": []}
        # Each block is A B, B A or B A, A B, drawn at random (seeded by the benchmark), so
        # that a load that comes and goes with a period cannot fall on one side's rounds.
        draw = random.Random(f"{entry['name']}:{self.measured[entry['name']]}")
        for _ in range(blocks):
            first = draw.choice((("baseline", "candidate"), ("candidate", "baseline")))
            for side in (*first, *reversed(first)):
                worker = self.baseline if side == "baseline" else self.candidate
                rounds[side].append(worker.ask(op="round", iterations=iterations))
        return PairedRounds(
            benchmark=entry["name"],
            baseline_s=tuple(r["call_s"] for r in rounds["baseline"]),
            candidate_s=tuple(r["call_s"] for r in rounds["candidate"]),
            injected=built["candidate"].get("injected_slowdown"),
        )


def serve(requests: IO[str], answers: IO[str], device: str) -> None:
    """The worker's loop: one answer per request, until stdin closes."""
    spec = load_spec("quick", default_registry())
    points = labelled_points(spec)
    call = None
    for line in requests:
        request = json.loads(line)
        answer: dict[str, Any]
        try:
            if request["op"] == "build":
                label = request["label"]
                if label not in points:
                    answer = {"skip": f"no variant {label!r} in this code's quick spec"}
                else:
                    call = build_call(
                        spec, points[label], label, device, request["seq_len"], request["pass_name"]
                    )
                    start = time.perf_counter()
                    call.timed()
                    answer = {
                        "call_s": time.perf_counter() - start,
                        # the folder of the playground package this worker imported
                        "playground": str(Path(inspect.getfile(UnsupportedFeature)).parent),
                        "injected_slowdown": call.extra_info.get("injected_slowdown"),
                    }
            elif request["op"] == "round" and call is not None:
                iterations = int(request["iterations"])
                start = time.perf_counter()
                for _ in range(iterations):
                    call.timed()
                answer = {"call_s": (time.perf_counter() - start) / iterations}
            else:
                answer = {"error": f"unexpected request {request} (build a benchmark first)"}
        except UnsupportedFeature as error:
            answer = {"skip": str(error)}
        except Exception as error:  # the driver reports it; the worker keeps serving
            answer = {"error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    arguments = parser.parse_args(argv)
    torch.set_num_threads(arguments.threads)
    answers = sys.stdout
    sys.stdout = sys.stderr  # a plugin's prints must not garble the answers
    serve(sys.stdin, answers, arguments.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
