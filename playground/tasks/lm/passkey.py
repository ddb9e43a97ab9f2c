"""The passkey format of the byte-level language task: a short random key hidden in filler
text, and a query at the end that the key answers.

The probe is passkey retrieval as Mohtashami & Jaggi 2023 ("Landmark Attention", arXiv
2305.16300, §4.2) pose it: a random number hidden in a long stretch of distracting text,
which the model must repeat when asked at the end. The needle's depth in the filler is
swept as in Kamradt's "needle in a haystack" test (2023) and RULER's single-needle tasks
(Hsieh et al. 2024, arXiv 2404.06654, §3.1), so a report draws exact match over depth ×
context length.

A model of a few hundred thousand parameters trained for minutes on source code does not
follow an English instruction, so the key's format is part of its training data (the lm
task's `passkey_fraction`): each window that carries one reads

    filler[:at] + NEEDLE + filler[at:q] + QUERY + key + filler[q:]

with NEEDLE = MARK "key " <digits> END and QUERY = MARK "key ": the key's digits answer the
query wherever it is drawn after the needle (`carry`; q is where, in filler bytes); a
probe's prompt ends with them (`hide`). MARK (0x02) and END (0x03) are control bytes that
the corpus must not hold (the task refuses one that does), so the query can only be
answered by finding the needle, never by text that happens to look like it.
"""

from __future__ import annotations

import hashlib

import torch

MARK = 0x02
"""Starts the needle and the query (ASCII STX: absent from source code and prose)."""
END = 0x03
"""Ends the needle (ASCII ETX)."""
KEY_TAG = b"key "
"""Between MARK and the digits, in the needle and the query alike."""
QUERY = bytes([MARK]) + KEY_TAG
"""The end of every passkey prompt: the next bytes are the key."""
MIN_FILLER = 16
"""Filler bytes a window holds at least, so that a needle is hidden in something."""
DIGITS = b"0123456789"


def needle_length(digits: int) -> int:
    """Bytes of MARK "key " <digits> END."""
    return len(QUERY) + digits + 1


def overhead(digits: int) -> int:
    """Bytes of a window that are not filler: the needle, the query and the answer."""
    return needle_length(digits) + len(QUERY) + digits


def minimum_length(digits: int) -> int:
    """The shortest window (in tokens: the bytes less the last answer byte, which is only a
    label) that holds a needle, the query, the answer and MIN_FILLER bytes of filler."""
    return overhead(digits) + MIN_FILLER - 1


def draw_keys(generator: torch.Generator, count: int, digits: int) -> torch.Tensor:
    """(count, digits) int64 ASCII codes of random decimal keys, uniform over 10^digits."""
    return torch.randint(0, 10, (count, digits), generator=generator) + DIGITS[0]


def key_generator(length: int, depth: float) -> torch.Generator:
    """The generator of the probe's keys at one (length, depth): the same on every machine
    and in every run, different for every pair, so no two cells share their keys by
    accident. The depth enters exactly (`float.hex`)."""
    digest = hashlib.blake2b(f"passkey:{length}:{float(depth).hex()}".encode(), digest_size=8)
    return torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") >> 1)


def insert(rows: torch.Tensor, pieces: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """rows[:at] + piece + rows[at:], row by row: rows (N, R), pieces (N, P) and at (N,)
    int64, each `at` in [0, R]. Returns (N, R + P)."""
    width, span = rows.shape[1], pieces.shape[1]
    position = torch.arange(width + span).unsqueeze(0)  # (1, R + P)
    start = at.unsqueeze(1)  # (N, 1)
    in_piece = (position >= start) & (position < start + span)
    from_rows = torch.where(position < start, position, position - span).clamp(0, width - 1)
    from_piece = (position - start).clamp(0, span - 1)
    return torch.where(in_piece, pieces.gather(1, from_piece), rows.gather(1, from_rows))


def _needles(keys: torch.Tensor) -> torch.Tensor:
    """(N, needle_length) MARK "key " <key> END of each key (N, D)."""
    count = keys.shape[0]
    marks = torch.tensor(list(QUERY), dtype=torch.int64).expand(count, -1)
    ends = torch.full((count, 1), END, dtype=torch.int64)
    return torch.cat([marks, keys, ends], dim=1)


def _questions(keys: torch.Tensor) -> torch.Tensor:
    """(N, len(QUERY) + D) the query and its answer, the key."""
    return torch.cat([torch.tensor(list(QUERY), dtype=torch.int64).expand(len(keys), -1), keys], 1)


def hide(filler: torch.Tensor, keys: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """filler[:at] + needle + filler[at:] + QUERY + key, row by row (the probe's prompts).

    filler (N, F) int64 bytes; keys (N, D) int64 ASCII digits; at (N,) int64 in [0, F],
    where each row's needle starts. Returns (N, F + overhead(D)) int64."""
    return torch.cat([insert(filler, _needles(keys), at), _questions(keys)], dim=1)


def carry(
    filler: torch.Tensor, keys: torch.Tensor, at: torch.Tensor, end: torch.Tensor
) -> torch.Tensor:
    """A training window that carries a passkey: `hide`'s needle at `at`, and the query
    and key ending at `end` (exclusive) rather than at the window's end, the rest of the
    filler after them, row by row.

    The query's place is drawn too so that a model learns to answer a query wherever it
    comes, not at the last positions of every window: a model with absolute positions that
    always saw it there puts the query's bytes at those positions of plain text (in
    calibration, vanilla's held-out loss at L = 64 rose from about 2.8 to 4.9 bits per byte
    with every query at the end). filler (N, F), keys (N, D), at and end (N,), with
    at + needle_length(D) + len(QUERY) + D <= end <= F + overhead(D)."""
    questions = _questions(keys)
    body = insert(filler, _needles(keys), at)  # (N, F + needle_length)
    return insert(body, questions, end - questions.shape[1])


def first_marked(streams: dict[str, torch.Tensor]) -> tuple[str, int, int] | None:
    """(split, offset, byte) of the first MARK or END byte in the splits' streams; None
    when the text holds neither."""
    for split, stream in streams.items():
        found = ((stream == MARK) | (stream == END)).nonzero()
        if found.numel():
            offset = int(found[0, 0])
            return split, offset, int(stream[offset])
    return None
