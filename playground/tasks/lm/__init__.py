"""Byte-level causal language modelling on real text.

Each byte is a token (vocabulary 256, no tokenizer to download) and the model predicts the
next one; the metric is bits per byte on held-out files, the unit of the byte- and
character-level results the zoo's papers report (enwik8 and text8 in bits per character;
Al-Rfou et al. 2019; Dai et al. 2019, Transformer-XL, §4.1). Length extrapolation follows
Press et al. 2022, "Train Short, Test Long" (ALiBi), §4: train at L, then evaluate the same
model on the same held-out text cut into longer windows.

The held-out set is the first `eval_bytes` bytes of the test split (its files in the
corpus's hash order, `playground.tasks.lm.corpus`), cut into non-overlapping windows of the
evaluation length; every byte of a window is predicted from the bytes before it in that
window, and bits per byte is averaged per position: the total over every scored byte,
divided by their number. At a length that divides `eval_bytes` (with the default, a power
of two, every power of two below it), every length scores the same bytes; otherwise the
tail that does not fill a window is left out, the row says how many bytes were scored, and
its n-gram baselines are computed on those same bytes.

Training windows of L + 1 bytes start at random offsets in the training split (the usual
character-level recipe, nanoGPT's among them), drawn from the seed.

The passkey probe (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2; the depth sweep of
Kamradt's needle in a haystack and of RULER, Hsieh et al. 2024) asks the trained model for
a random key hidden in held-out text (`passkey_prompts`; the format in
playground.tasks.lm.passkey). A tiny model trained for minutes on code cannot follow an
instruction zero-shot, so the format is in its training data: with `passkey_fraction` f,
about f of the training windows hide a needle with a fresh key in their own text and ask
for it later, the query and the key at a random place after the needle and the rest of the
text after them (`passkey.carry`), every byte still a next-byte label. The probe's prompts are built from the test split alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from playground.errors import ConfigError
from playground.hookspecs import hookimpl
from playground.tasks import IGNORE, LanguageTask, Task, TaskData, TaskOptions
from playground.tasks.lm import passkey
from playground.tasks.lm.corpus import STDLIB, Corpus, CorpusError, load_corpus


@dataclass(frozen=True)
class LanguageModellingOptions(TaskOptions):
    seq_len: int = 256
    """Training length L: bytes per training window."""
    corpus: str = STDLIB
    """The text: "stdlib" (the Python standard library's source on this machine), or a
    file, a directory or a glob (see playground.tasks.lm.corpus)."""
    eval_bytes: int = 65536
    """Bytes of the test split scored at every evaluation length (a power of two keeps the
    scored bytes equal at every power-of-two length up to it)."""
    prompt: str = "def __init__(self"
    """Where the continuation shown in the report starts."""
    sample_bytes: int = 64
    """Bytes of greedy continuation shown in the report."""
    position_bucket: int = 64
    """Positions per bucket of the loss by position (`bits_per_byte_by_position`): each
    evaluation length's rows also give bits per byte over positions [0, 64), [64, 128), …"""
    passkey_fraction: float = 0.0
    """Share of the training windows that carry a passkey (the module docstring): a needle
    at a uniform random depth of the window's filler, and the query and the key at its end.
    The format in the data is what lets a tiny model answer the probe; 0 trains on the
    text alone."""
    passkey_depths: tuple[float, ...] = ()
    """Depths of the probe's needle in its filler, each in [0, 1] (0: where the filler
    starts, 1: just before the query); () = no probe."""
    passkey_trials: int = 32
    """Prompts of the probe per depth and length (each its own filler and key)."""
    passkey_digits: int = 5
    """Decimal digits of a key (chance of guessing one: 10^-digits)."""

    def __post_init__(self) -> None:
        for name in (
            "seq_len",
            "eval_bytes",
            "sample_bytes",
            "position_bucket",
            "passkey_trials",
            "passkey_digits",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.eval_bytes < self.seq_len:
            raise ValueError(
                f"eval_bytes ({self.eval_bytes}) must hold at least one training length, seq_len "
                f"({self.seq_len}); raise eval_bytes"
            )
        if not isinstance(self.corpus, str) or not self.corpus:
            raise ValueError(
                f'corpus must be "stdlib", a file, a directory or a glob; got {self.corpus!r}'
            )
        if not isinstance(self.prompt, str) or not self.prompt:
            raise ValueError(f"prompt must be a non-empty string; got {self.prompt!r}")
        self._check_passkey()

    @property
    def passkey_on(self) -> bool:
        """Whether the windows carry passkeys or the model is probed for them."""
        return self.passkey_fraction > 0 or bool(self.passkey_depths)

    def _check_passkey(self) -> None:
        fraction = self.passkey_fraction
        if not _is_number(fraction) or not 0.0 <= fraction <= 1.0:
            raise ValueError(
                f"passkey_fraction must be a number in [0, 1] (the share of training windows "
                f"that carry a passkey); got {fraction!r}"
            )
        depths = self.passkey_depths
        if not isinstance(depths, tuple) or not all(
            _is_number(depth) and 0.0 <= depth <= 1.0 for depth in depths
        ):
            raise ValueError(
                f"passkey_depths must be a list of numbers in [0, 1] (0: the needle where the "
                f"filler starts, 1: just before the query), e.g. [0.0, 0.5, 1.0]; got {depths!r}"
            )
        if len(set(depths)) < len(depths):
            raise ValueError(f"passkey_depths lists a depth twice: {list(depths)}; give each once")
        shortest = passkey.minimum_length(self.passkey_digits)
        if self.passkey_on and self.seq_len < shortest:
            raise ValueError(
                f"seq_len {self.seq_len} is too short for a passkey of {self.passkey_digits} "
                f"digits: a window needs at least {shortest} tokens (the needle, the query, the "
                f"key and {passkey.MIN_FILLER} bytes of filler); raise seq_len, lower "
                f"passkey_digits, or set passkey_fraction = 0 and passkey_depths = []"
            )


class ByteLanguageModelling(LanguageTask):
    """Next-byte prediction on real text, scored in bits per byte (see the module docstring).

    Default budget: 1500 AdamW steps of 32 windows. The corpus is read when the task is
    made, so a missing or unusable corpus is refused before anything trains.
    """

    name = "lm"
    summary = "Predict the next byte of real text (bits per byte on held-out files)."
    paper = "Press et al. 2022, Train Short, Test Long (ALiBi), §4; byte-level as enwik8"
    Options = LanguageModellingOptions
    default_steps = 1500
    default_batch_size = 32
    default_learning_rate = 2e-3
    num_train = 1 << 20
    """Windows the training may draw (the schedule draws steps × batch_size of them)."""

    options: LanguageModellingOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.corpus: Corpus = load_corpus(self.options.corpus)
        self._check_size()
        if self.options.passkey_on:
            self._check_unmarked()

    @functools.cached_property
    def _marked(self) -> tuple[str, int, int] | None:
        return passkey.first_marked(self.corpus.streams)

    def _check_unmarked(self) -> None:
        """CorpusError when the text holds the passkey's MARK or END byte: a query could
        then be answered, or a needle faked, by the text itself."""
        found = self._marked
        if found is not None:
            split, offset, byte = found
            raise CorpusError(
                f"corpus {self.options.corpus!r} holds the byte {byte:#04x} (its {split} split, "
                f"at byte {offset}), which the passkey format keeps for itself (MARK "
                f"{passkey.MARK:#04x}, END {passkey.END:#04x}); remove those bytes from the "
                f"text, or train and probe without passkeys (passkey_fraction = 0, "
                f"passkey_depths = [])"
            )

    def _check_size(self) -> None:
        sizes = {split: int(stream.numel()) for split, stream in self.corpus.streams.items()}
        needs = {
            "train": self.options.seq_len + 1,
            "validation": self.options.seq_len + 1,
            "test": self.options.eval_bytes + 1,
        }
        short = [split for split in needs if sizes[split] < needs[split]]
        if short:
            split = short[0]
            raise CorpusError(
                f"corpus {self.options.corpus!r} is too small: its {split} split holds "
                f"{sizes[split]} bytes and needs at least {needs[split]} (seq_len "
                f"{self.options.seq_len}, eval_bytes {self.options.eval_bytes}; each held-out "
                f"split is about 5 % of the corpus's {sum(sizes.values())} bytes); give more "
                f"text, or lower seq_len and eval_bytes"
            )

    @property
    def seq_len(self) -> int:
        return self.options.seq_len

    @property
    def num_test(self) -> int:  # type: ignore[override]
        return self.options.eval_bytes // self.options.seq_len

    @property
    def fingerprint(self) -> str:
        return self.corpus.fingerprint

    @property
    def prompt(self) -> bytes:
        return self.options.prompt.encode()

    @property
    def sample_bytes(self) -> int:
        return self.options.sample_bytes

    @property
    def position_bucket(self) -> int:
        return self.options.position_bucket

    @property
    def passkey_depths(self) -> tuple[float, ...]:
        return self.options.passkey_depths

    def describe_data(self) -> dict[str, Any]:
        return self.corpus.describe()

    def check_eval_length(self, length: int) -> None:
        if length < 1:
            raise ConfigError(f"an evaluation length must be a positive integer; got {length}")
        if length > self.options.eval_bytes:
            raise ConfigError(
                f"evaluation length {length} is longer than the held-out set (eval_bytes = "
                f"{self.options.eval_bytes}): not one stretch of that length fits in it; raise the task's "
                f"eval_bytes (the test split holds {self.corpus.streams['test'].numel()} bytes)"
            )
        shortest = passkey.minimum_length(self.options.passkey_digits)
        if self.options.passkey_depths and length < shortest:
            raise ConfigError(
                f"evaluation length {length} cannot hold the passkey probe's prompt: a "
                f"{self.options.passkey_digits}-digit key needs at least {shortest} tokens; "
                f"evaluate at {shortest} or more, or leave passkey_depths out"
            )

    # --- data -------------------------------------------------------------------------
    def generate(self, num_examples: int, seed: int) -> TaskData:
        """`num_examples` training windows at random offsets in the training split, about
        `passkey_fraction` of them carrying a passkey (drawn after the offsets, from the
        same generator, so a fraction of 0 leaves the windows as they were)."""
        stream = self.corpus.streams["train"]
        length = self.options.seq_len
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, stream.numel() - length, (num_examples,), generator=generator)
        windows = stream.unfold(0, length + 1, 1)[starts].long()  # (N, L + 1)
        if self.options.passkey_fraction > 0:
            carriers = torch.rand(num_examples, generator=generator) < self.options.passkey_fraction
            digits = self.options.passkey_digits
            filler = length + 1 - passkey.overhead(digits)
            keys = passkey.draw_keys(generator, int(carriers.sum()), digits)
            count, span = len(keys), len(passkey.QUERY) + digits
            # where the key ends, then the needle anywhere before its query (`passkey.carry`)
            shortest = passkey.needle_length(digits) + span
            end = (
                shortest + (torch.rand(count, generator=generator) * (length + 2 - shortest)).long()
            )
            at = (torch.rand(count, generator=generator) * (end - shortest + 1)).long()
            windows[carriers] = passkey.carry(windows[carriers, :filler], keys, at, end)
        return TaskData(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())

    def passkey_prompts(self, length: int, depth: float) -> TaskData:
        """`passkey_trials` prompts of `length` tokens from the test split: trial t's filler
        starts at byte t · (S − F) // trials of the test stream (S bytes, F of filler), its
        needle at byte round(depth · F) of it, with the key of (length, depth, t)
        (`passkey.key_generator`); labels IGNORE but on the last `passkey_digits` positions,
        whose labels are the key's digits."""
        digits = self.options.passkey_digits
        shortest = passkey.minimum_length(digits)
        if isinstance(length, bool) or not isinstance(length, int) or length < shortest:
            raise ConfigError(
                f"a passkey prompt of {length!r} tokens cannot hold a {digits}-digit key: it "
                f"needs at least {shortest} (the needle, the query, the key and "
                f"{passkey.MIN_FILLER} bytes of filler); probe at {shortest} tokens or more"
            )
        if not 0.0 <= depth <= 1.0:
            raise ConfigError(f"a passkey depth must be in [0, 1]; got {depth!r}")
        self._check_unmarked()
        test = self.corpus.streams["test"]
        filler = length + 1 - passkey.overhead(digits)
        if filler > test.numel():
            raise ConfigError(
                f"a passkey prompt of {length} tokens needs {filler} bytes of filler, and the "
                f"test split holds {test.numel()}; probe at shorter lengths or give more text"
            )
        trials = self.options.passkey_trials
        offsets = torch.arange(trials) * (test.numel() - filler) // trials
        fillers = test.unfold(0, filler, 1)[offsets].long()  # (trials, F)
        keys = passkey.draw_keys(passkey.key_generator(length, depth), trials, digits)
        at = torch.full((trials,), round(depth * filler), dtype=torch.int64)
        prompts = passkey.hide(fillers, keys, at)  # (trials, length + 1)
        labels = torch.full((trials, length), IGNORE, dtype=torch.int64)
        labels[:, -digits:] = keys
        return TaskData(prompts[:, :-1].contiguous(), labels)

    def split(
        self, seed: int, num_train: int | None = None, num_test: int | None = None
    ) -> tuple[TaskData, TaskData]:
        """Training windows for `seed`, and the held-out set at the training length: the two
        come from different files (the corpus's splits), so no window is in both."""
        train = self.generate(self.num_train if num_train is None else num_train, 2 * seed)
        return train, self.held_out(self.options.seq_len)

    def held_out(self, length: int) -> TaskData:
        self.check_eval_length(length)
        return _windows(self.corpus.streams["test"], length, self.options.eval_bytes)

    def validation_split(self, seed: int, num_examples: int | None = None) -> TaskData:
        """The validation split's windows at the training length: fixed files, as the
        test set's, so every seed is chosen on the same bytes."""
        return self.validation(self.options.seq_len)

    def validation(self, length: int) -> TaskData:
        stream = self.corpus.streams["validation"]
        return _windows(stream, length, min(self.options.eval_bytes, stream.numel() - 1))

    # --- baselines --------------------------------------------------------------------
    @functools.cached_property
    def _ngram_log_probabilities(self) -> tuple[torch.Tensor, torch.Tensor]:
        """log P(byte) (256,) and log P(byte | previous byte) (256, 256), add-one smoothed,
        counted on the training split."""
        train = self.corpus.streams["train"].long()
        unigram = (torch.bincount(train, minlength=256).double() + 1.0).log()
        pairs = torch.bincount(train[:-1] * 256 + train[1:], minlength=256 * 256).double()
        bigram = (pairs.view(256, 256) + 1.0).log()
        return unigram - unigram.logsumexp(0), bigram - bigram.logsumexp(1, keepdim=True)

    def baselines(self, length: int) -> dict[str, float]:
        """Unigram and bigram byte models with add-one smoothing, counted on the training
        split, in bits per byte on exactly the bytes `held_out(length)` scores."""
        scored = self.held_out(length)
        labels, previous = scored.labels.flatten(), scored.tokens.flatten()
        unigram, bigram = self._ngram_log_probabilities
        return {
            "unigram": float(-unigram[labels].mean()) / math.log(2),
            "bigram": float(-bigram[previous, labels].mean()) / math.log(2),
        }


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _windows(stream: torch.Tensor, length: int, span: int) -> TaskData:
    """The first `span` bytes of `stream` as windows of `length` bytes, each labelled with
    its next bytes (the byte after the span labels the last one)."""
    count = span // length
    used = stream[: count * length + 1].long()
    return TaskData(used[:-1].view(count, length), used[1:].view(count, length))


@hookimpl
def register_tasks(register: Callable[[type[Task]], None]) -> None:
    register(ByteLanguageModelling)
