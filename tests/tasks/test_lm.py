"""The "lm" task's corpus and data (issue 32), on corpora each test writes: files assigned
to splits whole and in an order that depends on nothing but their names, the fingerprint,
the sources a corpus can be named by, the errors for a corpus that cannot be used, the
training windows, the held-out set at every evaluation length, and the n-gram baselines.

(tests/tasks/test_language_corpus.py checks much of this too, with other corpora; the
tests here are written from the issue's list, each seen to fail on a deliberately broken
copy of the code: see the report of the session that wrote them.)"""

from __future__ import annotations

import hashlib
import math
import os
import random
import sysconfig
from pathlib import Path

import pytest
import torch

from playground.errors import ConfigError
from playground.tasks.lm import ByteLanguageModelling
from playground.tasks.lm import corpus as corpus_module
from playground.tasks.lm.corpus import SPLITS, CorpusError, load_corpus

SEQ_LEN = 16
EVAL_BYTES = 512
NAMES = [f"part_{index:02d}.txt" for index in range(10)]
SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "do")


def prose(seed: int, size: int) -> bytes:
    """`size` bytes of pseudo-English (words of syllables, sentences, newlines)."""
    generator = random.Random(seed)
    words: list[str] = []
    while sum(len(word) + 1 for word in words) < size:
        word = "".join(generator.choice(SYLLABLES) for _ in range(generator.randint(1, 4)))
        words.append(word + ("." if generator.random() < 0.1 else ""))
        if generator.random() < 0.08:
            words.append("\n")
    return " ".join(words).encode()[:size]


def sizes() -> list[int]:
    """Each file's size: 2-8 KB, the same on every call."""
    generator = random.Random(7)
    return [generator.randint(2000, 8000) for _ in NAMES]


