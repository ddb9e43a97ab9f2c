"""A corpus never holds one text in two splits (issue 42, point 10): a glob through a link
loop reads each file once, as the directory does; a file reached by two names is read
once; files with identical text share a split; a span-split corpus reads a repeated text
once; and a split that would share a file or a text is refused."""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path

import pytest

from playground.tasks.lm import corpus as corpus_module
from playground.tasks.lm.corpus import SPLITS, CorpusError, check_disjoint, load_corpus
from tests.tasks.text_corpus import text, write_corpus

HELD_OUT = ("validation", "test")


def texts_by_split(corpus) -> dict[str, set[bytes]]:
    return {
        split: {(corpus.root / name).read_bytes() for name in corpus.files[split]}
        for split in SPLITS
    }


def assert_no_text_in_two_splits(corpus) -> None:
    texts = texts_by_split(corpus)
    for held_out in HELD_OUT:
        assert not texts["train"] & texts[held_out], f"train and {held_out} share a text"
    assert not texts["validation"] & texts["test"]


def test_a_glob_through_a_link_loop_reads_each_file_once_as_the_directory_does(tmp_path):
    """The issue's case: 12 texts and a link back up the tree; glob.glob followed the loop
    until the path was too long (492 files), and texts landed in training and held out."""
    tree = write_corpus(tmp_path / "tree", files=12)
    (tree / "sub").mkdir()
    (tree / "sub" / "up").symlink_to("..")
    pattern = str(tree / "**" / "*.txt")
    assert len(glob.glob(pattern, recursive=True)) > 400  # what the corpus used to read
    by_glob = load_corpus(pattern)
    by_directory = load_corpus(str(tree))
    listed = [name for split in SPLITS for name in by_glob.files[split]]
    assert sorted(listed) == sorted(f"doc_{index:02d}.txt" for index in range(12))
    assert by_glob.files == by_directory.files
    assert by_glob.fingerprint == by_directory.fingerprint
    assert sum(by_glob.describe()["bytes"].values()) == sum(
        path.stat().st_size for path in tree.glob("*.txt")
    )
    assert_no_text_in_two_splits(by_glob)


def test_two_link_loops_are_listed_once_each_not_for_ever(tmp_path, monkeypatch):
    """Two links back up the tree make glob's walk 2^40 paths long: the corpus lists each
    directory once."""
    tree = write_corpus(tmp_path / "tree", files=6)
    (tree / "a").mkdir()
    (tree / "a" / "up").symlink_to("..")
    (tree / "b").mkdir()
    (tree / "b" / "up").symlink_to("..")
    listings = []
    real_scandir = os.scandir

    def scandir(path):
        listings.append(path)
        if len(listings) > 100:
            raise RuntimeError("more than 100 directory listings for a tree of 3 directories")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    files = corpus_module.find_files(str(tree / "**" / "*.txt"))[1]
    assert sorted(path.name for path in files) == [f"doc_{index:02d}.txt" for index in range(6)]
    assert len(listings) <= 3


def test_a_linked_directory_outside_the_tree_is_read_under_its_link(tmp_path):
    """A link is followed when it leads somewhere not yet read (as glob follows it)."""
    outside = write_corpus(tmp_path / "outside", files=3, first=20)
    tree = write_corpus(tmp_path / "tree", files=6)
    (tree / "more").symlink_to(outside)
    files = corpus_module.find_files(str(tree / "**" / "*.txt"))[1]
    assert sorted(str(path.relative_to(tree)) for path in files) == sorted(
        [f"doc_{index:02d}.txt" for index in range(6)]
        + [f"more/doc_{index:02d}.txt" for index in range(20, 23)]
    )


def test_a_file_reached_by_two_names_is_read_once(tmp_path):
    """A symbolic and a hard link in a directory name a file the corpus already reads."""
    tree = write_corpus(tmp_path / "tree", files=12)
    (tree / "alias.txt").symlink_to(tree / "doc_03.txt")
    os.link(tree / "doc_05.txt", tree / "hard.txt")
    corpus = load_corpus(str(tree))
    listed = sorted(name for split in SPLITS for name in corpus.files[split])
    assert listed == [f"doc_{index:02d}.txt" for index in range(12)]


