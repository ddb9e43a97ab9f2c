"""The results store: one directory per run, rows appended as they finish.

    results/<experiment>/<timestamp>/
        results.jsonl   one JSON object per measured cell, flushed and fsynced on write
        env.json        torch version, device, node, threads, git commit, GEMM throughput
        spec.toml       the spec as it was when the run started (resume re-reads it)
        overrides.json  the command line's --variants, --seq-lens, --threads, ... (resume
                        applies them again); it and spec.toml are written first, before
                        the GEMM is measured, so any interrupted run can be resumed
        summary.csv     derived from results.jsonl (playground.report.summary): costs
        accuracy.csv    derived too: accuracy per variant and task (when measured)
        results.rejected.jsonl   lines `playground repair` moved out of results.jsonl
        evaluations.json the lengths `playground eval` was asked for (a resume redoes them)
        run.lock        held (fcntl.flock) by the one process measuring the run; it holds
                        that process's id, so a second `--resume` names who has it
        weights/<cell>/seed-<k>.pt   a trained model's state dict (save_weights), loaded
                        back with torch.load(weights_only=True): tensors only, no code

Two runs never share a directory: it is created with `exist_ok=False`, and a clash
(two runs in the same second) takes the next free suffix. Two processes never measure one
directory at once: `RunStore.lock()` takes an exclusive, non-blocking flock on run.lock
(released by the kernel when the process ends, however it ends), and a second process
gets RunLocked naming the file and the holder's process id.

A damaged file (a line that is not a row, undecodable bytes, a cut env.json, a folder
where a file belongs) is a DamagedRun error naming the file, the line and the way out;
nothing is ever appended after an invalid line. `RunStore.repair()` moves what cannot be
read aside, byte for byte, so that a resume measures those cells again.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from playground.errors import PlaygroundError
from playground.run.row_schema import Row
from playground.run.rows import BadLine, parse_lines, row_problem

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked there
    fcntl = None

ROWS = "results.jsonl"
LOCK = "run.lock"
ENV = "env.json"
SPEC = "spec.toml"
SUMMARY = "summary.csv"
ACCURACY = "accuracy.csv"
OVERRIDES = "overrides.json"
REJECTED = "results.rejected.jsonl"
EVALUATIONS = "evaluations.json"
"""The lengths `playground eval` was asked for ({"eval_lengths": [...]}), written before its
first row: a resume scores again any of them a kept model lacks a row at."""
WEIGHTS = "weights"
SET_ASIDE = ".rejected"
"""The suffix `repair` gives a whole file it moves aside: env.json -> env.json.rejected."""
AFTER_SET_ASIDE = {
    ENV: "a resume then measures the environment and the GEMM again",
    OVERRIDES: "a resume then runs the whole spec, so restore the overrides from it first",
}


def _cut_line(data: bytes) -> BadLine:
    """The last line of results.jsonl's bytes, which a crash cut short."""
    pieces = data.split(b"\n")
    return BadLine(len(pieces), pieces[-1], "is cut short (no newline at the end)")


class DamagedRun(PlaygroundError, ValueError):
    """A file of a run directory cannot be read; the message names it and the way out."""


class RunLocked(PlaygroundError):
    """Another process is measuring this run directory."""


class RunLock:
    """An exclusive flock on a run's run.lock, holding this process's id; `release()`
    (or the end of the process) frees it."""

    def __init__(self, path: Path, then: str | None = None) -> None:
        """`then`: the command to run once the holder is done (default: a resume)."""
        self.path = path
        self.file = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        if fcntl is None:
            return
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "unknown"
            self.file.close()
            raise RunLocked(
                f"{path} is locked by process {holder}, which is measuring this run now; a "
                f"second run on it would measure the same cells twice. Wait for it to "
                f"finish (or stop it), then {then or f'`playground run --resume {path.parent}`'}"
            ) from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()

    def release(self) -> None:
        if self.file.closed:
            return
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
        self.file.close()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class UnwritablePlace(PlaygroundError, OSError):
    """A file or directory the playground must write cannot be written."""


def unwritable(path: Path, error: OSError, hint: str) -> UnwritablePlace:
    """The error for an OSError met while writing `path`."""
    reason = error.strerror or type(error).__name__
    if isinstance(error, (FileExistsError, NotADirectoryError)) or "exist" in reason.lower():
        reason += " (a file stands where a directory is needed)"
    return UnwritablePlace(f"cannot write {path}: {reason}; {hint}")


@dataclass
class Repair:
    """What RunStore.repair() moved aside."""

    lines: list[BadLine] = field(default_factory=list)
    moved: list[tuple[Path, Path]] = field(default_factory=list)
    """(from, to) of whole files or directories set aside."""

    def __bool__(self) -> bool:
        return bool(self.lines or self.moved)


class RunStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    @classmethod
    def create(cls, out: str | os.PathLike[str], experiment: str) -> RunStore:
        """A new, empty run directory under out/<experiment>/; `experiment` is a name,
        never a path (see playground.run.spec_loading.name_problem)."""
        root = Path(out)
        parent = root / experiment
        if Path(experiment).name != experiment or experiment in ("", ".", ".."):
            raise PlaygroundError(f"experiment name {experiment!r} is a path, not a name")
        hint = "give --out a directory you can write to"
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise unwritable(parent, error, hint) from None
        if not parent.resolve().is_relative_to(root.resolve()):  # a symbolic link out
            raise PlaygroundError(f"{parent} leads outside {root}; remove that link")
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        for attempt in range(1000):
            directory = parent / (stamp if attempt == 0 else f"{stamp}-{attempt}")
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            except OSError as error:
                raise unwritable(directory, error, hint) from None
            return cls(directory)
        raise PlaygroundError(f"could not create a fresh run directory under {parent}")

    @classmethod
    def existing(cls, directory: str | os.PathLike[str]) -> RunStore:
        """An earlier run's directory, to resume or to read."""
        store = cls(directory)
        spec = store.path(SPEC)
        if spec.is_dir():
            raise DamagedRun(
                f"{spec} is a directory, not the run's spec file; move it away and put the "
                f"spec the run started with there (a TOML file), then resume"
            )
        if not spec.is_file():
            raise PlaygroundError(
                f"{directory} is not a run directory (no {SPEC}); runs live in "
                f"results/<experiment>/<timestamp>/"
            )
        return store

    def path(self, name: str) -> Path:
        return self.directory / name

    def lock(self, then: str | None = None) -> RunLock:
        """Hold the run for this process (see the module docstring); RunLocked naming the
        other process when it is held already."""
        try:
            return RunLock(self.path(LOCK), then)
        except RunLocked:
            raise
        except OSError as error:
            raise unwritable(self.path(LOCK), error, "check the run directory") from None

    def _repair_hint(self) -> str:
        return f"run `playground repair {self.directory}` to set it aside"

    def _read_bytes(self, name: str) -> bytes | None:
        """The file's bytes; None when it does not exist; DamagedRun when it cannot be read."""
        path = self.path(name)
        if path.is_dir():
            raise DamagedRun(
                f"{path} is a directory, not a file; {self._repair_hint()} (it is renamed, "
                f"nothing is deleted), or move it away yourself"
            )
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise DamagedRun(f"cannot read {path}: {error.strerror}") from None

    def inspect(self) -> tuple[list[Row], list[BadLine], bool]:
        """(rows, bad lines, last line cut short) of results.jsonl, raising only when the
        file cannot be read at all."""
        data = self._read_bytes(ROWS)
        return parse_lines(data) if data else ([], [], False)

    def rows(self) -> list[Row]:
        """Every recorded row. A last line cut short by a crash is ignored (that cell
        counts as missing and a resume runs it again); any other line that is not a row
        is a DamagedRun error naming it."""
        rows, bad, _ = self.inspect()
        if bad:
            first = bad[0]
            more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
            raise DamagedRun(
                f"{self.path(ROWS)} line {first.number} {first.reason}{more}; run `playground "
                f"repair {self.directory}` to move the bad lines to {REJECTED} (nothing is "
                f"lost), then `playground run --resume {self.directory}` measures those cells "
                f"again"
            )
        return rows

    def append(self, row: Row) -> None:
        """Write one finished cell, durably, before the next one starts. The file is read
        first: a damaged one is never appended to, and a last line cut short by a crash
        is moved to results.rejected.jsonl, so the new row starts a line of its own."""
        problem = row_problem(row)
        if problem:
            raise ValueError(f"not a row: it {problem}: {row!r}")
        rows, bad, cut_short = self.inspect()
        if bad:
            self.rows()  # raises, naming the first bad line
        if cut_short:
            self.set_aside_cut_line()
        elif rows and not self.path(ROWS).read_bytes().endswith(b"\n"):
            self._append_bytes(b"\n")  # a whole last row that lost only its newline
        self._append_bytes((json.dumps(row, sort_keys=True) + "\n").encode("utf-8"))

    def _append_bytes(self, data: bytes) -> None:
        path = self.path(ROWS)
        try:
            with open(path, "ab") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
        except OSError as error:
            raise unwritable(path, error, "check the run directory") from None

    def repair(self) -> Repair:
        """Set aside what cannot be read: bad lines of results.jsonl (and a cut last one)
        go to results.rejected.jsonl as {"line", "reason", "text"} objects (the text
        decoded with surrogateescape, so the bytes are recoverable), a directory standing
        where results.jsonl or env.json belongs and an unreadable env.json are renamed.
        The cells whose lines moved count as missing: a resume measures them again."""
        done = Repair()
        if self.path(ROWS).is_dir():
            done.moved.append(self._set_aside(ROWS))
        for name in AFTER_SET_ASIDE:
            if self.path(name).exists():
                try:
                    self.read_json(name)
                except DamagedRun:
                    done.moved.append(self._set_aside(name))
        data = self._read_bytes(ROWS)
        if not data:
            return done
        rows, bad, cut_short = parse_lines(data)
        if cut_short:
            bad.append(_cut_line(data))
        if bad:
            self._set_aside_lines(rows, bad)
            done.lines = bad
        return done

    def set_aside_cut_line(self) -> BadLine | None:
        """Move a last line cut short by a crash to results.rejected.jsonl (as repair()
        does) and return it; None when the last line is whole. Its cell then counts as
        missing. DamagedRun when another line is bad (that is repair's to do)."""
        data = self._read_bytes(ROWS)
        if not data:
            return None
        rows, bad, cut_short = parse_lines(data)
        if bad:
            self.rows()  # raises, naming the first bad line
        if not cut_short:
            return None
        line = _cut_line(data)
        self._set_aside_lines(rows, [line])
        return line

    def _set_aside_lines(self, rows: list[Row], bad: list[BadLine]) -> None:
        """Append `bad` to results.rejected.jsonl, then rewrite results.jsonl with `rows`."""
        rejected = "".join(
            json.dumps(
                {
                    "line": line.number,
                    "reason": line.reason,
                    "text": line.raw.decode("utf-8", "surrogateescape"),
                }
            )
            + "\n"
            for line in bad
        )
        path = self.path(REJECTED)
        try:
            with open(path, "a", encoding="utf-8") as file:
                file.write(rejected)
                file.flush()
                os.fsync(file.fileno())
        except OSError as error:
            raise unwritable(path, error, "check the run directory") from None
        kept = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        self.write_text(ROWS, kept)

    def _set_aside(self, name: str) -> tuple[Path, Path]:
        target = name + SET_ASIDE
        source, destination = self.path(name), self.path(target)
        suffix = 1
        while destination.exists():
            destination = self.path(f"{target}.{suffix}")
            suffix += 1
        source.rename(destination)
        return source, destination

    def write_text(self, name: str, text: str) -> Path:
        """Replace a file of the run directory whole (written beside it, then renamed,
        so a crash never leaves it cut short)."""
        path = self.path(name)
        partial = self.path(f".{name}.partial")
        try:
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, path)
        except OSError as error:
            raise unwritable(
                path,
                error,
                "check that the run directory is writable and that no directory "
                "stands where the file belongs",
            ) from None
        return path

    def save_weights(self, cell_id: str, seed: int, state: dict[str, torch.Tensor]) -> str:
        """Keep one seed's trained weights (written beside, then renamed); returns their
        path relative to the run directory, for the row."""
        readable = re.sub(r"[^A-Za-z0-9=._-]+", "_", cell_id)[:80]
        folder = f"{readable}-{hashlib.blake2b(cell_id.encode(), digest_size=4).hexdigest()}"
        relative = f"{WEIGHTS}/{folder}/seed-{seed}.pt"
        path = self.path(relative)
        partial = path.with_name(f".{path.name}.partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, partial)
            os.replace(partial, path)
        except OSError as error:
            raise unwritable(path, error, "check that the run directory is writable") from None
        return relative

    def load_weights(self, relative: str) -> dict[str, torch.Tensor]:
        """Weights kept by save_weights; DamagedRun naming the file when it cannot be read."""
        path = self.path(relative)
        if not path.resolve().is_relative_to(self.directory.resolve()):
            raise DamagedRun(f"a row names weights at {relative!r}, outside the run directory")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            reason = "is missing"
        except Exception as error:  # a damaged file fails torch.load in many ways
            first = (str(error).splitlines() or [""])[0][:200]
            reason = f"cannot be read ({type(error).__name__}{': ' + first if first else ''})"
        else:
            if isinstance(state, dict) and all(torch.is_tensor(v) for v in state.values()):
                return state
            reason = "does not hold a state dict of tensors"
        raise DamagedRun(
            f"{path} {reason}; restore it, or train that cell again (a new run with "
            f"save_weights = true) to use its model"
        )

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        self.write_text(name, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def read_json(self, name: str) -> dict[str, Any]:
        """A JSON object file of the run; DamagedRun naming the file when it is not one."""
        path = self.path(name)
        data = self._read_bytes(name)
        if data is None:
            raise DamagedRun(f"{path} is missing")
        try:
            value = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as error:
            reason = f"is not UTF-8 text (byte {error.start + 1})"
        except json.JSONDecodeError as error:
            reason = f"is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        else:
            if isinstance(value, dict):
                return value
            reason = f"holds a JSON {type(value).__name__}, not an object"
        raise DamagedRun(
            f"{path} {reason}; restore it, or run `playground repair {self.directory}`, which "
            f"renames it to {name + SET_ASIDE}: {AFTER_SET_ASIDE.get(name, 'then resume')}"
        )
