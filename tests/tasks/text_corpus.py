"""Tiny corpora the language-modelling tests write themselves: seeded pseudo-text, so a
test needs no download and no standard library read."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "that", "with", "as", "on", "be", "by",
    "this", "are", "from", "at", "or", "an", "it", "not", "which", "self", "def", "return",
    "import", "class", "if", "else", "while", "value", "name", "data", "list", "key", "error",
    "none", "true",
)  # fmt: skip


def text(seed: int, size: int) -> bytes:
    """About `size` bytes of words and newlines, the same for the same seed."""
    generator = random.Random(seed)
    out: list[str] = []
    length = 0
    while length < size:
        line = " ".join(generator.choice(WORDS) for _ in range(generator.randint(3, 12)))
        out.append(line)
        length += len(line) + 1
    return ("\n".join(out) + "\n").encode()[:size]


def write_corpus(directory: Path, files: int = 12, size: int = 4000, first: int = 0) -> Path:
    """`files` text files of about `size` bytes in `directory` (created), named by index;
    returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(first, first + files):
        (directory / f"doc_{index:02d}.txt").write_bytes(text(index, size + 97 * index))
    return directory