def test_identical_texts_share_a_split(tmp_path):
    """A copy of every file under another name: each text and its copy go to one split."""
    tree = write_corpus(tmp_path / "tree", files=12)
    for index in range(12):
        (tree / f"copy_{index:02d}.txt").write_bytes((tree / f"doc_{index:02d}.txt").read_bytes())
    corpus = load_corpus(str(tree))
    assert corpus.split_by == "file"
    assert all(corpus.files[split] for split in SPLITS)
    for index in range(12):
        splits = {
            split
            for split in SPLITS
            for name in (f"doc_{index:02d}.txt", f"copy_{index:02d}.txt")
            if name in corpus.files[split]
        }
        assert len(splits) == 1, f"doc_{index:02d} and its copy are in {sorted(splits)}"
    assert_no_text_in_two_splits(corpus)


def test_copies_the_first_rule_kept_together_keep_the_fingerprint(tmp_path):
    """Where the first rule already put identical texts in one split (the standard library
    has two such pairs, in training), the split and the fingerprint stay what they were:
    the documented hash of names and bytes, with no mark."""
    tree = write_corpus(tmp_path / "tree", files=12)
    plain = load_corpus(str(tree))
    kept = plain.files["train"][0]
    (tree / "zz_copy.txt").write_bytes((tree / kept).read_bytes())
    corpus = load_corpus(str(tree))
    assert "zz_copy.txt" in corpus.files["train"]
    digest = hashlib.blake2b(corpus_module.SPLIT_RULE.encode(), digest_size=20)
    for path in sorted(tree.iterdir()):
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    assert corpus.fingerprint == digest.hexdigest()
    assert {split: names for split, names in corpus.files.items() if split != "train"} == {
        split: names for split, names in plain.files.items() if split != "train"
    }


def test_a_span_split_corpus_reads_a_repeated_text_once(tmp_path):
    """Two identical files split into spans: the test span was the end of the second copy,
    which the training span held as the end of the first."""
    tree = tmp_path / "tree"
    tree.mkdir()
    data = text(5, 40_000)
    (tree / "a.txt").write_bytes(data)
    (tree / "b.txt").write_bytes(data)
    corpus = load_corpus(str(tree))
    assert corpus.split_by == "span"
    train = bytes(corpus.streams["train"].tolist())
    test = bytes(corpus.streams["test"].tolist())
    assert test not in train
    assert train + bytes(corpus.streams["validation"].tolist()) + test == data
    assert len(corpus.files["train"]) == 1


@pytest.mark.parametrize("shared", ["file", "text"])
def test_a_split_that_shares_a_file_or_a_text_is_refused(shared):
    files = {"train": ("a.txt", "b.txt"), "validation": ("c.txt",), "test": ("d.txt",)}
    texts: dict[str, bytes | None] = {f"{name}.txt": name.encode() for name in "abcde"}
    if shared == "file":
        files["test"] = ("d.txt", "a.txt")
    else:
        texts["d.txt"] = texts["b.txt"]
    with pytest.raises(CorpusError, match="the train and test splits share") as caught:
        check_disjoint("corpus", files, texts)
    assert ("'a.txt'" if shared == "file" else "'b.txt' and 'd.txt'") in str(caught.value)
    check_disjoint("corpus", {**files, "test": ("e.txt",)}, {**texts, "d.txt": b"d"})


@pytest.mark.parametrize(
    "pattern",
    ["*.txt", "**/*.txt", "**", "sub/*.txt", "*/*.txt", "**/.hidden/*.txt", ".*", "s*/**/x*"],
)
def test_a_glob_without_links_matches_what_glob_matches(tmp_path, monkeypatch, pattern):
    """The corpus's own walk keeps glob's rules: `**` spans directories but not hidden
    ones, a wildcard does not match a leading dot, a literal part does."""
    for relative in (
        "a.txt",
        ".b.txt",
        "sub/c.txt",
        "sub/deep/xd.txt",
        "sub/.hidden/e.txt",
        ".hidden/f.txt",
        "other/g.md",
    ):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(relative.encode())
    monkeypatch.chdir(tmp_path)
    expected = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    assert sorted(corpus_module._expand(pattern)) == expected
    absolute = str(tmp_path / pattern)
    assert sorted(corpus_module._expand(absolute)) == [tmp_path / path for path in expected]
