"""Real text for byte-level language modelling: find the files, split them, fingerprint them.

A corpus is named by a `source`:
- "stdlib" (the default): the `.py` files of the Python standard library of the
  interpreter running the experiment, leaving out test suites (`test/`, `tests/`,
  `idle_test/`) and `site-packages`: about 12 MB of real code (734 files on 3.11) that every machine with
  Python has, with nothing to download;
- a file (enwik8, one book of PG-19), a directory (every file under it, hidden ones and
  `__pycache__` left out; links to directories are not followed) or a glob (`data/*.txt`,
  `books/**/*.txt`, matched as `glob.glob(recursive=True)` matches; a link to a directory is
  followed unless it leads to a directory already read, so a link loop is read once); `~` is
  expanded and a relative path is taken from the working directory.

A file is read once however many names lead to it (symbolic or hard links, a loop): under
its name with the fewest links on the way, then the fewest parts, then the first in order.

Splits are assigned by file, never by random offsets into one stream, so no held-out
byte was ever a training byte's neighbour in the same file: files are ordered by a hash of
their path relative to the corpus root (a fixed pseudo-random order that does not depend
on the file system's listing), and taken in that order for test until it holds
`HELD_OUT_FRACTION` of the bytes, then for validation, the rest for training. A file that
would overfill a held-out split is left to training. Files with identical text go to the
split the first of them went to, so no text is both trained on and held out (a corpus the
first rule already split so keeps its split and fingerprint). A corpus of one or two files,
or one whose files are too uneven to split that way, is split into contiguous spans instead
(enwik8's convention: the last bytes are test, the ones before them validation), with each
text once; the corpus says which (`split_by`). A split that would still share a file or a
text between two splits is refused (CorpusError).

The fingerprint hashes every file's relative path and bytes, and the split rule's version
(with a mark where identical texts changed a split or a span stream from the first rule's):
two corpora with equal fingerprints give equal splits, byte for byte. Every row records it,
and rows with different fingerprints are never compared.

Bytes are the tokens (vocabulary 256), so nothing is decoded and no text can fail to
decode; only the samples shown in a report are decoded, with replacement characters.
"""

from __future__ import annotations

import fnmatch
import functools
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
TEXTS_KEPT_TOGETHER = b"identical-texts-in-one-split"
"""Hashed into the fingerprint when identical texts moved a file from the split the
first rule gave it (such a corpus's earlier split put one text in two splits)."""
REPEATS_LEFT_OUT = b"repeated-texts-left-out-of-spans"
"""Hashed into the fingerprint when a span-split corpus read a text once that it held twice."""


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
        return root, sorted(_read_once(root, [path for path in files if path.is_file()]))
    expanded = os.path.expanduser(source)
    if glob.has_magic(expanded):
        files = sorted(_expand(expanded))
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
        return path, sorted(_read_once(path, files))
    if path.exists():
        raise CorpusError(
            f"corpus {source!r}: {path} is not a regular file or a directory (a pipe or a "
            "device?); give a file, a directory or a glob of files"
        )
    raise CorpusError(
        f"corpus {source!r}: no such file or directory ({path.resolve()}); give a file, a "
        f"directory, a glob, or {STDLIB!r} for the Python standard library"
    )


def _identity(path: Path) -> tuple[int, int] | None:
    """The file or directory `path` leads to (device, inode); None when it cannot be stat'ed."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _links_on_the_way(root: Path, path: Path) -> int:
    """How many of `path`'s parts below `root` are symbolic links."""
    parts = path.relative_to(root).parts
    return sum((root.joinpath(*parts[: index + 1])).is_symlink() for index in range(len(parts)))


def _read_once(root: Path, files: list[Path]) -> list[Path]:
    """`files` with one name per file they lead to: the name with the fewest links on the
    way, then the fewest parts, then the first in order (so a tree reached through a link
    keeps its own names)."""
    ranked = sorted(
        files,
        key=lambda path: (_links_on_the_way(root, path), len(path.parts), str(path)),
    )
    kept: dict[tuple[int, int] | Path, Path] = {}
    for path in ranked:
        kept.setdefault(_identity(path) or path, path)
    return list(kept.values())


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _component_matches(pattern: str, name: str) -> bool:
    """One path component against one pattern component, as glob matches it: wildcards
    never match a leading dot unless the pattern has one."""
    if not glob.has_magic(pattern):
        return pattern == name
    if _is_hidden(name) and not _is_hidden(pattern):
        return False
    return fnmatch.fnmatchcase(name, pattern)


@functools.lru_cache(maxsize=4096)
def _matches(pattern: tuple[str, ...], parts: tuple[str, ...], prefix: bool) -> bool:
    """Whether `parts` match `pattern` (`**` matches any number of components that are
    not hidden); with `prefix`, whether a path below `parts` could."""
    if not parts:
        return bool(pattern) if prefix else all(each == "**" for each in pattern)
    if not pattern:
        return False
    head, *others = pattern
    if head == "**":
        return _matches(tuple(others), parts, prefix) or (
            not _is_hidden(parts[0]) and _matches(pattern, parts[1:], prefix)
        )
    return _component_matches(head, parts[0]) and _matches(tuple(others), parts[1:], prefix)