def write_prose(directory: Path, order: list[int] | None = None) -> Path:
    """The ten files of the test corpus in `directory`, created in `order` (of indexes)."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in order if order is not None else range(len(NAMES)):
        (directory / NAMES[index]).write_bytes(prose(index, sizes()[index]))
    return directory


def marker_bytes(index: int) -> range:
    """The byte values file `index` of a marked corpus is made of: a range of its own."""
    return range(20 + 20 * index, 40 + 20 * index)


def write_marked(directory: Path) -> Path:
    """Ten files, each drawn only from its own `marker_bytes`, so any window of bytes
    says which files it came from."""
    directory.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(NAMES):
        generator = random.Random(index)
        values = list(marker_bytes(index))
        data = bytes(generator.choice(values) for _ in range(sizes()[index]))
        (directory / name).write_bytes(data)
    return directory


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir() if path.is_file()}


def stream(corpus, split: str) -> bytes:
    return bytes(corpus.streams[split].tolist())


def task(directory: Path, **options) -> ByteLanguageModelling:
    return ByteLanguageModelling(
        **{"corpus": str(directory), "seq_len": SEQ_LEN, "eval_bytes": EVAL_BYTES, **options}
    )


@pytest.fixture
def prose_dir(tmp_path: Path) -> Path:
    return write_prose(tmp_path / "prose")


# --- splits -----------------------------------------------------------------------
def test_each_file_is_in_one_split_and_every_byte_in_exactly_one(prose_dir):
    corpus = load_corpus(str(prose_dir))
    files = file_bytes(prose_dir)
    assert corpus.split_by == "file"
    assigned = [name for split in SPLITS for name in corpus.files[split]]
    assert sorted(assigned) == sorted(files)  # no file twice, none left out
    for split in SPLITS:
        assert corpus.files[split], f"the {split} split has no file"
        assert stream(corpus, split) == b"".join(files[name] for name in corpus.files[split])
    total = sum(len(data) for data in files.values())
    assert sum(corpus.streams[split].numel() for split in SPLITS) == total
    assert corpus.describe()["bytes"] == {
        split: int(corpus.streams[split].numel()) for split in SPLITS
    }


def test_the_assignment_depends_on_neither_listing_order_nor_cwd(tmp_path, monkeypatch):
    forward = load_corpus(str(write_prose(tmp_path / "forward")))
    backward_dir = write_prose(tmp_path / "backward", order=list(reversed(range(len(NAMES)))))
    backward = load_corpus(str(backward_dir))
    assert backward.files == forward.files
    assert backward.fingerprint == forward.fingerprint

    # A file system that lists in another order (rglob reversed) changes nothing.
    real_rglob = Path.rglob
    monkeypatch.setattr(
        Path, "rglob", lambda self, pattern: reversed(list(real_rglob(self, pattern)))
    )
    shuffled = load_corpus(str(write_prose(tmp_path / "again")))
    assert shuffled.files == forward.files

    # A relative source read from two working directories.
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    from_parent = load_corpus("forward")
    monkeypatch.chdir(tmp_path / "forward")
    from_inside = load_corpus(".")
    assert from_parent.files == from_inside.files == forward.files
    assert from_parent.fingerprint == from_inside.fingerprint == forward.fingerprint


def test_files_are_taken_in_the_hash_order_of_their_names(prose_dir):
    """The documented rule, written out again: in the order of a hash of each file's name,
    a file goes to test while test holds under 5 % of the bytes (and would hold no more
    than 10 % with it), else the same for validation, else to train; each split's stream
    is its files in that order."""
    corpus = load_corpus(str(prose_dir))
    files = file_bytes(prose_dir)
    target = 0.05 * sum(len(data) for data in files.values())
    expected: dict[str, list[str]] = {split: [] for split in SPLITS}
    filled = {"test": 0, "validation": 0}
    for name in sorted(files, key=lambda n: hashlib.blake2b(n.encode(), digest_size=16).digest()):
        for split in ("test", "validation"):
            if filled[split] < target and filled[split] + len(files[name]) <= 2 * target:
                expected[split].append(name)
                filled[split] += len(files[name])
                break
        else:
            expected["train"].append(name)
    assert {split: list(names) for split, names in corpus.files.items()} == expected
    assert expected["test"] != sorted(expected["test"]) or expected["train"] != sorted(
        expected["train"]
    ), "the corpus should tell the hash order from the alphabet"


def test_a_single_file_is_split_into_spans_with_test_the_last_bytes(tmp_path):
    data = prose(99, 40_000)
    path = tmp_path / "book.txt"
    path.write_bytes(data)
    corpus = load_corpus(str(path))
    assert corpus.split_by == "span"
    held = int(0.05 * len(data))
    assert stream(corpus, "test") == data[-held:]
    assert stream(corpus, "validation") == data[-2 * held : -held]
    assert stream(corpus, "train") == data[: -2 * held]


def test_two_files_and_uneven_files_are_split_into_spans(tmp_path):
    two = write_prose(tmp_path / "two")
    for name in NAMES[2:]:
        (two / name).unlink()
    assert load_corpus(str(two)).split_by == "span"
    uneven = tmp_path / "uneven"
    uneven.mkdir()
    # Each file is more than twice a held-out split's share: no split can take one whole.
    for index, size in enumerate((30_000, 10_000, 10_000)):
        (uneven / f"{index}.txt").write_bytes(prose(index, size))
    corpus = load_corpus(str(uneven))
    assert corpus.split_by == "span"
    names = sorted(file_bytes(uneven), key=corpus_module._order)
    whole = b"".join(file_bytes(uneven)[name] for name in names)
    assert stream(corpus, "train") + stream(corpus, "validation") + stream(corpus, "test") == whole
    assert whole.endswith(stream(corpus, "test")) and len(stream(corpus, "test")) == 2500


# --- fingerprint ------------------------------------------------------------------
def test_two_copies_in_different_directories_have_one_fingerprint(tmp_path):
    one = load_corpus(str(write_prose(tmp_path / "one")))
    other = load_corpus(str(write_prose(tmp_path / "deeper" / "other")))
    assert one.fingerprint == other.fingerprint
    assert one.root != other.root


@pytest.mark.parametrize("change", ["one byte", "rename", "new file"])
def test_the_fingerprint_changes_with_any_change(prose_dir, change):
    before = load_corpus(str(prose_dir)).fingerprint
    victim = prose_dir / NAMES[4]
    if change == "one byte":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x20
        victim.write_bytes(bytes(data))
    elif change == "rename":
        victim.rename(victim.with_name(victim.stem + "b" + victim.suffix))  # same sorted place
    else:
        (prose_dir / "added.txt").write_bytes(b"a new file\n")
    assert load_corpus(str(prose_dir)).fingerprint != before


# --- sources ----------------------------------------------------------------------
def test_a_glob_a_directory_and_a_file_are_sources(tmp_path, prose_dir, monkeypatch):
    by_directory = load_corpus(str(prose_dir))
    by_glob = load_corpus(str(prose_dir / "part_*.txt"))
    assert by_glob.files == by_directory.files
    assert by_glob.fingerprint == by_directory.fingerprint
    monkeypatch.chdir(tmp_path)
    assert load_corpus("prose/*.txt").fingerprint == by_directory.fingerprint  # relative
    nested = tmp_path / "nested"
    (nested / "a" / "b").mkdir(parents=True)
    for index, name in enumerate(NAMES):
        folder = nested / "a" / "b" if index % 2 else nested
        (folder / name).write_bytes((prose_dir / name).read_bytes())
    recursive = load_corpus(str(nested / "**" / "*.txt"))
    listed = {name for split in SPLITS for name in recursive.files[split]}
    assert len(listed) == len(NAMES) and "a/b/part_01.txt" in listed
    single = load_corpus(str(prose_dir / NAMES[0]))
    assert single.files["train"] == (NAMES[0],) and single.split_by == "span"


def test_a_directory_leaves_out_hidden_files_and_pycache(prose_dir):
    (prose_dir / ".hidden.txt").write_bytes(prose(50, 3000))
    (prose_dir / ".git").mkdir()
    (prose_dir / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    (prose_dir / "__pycache__").mkdir()
    (prose_dir / "__pycache__" / "part_00.cpython-311.pyc").write_bytes(b"\x00" * 3000)
    (prose_dir / "sub" / "__pycache__").mkdir(parents=True)
    (prose_dir / "sub" / "__pycache__" / "x.pyc").write_bytes(b"\x01" * 3000)
    corpus = load_corpus(str(prose_dir))
    listed = {name for split in SPLITS for name in corpus.files[split]}
    assert listed == set(NAMES)


# --- errors -----------------------------------------------------------------------
def _refused(source: str) -> str:
    with pytest.raises(CorpusError) as caught:
        load_corpus(source)
    assert isinstance(caught.value, ConfigError)
    return str(caught.value)


def test_a_missing_path_is_named_with_what_to_give(tmp_path):
    missing = str(tmp_path / "nowhere" / "corpus.txt")
    message = _refused(missing)
    assert missing in message and "no such file or directory" in message
    assert "give a file, a directory, a glob" in message


def test_a_pattern_matching_nothing_is_named(tmp_path):
    pattern = str(tmp_path / "*.nothing")
    message = _refused(pattern)
    assert pattern in message and "matches no file" in message and "check it" in message


def test_an_empty_directory_and_empty_files_are_refused(tmp_path):
    empty = tmp_path / "empty"
    (empty / ".hidden_only").mkdir(parents=True)
    (empty / ".hidden_only" / "x.txt").write_bytes(b"not counted\n")
    message = _refused(str(empty))
    assert str(empty) in message and "holds no file" in message and "put text in it" in message
    blank = tmp_path / "blank"
    blank.mkdir()
    for name in NAMES[:4]:
        (blank / name).write_bytes(b"")
    message = _refused(str(blank))
    assert str(blank) in message and "are empty" in message and "give text" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_named(prose_dir):
    victim = prose_dir / NAMES[6]
    victim.chmod(0)
    try:
        message = _refused(str(prose_dir))
    finally:
        victim.chmod(0o644)
    assert str(victim) in message and "make it readable or leave it out" in message


def test_an_unreadable_file_is_named_whoever_runs_the_test(prose_dir, monkeypatch):
    """The same as above where the tests run as root (who reads a file of mode 000): the
    read itself refused."""
    victim = prose_dir / NAMES[6]
    real = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path.name == victim.name:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    message = _refused(str(prose_dir))
    assert str(victim) in message and "Permission denied" in message
    assert "make it readable or leave it out" in message


def test_a_corpus_too_small_for_eval_bytes_says_what_to_change(prose_dir):
    corpus = load_corpus(str(prose_dir))
    test_bytes = int(corpus.streams["test"].numel())
    with pytest.raises(CorpusError) as caught:
        task(prose_dir, eval_bytes=test_bytes)  # needs one byte more: the last label
    message = str(caught.value)
    assert isinstance(caught.value, ConfigError)
    assert str(prose_dir) in message and f"test split holds {test_bytes} bytes" in message
    assert f"eval_bytes {test_bytes}" in message and "lower seq_len and eval_bytes" in message
    task(prose_dir, eval_bytes=test_bytes - 1)  # fits


def test_a_corpus_too_small_for_seq_len_says_what_to_change(prose_dir):
    corpus = load_corpus(str(prose_dir))
    validation = int(corpus.streams["validation"].numel())
    with pytest.raises(CorpusError) as caught:
        task(prose_dir, seq_len=validation, eval_bytes=validation)
    message = str(caught.value)
    assert str(prose_dir) in message and "validation split" in message
    assert f"seq_len {validation}" in message and "give more text" in message


# --- the default corpus -----------------------------------------------------------
def test_the_stdlib_corpus_is_its_py_files_without_tests_or_installed_packages():
    corpus = load_corpus("stdlib")
    assert corpus.root == Path(sysconfig.get_paths()["stdlib"])
    names = [name for split in SPLITS for name in corpus.files[split]]
    assert len(names) == len(set(names)) > 500
    assert all(name.endswith(".py") for name in names)
    assert {"os.py", "json/decoder.py", "collections/__init__.py"} <= set(names)
    for name in names:
        folders = set(name.split("/")[:-1])
        assert not folders & {"test", "tests", "idle_test", "site-packages"}, name
    assert corpus.split_by == "file"
    assert all(corpus.files[split] for split in SPLITS)
    total = sum(corpus.streams[split].numel() for split in SPLITS)
    assert total > 5_000_000
    assert 0.03 < corpus.streams["test"].numel() / total < 0.1


# --- training windows -------------------------------------------------------------
def test_training_windows_come_only_from_training_files(tmp_path):
    directory = write_marked(tmp_path / "marked")
    lm = task(directory)
    corpus = lm.corpus
    assert corpus.split_by == "file"
    train_files = corpus.files["train"]
    allowed = set().union(*(marker_bytes(NAMES.index(name)) for name in train_files))
    held_out = set().union(
        *(marker_bytes(NAMES.index(n)) for s in ("validation", "test") for n in corpus.files[s])
    )
    data = lm.generate(256, seed=3)
    assert data.tokens.shape == data.labels.shape == (256, SEQ_LEN)
    assert torch.equal(data.tokens[:, 1:], data.labels[:, :-1])  # labels: the next byte
    train_stream = stream(corpus, "train")
    for tokens, labels in zip(data.tokens.tolist(), data.labels.tolist(), strict=True):
        window = bytes(tokens + labels[-1:])
        assert set(window) <= allowed and not set(window) & held_out
        assert window in train_stream
    train, test = lm.split(seed=3, num_train=64)
    assert set(train.tokens.unique().tolist()) <= allowed
    assert set(test.tokens.unique().tolist()) <= set().union(
        *(marker_bytes(NAMES.index(n)) for n in corpus.files["test"])
    )


def test_the_same_seed_draws_the_same_windows_and_another_seed_others(prose_dir):
    lm = task(prose_dir)
    first, _ = lm.split(seed=0, num_train=32)
    again, _ = task(prose_dir).split(seed=0, num_train=32)
    other, _ = lm.split(seed=1, num_train=32)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.labels, again.labels)
    assert not torch.equal(first.tokens, other.tokens)
    assert first.tokens.dtype == torch.int64 and int(first.tokens.max()) < 256


# --- held-out set and validation --------------------------------------------------
def test_every_length_dividing_eval_bytes_scores_the_same_bytes(prose_dir):
    lm = task(prose_dir)
    test_stream = lm.corpus.streams["test"].long()
    for length in (8, SEQ_LEN, 64, 256, EVAL_BYTES):
        windows = lm.held_out(length)
        assert windows.tokens.shape == (EVAL_BYTES // length, length)
        assert torch.equal(windows.tokens.flatten(), test_stream[:EVAL_BYTES])
        assert torch.equal(windows.labels.flatten(), test_stream[1 : EVAL_BYTES + 1])
    assert torch.equal(lm.split(seed=5)[1].labels, lm.held_out(SEQ_LEN).labels)


def test_validation_windows_come_from_the_validation_split(tmp_path):
    lm = task(write_marked(tmp_path / "marked"))
    allowed = set().union(
        *(marker_bytes(NAMES.index(name)) for name in lm.corpus.files["validation"])
    )
    windows = lm.validation(SEQ_LEN)
    assert len(windows) > 0 and set(windows.tokens.unique().tolist()) <= allowed


def test_an_eval_length_above_eval_bytes_is_refused_naming_it(prose_dir):
    lm = task(prose_dir)
    lm.check_eval_length(EVAL_BYTES)
    for length in (EVAL_BYTES + 1, 4 * EVAL_BYTES):
        with pytest.raises(ConfigError, match=rf"eval_bytes = {EVAL_BYTES}\).*raise the task's"):
            lm.check_eval_length(length)
        with pytest.raises(ConfigError, match="eval_bytes"):
            lm.held_out(length)
    with pytest.raises(ConfigError, match="positive integer"):
        lm.check_eval_length(0)


# --- baselines --------------------------------------------------------------------
def test_bigram_beats_unigram_on_a_repeated_pattern(tmp_path):
    directory = tmp_path / "pattern"
    directory.mkdir()
    for index in range(8):  # the pattern from another place in each: 8 distinct texts
        (directory / f"{index}.txt").write_bytes((b"0123456789abcdef" * 301)[index : index + 4800])
    baselines = task(directory, seq_len=8, eval_bytes=256).baselines(8)
    assert baselines["bigram"] < 0.2 < 3.8 < baselines["unigram"] < 4.2  # log2(16) = 4


def test_unigram_of_uniform_random_bytes_is_close_to_eight_bits(tmp_path):
    directory = tmp_path / "noise"
    directory.mkdir()
    generator = random.Random(0)
    for index in range(6):
        (directory / f"{index}.bin").write_bytes(generator.randbytes(40_000))
    baselines = task(directory, seq_len=8, eval_bytes=4096).baselines(8)
    assert math.isclose(baselines["unigram"], 8.0, abs_tol=0.05)
    assert baselines["bigram"] > baselines["unigram"]  # 65536 pairs: too few to learn any


def test_a_file_name_that_is_not_utf8_is_read_like_any_other(prose_dir):
    name = os.fsdecode(b"bad\xff.txt")
    (prose_dir / name).write_bytes(b"still text\n" * 200)
    corpus = load_corpus(str(prose_dir))
    assert name in {each for split in SPLITS for each in corpus.files[split]}


def test_a_pipe_is_not_called_missing(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(CorpusError, match="not a regular file or a directory"):
        load_corpus(str(pipe))


def test_baselines_score_the_bytes_each_length_scores(prose_dir):
    lm = task(prose_dir, seq_len=16, eval_bytes=500)
    unigram, _ = lm._ngram_log_probabilities
    for length in (16, 64, 100):  # 496, 448 and 500 bytes scored
        labels = lm.held_out(length).labels.flatten()
        expected = float(-unigram[labels].mean()) / math.log(2)
        assert lm.baselines(length)["unigram"] == pytest.approx(expected, abs=1e-12)
    assert lm.baselines(16)["unigram"] != lm.baselines(64)["unigram"]
