"""The results store: one directory per run, rows appended as they finish.

    results/<experiment>/<timestamp>/
        results.jsonl   one JSON object per measured cell, flushed and fsynced on write
        env.json        torch version, device, threads, git commit, GEMM throughput, ...
        spec.toml       the spec as it was when the run started (resume re-reads it)
        summary.csv     derived from results.jsonl (playground.summary): costs
        accuracy.csv    derived too: accuracy per variant and task (when measured)

Two runs never share a directory: it is created with `exist_ok=False`, and a clash
(two runs in the same second) takes the next free suffix.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

import playground
from playground.errors import PlaygroundError

ROWS = "results.jsonl"
ENV = "env.json"
SPEC = "spec.toml"
SUMMARY = "summary.csv"
ACCURACY = "accuracy.csv"


class RunStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    @classmethod
    def create(cls, out: str | os.PathLike[str], experiment: str) -> RunStore:
        """A new, empty run directory under out/<experiment>/."""
        parent = Path(out) / experiment
        parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        for attempt in range(1000):
            directory = parent / (stamp if attempt == 0 else f"{stamp}-{attempt}")
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            return cls(directory)
        raise RuntimeError(f"could not create a fresh run directory under {parent}")

    @classmethod
    def existing(cls, directory: str | os.PathLike[str]) -> RunStore:
        """An earlier run's directory, to resume or to read."""
        store = cls(directory)
        if not (store.directory / SPEC).is_file():
            raise PlaygroundError(
                f"{directory} is not a run directory (no {SPEC}); runs live in "
                f"results/<experiment>/<timestamp>/"
            )
        return store

    def path(self, name: str) -> Path:
        return self.directory / name

    def append(self, row: dict[str, Any]) -> None:
        """Write one finished cell, durably, before the next one starts. A last line cut
        short by a crash is dropped first, so the new row starts a line of its own."""
        self._drop_cut_line()
        with open(self.path(ROWS), "a", encoding="utf-8") as file:
            file.write(json.dumps(row, sort_keys=True) + "\n")
            file.flush()
            os.fsync(file.fileno())

    def _drop_cut_line(self) -> None:
        path = self.path(ROWS)
        if not path.is_file() or path.stat().st_size == 0:
            return
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            with open(path, "r+b") as file:
                file.truncate(data.rfind(b"\n") + 1)

    def rows(self) -> list[dict[str, Any]]:
        """Every recorded row. A last line cut short by a crash is ignored (that cell
        counts as missing and a resume runs it again)."""
        if not self.path(ROWS).is_file():
            return []
        lines = self.path(ROWS).read_text(encoding="utf-8").splitlines()
        rows = []
        for number, line in enumerate(lines, start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if number != len(lines):
                    raise ValueError(f"{self.path(ROWS)} line {number} is not JSON") from None
        return rows

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        self.path(name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def read_json(self, name: str) -> dict[str, Any]:
        return json.loads(self.path(name).read_text())


def _git_commit() -> str | None:
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(playground.__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> dict[str, Any]:
    """What produced the numbers: versions, device, threads, commit."""
    cuda = device == "cuda"
    return {
        "playground_version": playground.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else _cpu_name(),
        "cuda_version": torch.version.cuda if cuda else None,
        "threads": torch.get_num_threads(),
        "git_commit": _git_commit(),
        "started_at": datetime.datetime.now().isoformat(timespec="seconds"),
    }