def _expand(pattern: str) -> list[Path]:
    """The files `pattern` matches, as `glob.glob(pattern, recursive=True)` finds them, but
    reading each directory once: a link to a directory already read (a loop back up the
    tree, a second way into one) is not followed, where glob follows it until the path is
    too long to resolve (issue 42: a loop made 12 files 492) or, with two loops, for ever.
    The walk reads the directories themselves first and the links after, so a file keeps
    the name without links where it has one."""
    parts = Path(pattern).parts
    fixed = next(index for index, part in enumerate(parts) if glob.has_magic(part))
    base, wanted = Path(*parts[:fixed]) if fixed else Path(), tuple(parts[fixed:])
    seen = {_identity(base)}
    found: list[Path] = []
    links: list[tuple[Path, tuple[str, ...]]] = []
    pending: list[tuple[Path, tuple[str, ...]]] = [(base, ())]
    while pending or links:
        if not pending:
            directory, below = links.pop(0)
            identity = _identity(directory)
            if identity is None or identity in seen:
                continue
            seen.add(identity)
            pending.append((directory, below))
        directory, below = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError:  # unreadable, or gone: glob leaves it out too
            continue
        for entry in reversed(entries):  # popped in sorted order
            relative = (*below, entry.name)
            try:
                is_directory = entry.is_dir()
            except OSError:
                continue
            if is_directory:
                if not _matches(wanted, relative, True):
                    continue
                if entry.is_symlink():
                    links.append((Path(entry.path), relative))
                elif _identity(Path(entry.path)) not in seen:
                    seen.add(_identity(Path(entry.path)))
                    pending.append((Path(entry.path), relative))
            elif _matches(wanted, relative, False) and entry.is_file():
                found.append(Path(entry.path))
    return _read_once(base, found)


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


def _split_by_file(
    sizes: dict[str, int], texts: dict[str, bytes | None]
) -> tuple[dict[str, list[str]], bool] | None:
    """Files to splits in hash order (see the module docstring), and whether identical
    texts (`texts`: name -> digest, None for an empty file) moved a file from the split
    the rule alone gives it; None when a held-out split stays empty."""
    total = sum(sizes.values())
    target = HELD_OUT_FRACTION * total
    chosen: dict[str, list[str]] = {split: [] for split in SPLITS}
    filled = {"train": 0, "test": 0, "validation": 0}
    split_of_text: dict[bytes, str] = {}
    moved = False
    for name in sorted(sizes, key=_order):
        by_rule = next(
            (
                split
                for split in ("test", "validation")
                if filled[split] < target and filled[split] + sizes[name] <= 2 * target
            ),
            "train",
        )
        text = texts[name]
        split = by_rule if text is None else split_of_text.setdefault(text, by_rule)
        moved |= split != by_rule
        chosen[split].append(name)
        filled[split] += sizes[name]
    if not all(chosen[split] for split in SPLITS):
        return None
    return chosen, moved


def check_disjoint(
    source: str, files: dict[str, tuple[str, ...]], texts: dict[str, bytes | None]
) -> None:
    """CorpusError when two splits share a file or a text: held-out bytes that were also
    trained on (or validated on) would make the held-out score a memory test."""
    for index, first in enumerate(SPLITS):
        for second in SPLITS[index + 1 :]:
            shared = sorted(set(files[first]) & set(files[second]))
            own = {texts[name]: name for name in files[first] if texts[name] is not None}
            same = [(own[texts[n]], n) for n in files[second] if texts[n] in own]
            if shared or same:
                named = f"{shared[0]!r}" if shared else f"{same[0][0]!r} and {same[0][1]!r}"
                raise CorpusError(
                    f"corpus {source!r}: the {first} and {second} splits share "
                    f"{'the file' if shared else 'the text of'} {named}, so held-out bytes "
                    f"would be trained on; remove the copies from the corpus"
                )


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
    texts = {
        name: hashlib.blake2b(data, digest_size=20).digest() if data else None
        for name, data in contents.items()
    }
    by_file = _split_by_file(sizes, texts) if len(contents) >= 3 else None
    if by_file is not None:
        splits, moved = by_file
        if moved:
            digest.update(TEXTS_KEPT_TOGETHER)
        files_of = {split: tuple(names) for split, names in splits.items()}
        check_disjoint(source, files_of, texts)
        streams = {
            split: _stream(b"".join(contents[name] for name in names))
            for split, names in files_of.items()
        }
        split_by: Literal["file", "span"] = "file"
    else:
        first_of_text: dict[bytes, str] = {}
        for name in sorted(contents, key=_order):
            first_of_text.setdefault(texts[name] or os.fsencode(name), name)
        names = list(first_of_text.values())  # a text held twice is read once
        if len(names) < len(contents):
            digest.update(REPEATS_LEFT_OUT)
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
