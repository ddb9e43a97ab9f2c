"""Real text for byte-level language modelling: find the files, split them, fingerprint them.

A corpus is named by a `source`:
- "stdlib" (the default): the `.py` files of the Python standard library of the
  interpreter running the experiment, leaving out test suites (`test/`, `tests/`,
  `idle_test/`) and `site-packages`: about 12 MB of real code (734 files on 3.11) that every machine with
  Python has, with nothing to download;
- a file (enwik8, one book of PG-19), a directory (every file under it, hidden ones and
  `__pycache__` left out; links to directories are not followed) or a glob (`data/*.txt`, `books/**/*.txt`); `~` is expanded and
  a relative path is taken from the working directory.

Splits are assigned by file, never by random offsets into one stream, so no held-out
byte was ever a training byte's neighbour in the same file: files are ordered by a hash of
their path relative to the corpus root (a fixed pseudo-random order that does not depend
on the file system's listing), and taken in that order for test until it holds
`HELD_OUT_FRACTION` of the bytes, then for validation, the rest for training. A file that
would overfill a held-out split is left to training. A corpus of one or two files, or one
whose files are too uneven to split that way, is split into contiguous spans instead
(enwik8's convention: the last bytes are test, the ones before them validation); the
corpus says which (`split_by`).

The fingerprint hashes every file's relative path and bytes, and the split rule's version:
two corpora with equal fingerprints give equal splits, byte for byte. Every row records it,
and rows with different fingerprints are never compared.

Bytes are the tokens (vocabulary 256), so nothing is decoded and no text can fail to
decode; only the samples shown in a report are decoded, with replacement characters.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from playground.errors import ConfigError

STDLIB = "stdlib"
"""The default source: the running interpreter's standard library."""
STDLIB_EXCLUDED = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
"""Directories of the standard library left out: test suites and installed packages."""
SKIPPED_DIRECTORIES = frozenset({"__pycache__"})
"""Directories never read in a user's directory (beside hidden ones)."""
HELD_OUT_FRACTION = 0.05
"""Share of the bytes in each of the validation and test splits."""
SPLIT_RULE = "by-file-hash-v1"
"""Hashed into the fingerprint: a change of the split rule changes every fingerprint."""
SPLITS = ("train", "validation", "test")


class CorpusError(ConfigError):
    """A corpus cannot be used (missing, empty, unreadable, too small); the message names
    the file or pattern and what to do."""


@dataclass(frozen=True)
class Corpus:
    """A corpus read and split: each split's bytes as one uint8 stream, in a fixed order."""

    source: str
    root: Path
    split_by: Literal["file", "span"]
    files: dict[str, tuple[str, ...]]
    """Split -> the files (relative to root) whose bytes it holds (all of them for spans)."""
    streams: dict[str, torch.Tensor]
    """Split -> (bytes,) uint8: its files' bytes concatenated in the hash order."""
    fingerprint: str

    def describe(self) -> dict[str, Any]:
        """What a row says about the corpus."""
        return {
            "source": self.source,
            "root": str(self.root),
            "split_by": self.split_by,
            "files": {split: len(self.files[split]) for split in SPLITS},
            "bytes": {split: int(self.streams[split].numel()) for split in SPLITS},
            "fingerprint": self.fingerprint,
        }


def find_files(source: str) -> tuple[Path, list[Path]]:
    """The corpus root and its files (sorted), or CorpusError naming what is missing."""
    if source == STDLIB:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = [
            path
            for path in root.rglob("*.py")
            if not STDLIB_EXCLUDED & set(path.relative_to(root).parts[:-1])
        ]
        return root, sorted(path for path in files if path.is_file())
    expanded = os.path.expanduser(source)
    if glob.has_magic(expanded):
        files = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
        if not files:
            raise CorpusError(
                f"corpus {source!r}: the pattern matches no file; check it (`**` matches "
                "directories at any depth), or give a file or a directory"
            )
        root = Path(os.path.commonpath([p.parent for p in files]))
        return root, files
    path = Path(expanded)
    if path.is_file():
        return path.parent, [path]
    if path.is_dir():
        files = [
            each
            for each in path.rglob("*")
            if each.is_file()
            and not any(
                part.startswith(".") or part in SKIPPED_DIRECTORIES
                for part in each.relative_to(path).parts
            )
        ]
        if not files:
            raise CorpusError(
                f"corpus {source!r}: the directory {path} holds no file (links to "
                "directories are not followed); put text in it, or give another corpus"
            )
        return path, sorted(files)
    if path.exists():
        raise CorpusError(
            f"corpus {source!r}: {path} is not a regular file or a directory (a pipe or a "
            "device?); give a file, a directory or a glob of files"
        )
    raise CorpusError(
        f"corpus {source!r}: no such file or directory ({path.resolve()}); give a file, a "
        f"directory, a glob, or {STDLIB!r} for the Python standard library"
    )


