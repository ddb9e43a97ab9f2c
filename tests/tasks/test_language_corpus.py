"""The language-modelling task's data (issue 32): splits by file, the fingerprint, the
sources a corpus can be named by, the errors for bad corpora, training windows, the held-out
set at every length and the n-gram baselines. Every corpus here is written by the test."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from playground.errors import ConfigError
from playground.tasks.lm import ByteLanguageModelling
from playground.tasks.lm.corpus import SPLITS, CorpusError, load_corpus
from tests.tasks.text_corpus import write_corpus

SMALL = {"seq_len": 16, "eval_bytes": 512}


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus")


def contents(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*.txt")}


def test_splits_are_by_file_and_hold_every_byte_once(corpus_dir):
    corpus = load_corpus(str(corpus_dir))
    assert corpus.split_by == "file"
    named = [name for split in SPLITS for name in corpus.files[split]]
    assert sorted(named) == sorted(contents(corpus_dir))  # each file in exactly one split
    files = contents(corpus_dir)
    for split in SPLITS:
        assert corpus.files[split], f"{split} is empty"
        joined = b"".join(files[name] for name in corpus.files[split])
        assert bytes(corpus.streams[split].tolist()) == joined
    total = sum(len(data) for data in files.values())
    assert sum(int(stream.numel()) for stream in corpus.streams.values()) == total


def test_the_split_does_not_depend_on_listing_order_or_place(tmp_path, monkeypatch):
    forward = write_corpus(tmp_path / "a")
    backward = tmp_path / "b"
    backward.mkdir()
    for path in sorted(forward.iterdir(), reverse=True):  # created in the other order
        shutil.copyfile(path, backward / path.name)
    monkeypatch.chdir(tmp_path)
    one, other = load_corpus(str(forward)), load_corpus("b")
    assert one.files == other.files
    assert one.fingerprint == other.fingerprint


def test_a_single_file_is_split_into_spans_with_the_last_bytes_for_test(tmp_path):
    path = tmp_path / "book.txt"
    data = b"".join(contents(write_corpus(tmp_path / "parts")).values())
    path.write_bytes(data)
    corpus = load_corpus(str(path))
    assert corpus.split_by == "span"
    test = bytes(corpus.streams["test"].tolist())
    assert data.endswith(test) and len(test) == int(0.05 * len(data))
    assert (
        bytes(corpus.streams["train"].tolist())
        + bytes(corpus.streams["validation"].tolist())
        + test
        == data
    )


@pytest.mark.parametrize(
    "change",
    ["one byte", "a rename", "a new file"],
)
def test_the_fingerprint_changes_with_the_text(corpus_dir, change):
    before = load_corpus(str(corpus_dir)).fingerprint
    victim = sorted(corpus_dir.iterdir())[3]
    if change == "one byte":
        data = bytearray(victim.read_bytes())
        data[10] ^= 1
        victim.write_bytes(bytes(data))
    elif change == "a rename":
        victim.rename(victim.with_name(victim.stem + "b.txt"))  # the same sorted place
    else:
        (corpus_dir / "extra.txt").write_bytes(b"one more file\n")
    assert load_corpus(str(corpus_dir)).fingerprint != before


def test_equal_text_in_two_places_has_one_fingerprint(tmp_path):
    assert (
        load_corpus(str(write_corpus(tmp_path / "x"))).fingerprint
        == load_corpus(str(write_corpus(tmp_path / "y"))).fingerprint
    )


def test_a_glob_and_a_directory_and_what_a_directory_leaves_out(tmp_path, corpus_dir):
    (corpus_dir / ".hidden.txt").write_bytes(b"secret\n" * 100)
    (corpus_dir / "__pycache__").mkdir()
    (corpus_dir / "__pycache__" / "x.txt").write_bytes(b"cache\n" * 100)
    by_directory = load_corpus(str(corpus_dir))
    listed = {name for split in SPLITS for name in by_directory.files[split]}
    assert listed == {p.name for p in corpus_dir.glob("doc_*.txt")}
    by_glob = load_corpus(str(corpus_dir / "doc_*.txt"))
    assert by_glob.fingerprint == by_directory.fingerprint


def test_the_default_corpus_is_the_standard_librarys_source_without_tests():
    corpus = load_corpus("stdlib")
    names = [name for split in SPLITS for name in corpus.files[split]]
    assert len(names) > 300 and all(name.endswith(".py") for name in names)
    parts = {part for name in names for part in name.split("/")[:-1]}
    assert not parts & {"test", "tests", "idle_test", "site-packages"}
    assert corpus.split_by == "file"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{tmp}/missing", "no such file or directory"),
        ("{tmp}/none-*.txt", "matches no file"),
        ("{tmp}/empty", "holds no file"),
        ("{tmp}/blank", "are empty"),
    ],
)
def test_a_bad_corpus_is_refused_naming_it(tmp_path, source, expected):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank").mkdir()
    for index in range(3):
        (tmp_path / "blank" / f"{index}.txt").write_bytes(b"")
    name = source.format(tmp=tmp_path)
    with pytest.raises(CorpusError, match=expected) as caught:
        load_corpus(name)
    assert isinstance(caught.value, ConfigError)
    assert name in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_named(corpus_dir):
    victim = sorted(corpus_dir.iterdir())[0]
    victim.chmod(0)
    try:
        with pytest.raises(CorpusError, match=victim.name):
            load_corpus(str(corpus_dir))
    finally:
        victim.chmod(0o644)


def test_an_unreadable_file_is_named_even_as_root(corpus_dir, monkeypatch):
    victim = sorted(corpus_dir.iterdir())[0]
    real = Path.read_bytes

    def refuse(path: Path) -> bytes:
        if path == victim:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(CorpusError, match=rf"cannot read .*{victim.name}.*Permission denied"):
        load_corpus(str(corpus_dir))


def test_a_corpus_too_small_for_the_held_out_set_says_what_to_lower(corpus_dir):
    with pytest.raises(CorpusError, match=r"too small: its test split holds \d+ bytes.*eval_bytes"):
        ByteLanguageModelling(corpus=str(corpus_dir), seq_len=16, eval_bytes=100_000)


def test_training_windows_come_from_the_training_files_and_the_seed(corpus_dir):
    task = ByteLanguageModelling(corpus=str(corpus_dir), **SMALL)
    train, _ = task.split(seed=0, num_train=64)
    assert torch.equal(train.tokens[:, 1:], train.labels[:, :-1])  # next-byte labels
    stream = bytes(task.corpus.streams["train"].tolist())
    for tokens, labels in zip(train.tokens, train.labels, strict=True):
        window = bytes(tokens.tolist()) + bytes(labels[-1:].tolist())
        assert window in stream
    again, _ = task.split(seed=0, num_train=64)
    other, _ = task.split(seed=1, num_train=64)
    assert torch.equal(train.tokens, again.tokens)
    assert not torch.equal(train.tokens, other.tokens)


def test_every_length_dividing_eval_bytes_scores_the_same_held_out_bytes(corpus_dir):
    task = ByteLanguageModelling(corpus=str(corpus_dir), **SMALL)
    scored = {n: task.held_out(n).labels.flatten() for n in (16, 32, 128, 512)}
    for labels in scored.values():
        assert torch.equal(labels, scored[16])
    assert scored[16].numel() == 512
    test = task.corpus.streams["test"]
    assert torch.equal(scored[16], test[1:513].long())  # the first eval_bytes, next bytes
    odd = task.held_out(100)  # not a divisor: whole windows only, said by their number
    assert odd.labels.numel() == 500


def test_a_length_above_the_held_out_set_is_refused_naming_eval_bytes(corpus_dir):
    task = ByteLanguageModelling(corpus=str(corpus_dir), **SMALL)
    with pytest.raises(ConfigError, match="eval_bytes = 512"):
        task.held_out(1024)


def test_the_bigram_baseline_beats_the_unigram_one_on_patterned_text(tmp_path):
    directory = tmp_path / "pattern"
    directory.mkdir()
    for index in range(6):
        (directory / f"{index}.txt").write_bytes(b"abcdefgh" * 2000)
    task = ByteLanguageModelling(corpus=str(directory), seq_len=8, eval_bytes=256)
    baselines = task.baselines(8)
    assert baselines["bigram"] < 0.1 < 2.9 < baselines["unigram"] < 3.1  # log2(8) = 3


def test_the_unigram_baseline_of_uniform_bytes_is_near_eight_bits(tmp_path):
    directory = tmp_path / "random"
    directory.mkdir()
    generator = torch.Generator().manual_seed(0)
    for index in range(6):
        data = torch.randint(0, 256, (60_000,), generator=generator, dtype=torch.uint8)
        (directory / f"{index}.bin").write_bytes(bytes(data.tolist()))
    task = ByteLanguageModelling(corpus=str(directory), seq_len=8, eval_bytes=4096)
    assert math.isclose(task.baselines(8)["unigram"], 8.0, abs_tol=0.05)


def test_a_file_name_that_is_not_utf8_is_read_like_any_other(corpus_dir):
    (corpus_dir / os.fsdecode(b"bad\xff.txt")).write_bytes(b"still text\n" * 200)
    corpus = load_corpus(str(corpus_dir))
    assert os.fsdecode(b"bad\xff.txt") in {n for split in SPLITS for n in corpus.files[split]}


def test_a_pipe_is_not_called_missing(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(CorpusError, match="not a regular file or a directory"):
        load_corpus(str(pipe))


def test_baselines_score_the_bytes_each_length_scores(corpus_dir):
    task = ByteLanguageModelling(corpus=str(corpus_dir), seq_len=16, eval_bytes=500)
    unigram, _ = task._ngram_log_probabilities
    for length in (16, 64, 100):  # 496, 448 and 500 bytes scored
        labels = task.held_out(length).labels.flatten()
        expected = float(-unigram[labels].mean()) / math.log(2)
        assert task.baselines(length)["unigram"] == pytest.approx(expected, abs=1e-12)
    assert task.baselines(16)["unigram"] != task.baselines(64)["unigram"]