def read_bytes(path: Path, source: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise CorpusError(
            f"corpus {source!r}: cannot read {path} ({error.strerror or error}); make it "
            "readable or leave it out of the corpus"
        ) from None


def _order(relative: str) -> bytes:
    return hashlib.blake2b(os.fsencode(relative), digest_size=16).digest()


def _split_by_file(sizes: dict[str, int]) -> dict[str, list[str]] | None:
    """Files to splits in hash order (see the module docstring); None when a held-out
    split stays empty."""
    total = sum(sizes.values())
    target = HELD_OUT_FRACTION * total
    chosen: dict[str, list[str]] = {split: [] for split in SPLITS}
    filled = {"test": 0, "validation": 0}
    for name in sorted(sizes, key=_order):
        for split in ("test", "validation"):
            if filled[split] < target and filled[split] + sizes[name] <= 2 * target:
                chosen[split].append(name)
                filled[split] += sizes[name]
                break
        else:
            chosen["train"].append(name)
    if not all(chosen[split] for split in SPLITS):
        return None
    return chosen


def load_corpus(source: str = STDLIB) -> Corpus:
    """Read and split the corpus named by `source` (cached per process while its files'
    paths, sizes and modification times stay the same)."""
    root, files = find_files(source)
    signature = tuple((str(p), *_stat(p, source)) for p in files)
    key = (source, str(root), signature)
    if key not in _CACHE:
        _CACHE.clear()  # one corpus at a time: a stdlib's worth of bytes is enough to hold
        _CACHE[key] = _read(source, root, files)
    return _CACHE[key]


_CACHE: dict[tuple[str, str, tuple[tuple[str, int, int], ...]], Corpus] = {}


def _stat(path: Path, source: str) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError as error:
        raise CorpusError(
            f"corpus {source!r}: cannot read {path} ({error.strerror or error})"
        ) from None
    return stat.st_size, stat.st_mtime_ns


def _read(source: str, root: Path, files: list[Path]) -> Corpus:
    contents = {path.relative_to(root).as_posix(): read_bytes(path, source) for path in files}
    digest = hashlib.blake2b(SPLIT_RULE.encode(), digest_size=20)
    for name in sorted(contents):
        digest.update(os.fsencode(name) + b"\0" + len(contents[name]).to_bytes(8, "little"))
        digest.update(contents[name])
    sizes = {name: len(data) for name, data in contents.items()}
    if sum(sizes.values()) == 0:
        raise CorpusError(
            f"corpus {source!r}: its {len(files)} file(s) under {root} are empty; give text"
        )
    by_file = _split_by_file(sizes) if len(contents) >= 3 else None
    if by_file is not None:
        streams = {
            split: _stream(b"".join(contents[name] for name in names))
            for split, names in by_file.items()
        }
        files_of = {split: tuple(names) for split, names in by_file.items()}
        split_by: Literal["file", "span"] = "file"
    else:
        names = sorted(contents, key=_order)
        whole = b"".join(contents[name] for name in names)
        held_out = int(HELD_OUT_FRACTION * len(whole))
        train_end, validation_end = len(whole) - 2 * held_out, len(whole) - held_out
        streams = {
            "train": _stream(whole[:train_end]),
            "validation": _stream(whole[train_end:validation_end]),
            "test": _stream(whole[validation_end:]),
        }
        files_of = {split: tuple(names) for split in SPLITS}
        split_by = "span"
    return Corpus(source, root, split_by, files_of, streams, digest.hexdigest())


def _stream(data: bytes) -> torch.Tensor:
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )
