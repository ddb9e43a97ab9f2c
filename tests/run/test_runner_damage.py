"""Damaged run directories: every kind of damage is a one-line error naming the file, the
line and the way out (no traceback); nothing is appended after an invalid line; and
`playground repair` sets the damage aside, losing nothing, so that a resume finishes."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from playground.cli import main
from playground.registry import configure
from playground.run.store import REJECTED, DamagedRun, RunStore

TINY = """
    name = "tiny"
    seq_lens = [16]
    d_model = 32
    num_heads = 2
    measures = ["speed"]

    [timing]
    min_run_time = 0.01
"""


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished two-cell run (vanilla, n = 16, both passes), copied by each test."""
    root = tmp_path_factory.mktemp("finished")
    spec = root / "tiny.toml"
    spec.write_text(textwrap.dedent(TINY))
    assert main(["run", str(spec), "--variants", "vanilla", "--out", str(root / "r")]) == 0
    configure([])
    (run_dir,) = (root / "r" / "tiny").iterdir()
    return run_dir


@pytest.fixture
def run_dir(finished_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("spec.toml", "overrides.json", "env.json", "results.jsonl"):
        (copy / name).write_bytes((finished_run / name).read_bytes())
    return copy


def lines(run_dir: Path) -> list[bytes]:
    return (run_dir / "results.jsonl").read_bytes().splitlines(keepends=True)


def rewrite(run_dir: Path, *pieces: bytes) -> None:
    (run_dir / "results.jsonl").write_bytes(b"".join(pieces))


def garbage_mid_file(run_dir: Path) -> None:
    first, second = lines(run_dir)
    rewrite(run_dir, first, b"#&!garbage\n", second)


def invalid_last_line(run_dir: Path) -> None:
    first, _ = lines(run_dir)
    rewrite(run_dir, first, b'{"cell": "vanilla|n=16|forward_backward", "sta\n')


def non_object_line(run_dir: Path) -> None:
    first, _ = lines(run_dir)
    rewrite(run_dir, first, b"[1, 2, 3]\n")


def row_without_cell(run_dir: Path) -> None:
    first, second = lines(run_dir)
    row = json.loads(second)
    del row["cell"]
    rewrite(run_dir, first, json.dumps(row).encode() + b"\n")


def blank_lines(run_dir: Path) -> None:
    first, second = lines(run_dir)
    rewrite(run_dir, first, b"\n", b"   \n", second)


def undecodable_bytes(run_dir: Path) -> None:
    first, second = lines(run_dir)
    rewrite(run_dir, first, second[:20] + b"\xff\xfe" + second[20:])


def repeated_cell(run_dir: Path) -> None:
    first, second = lines(run_dir)
    rewrite(run_dir, first, second, first)


DAMAGED_LINES: dict[str, tuple[Callable[[Path], None], str]] = {
    "garbage mid-file": (garbage_mid_file, "line 2 is not JSON"),
    "complete but invalid last line": (invalid_last_line, "line 2 is not JSON"),
    "non-object line": (non_object_line, "line 2 is a JSON list, not an object"),
    "row without cell": (row_without_cell, "line 2 has no 'cell' string"),
    "blank lines": (blank_lines, "line 2 is blank (and 1 more bad lines)"),
    "undecodable bytes": (undecodable_bytes, "line 2 is not UTF-8 text"),
    "repeated cell": (repeated_cell, "line 3 repeats cell 'vanilla|n=16|forward' of line 1"),
}


@pytest.mark.parametrize("damage", DAMAGED_LINES, ids=str)
def test_a_damaged_results_file_is_one_line_naming_file_line_and_way_out(run_dir, capsys, damage):
    make, message = DAMAGED_LINES[damage]
    make(run_dir)
    before = (run_dir / "results.jsonl").read_bytes()
    assert main(["run", "--resume", str(run_dir)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err + out, err
    assert f"{run_dir / 'results.jsonl'} {message}" in err
    assert f"playground repair {run_dir}" in err
    assert (run_dir / "results.jsonl").read_bytes() == before  # nothing appended


@pytest.mark.parametrize("damage", DAMAGED_LINES, ids=str)
def test_repair_sets_the_bad_lines_aside_and_the_resume_finishes(run_dir, capsys, damage):
    make, _ = DAMAGED_LINES[damage]
    make(run_dir)
    damaged = (run_dir / "results.jsonl").read_bytes()
    assert main(["repair", str(run_dir)]) == 0
    assert "moved" in capsys.readouterr().out
    rejected = [json.loads(line) for line in (run_dir / REJECTED).read_text().splitlines()]
    assert rejected and all({"line", "reason", "text"} <= set(entry) for entry in rejected)
    for entry in rejected:  # byte for byte, nothing lost
        assert entry["text"].encode("utf-8", "surrogateescape") in damaged
    assert main(["run", "--resume", str(run_dir)]) == 0
    cells = [row["cell"] for row in RunStore(run_dir).rows()]
    assert sorted(cells) == ["vanilla|n=16|forward", "vanilla|n=16|forward_backward"]


def test_the_store_never_appends_after_an_invalid_line(run_dir):
    garbage_mid_file(run_dir)
    before = (run_dir / "results.jsonl").read_bytes()
    row = json.loads(lines(run_dir)[0])
    with pytest.raises(DamagedRun, match="line 2"):
        RunStore(run_dir).append({**row, "cell": "new"})
    assert (run_dir / "results.jsonl").read_bytes() == before


def test_a_last_line_cut_by_a_crash_is_moved_aside_not_lost(run_dir):
    first, second = lines(run_dir)
    rewrite(run_dir, first, second[:30])  # no newline: a write cut short
    store = RunStore(run_dir)
    assert [row["cell"] for row in store.rows()] == ["vanilla|n=16|forward"]
    store.append(json.loads(second))
    assert len(store.rows()) == 2
    (rejected,) = (run_dir / REJECTED).read_text().splitlines()
    assert json.loads(rejected)["text"] == second[:30].decode()


def test_a_whole_last_row_that_lost_its_newline_is_kept(run_dir):
    first, second = lines(run_dir)
    rewrite(run_dir, first, second.rstrip(b"\n"))
    store = RunStore(run_dir)
    assert len(store.rows()) == 2
    store.append({**json.loads(second), "cell": "third"})
    assert [row["cell"] for row in store.rows()][-1] == "third"


def truncated_env(run_dir: Path) -> None:
    text = (run_dir / "env.json").read_bytes()
    (run_dir / "env.json").write_bytes(text[: len(text) // 2])


def env_is_a_directory(run_dir: Path) -> None:
    (run_dir / "env.json").unlink()
    (run_dir / "env.json").mkdir()


def truncated_overrides(run_dir: Path) -> None:
    (run_dir / "overrides.json").write_text('{"variants": ["vani')


def results_is_a_directory(run_dir: Path) -> None:
    (run_dir / "results.jsonl").unlink()
    (run_dir / "results.jsonl").mkdir()


DAMAGED_FILES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "truncated env.json": (truncated_env, "env.json", "is not valid JSON"),
    "env.json is a directory": (env_is_a_directory, "env.json", "is a directory, not a file"),
    "truncated overrides.json": (truncated_overrides, "overrides.json", "is not valid JSON"),
    "results.jsonl is a directory": (
        results_is_a_directory,
        "results.jsonl",
        "is a directory, not a file",
    ),
}


@pytest.mark.parametrize(
    ("damage", "command"),
    [
        *((damage, "resume") for damage in DAMAGED_FILES),
        *((damage, "plot") for damage in DAMAGED_FILES if "overrides" not in damage),
    ],
)
def test_a_damaged_file_is_one_line_naming_it(run_dir, capsys, damage, command):
    make, name, message = DAMAGED_FILES[damage]
    make(run_dir)
    argv = ["run", "--resume", str(run_dir)] if command == "resume" else ["plot", str(run_dir)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err + out, err
    assert f"{run_dir / name} {message}" in err and "playground repair" in err


@pytest.mark.parametrize("damage", [d for d in DAMAGED_FILES if "overrides" not in d], ids=str)
def test_repair_renames_a_damaged_file_and_the_resume_runs(run_dir, capsys, damage):
    make, name, _ = DAMAGED_FILES[damage]
    make(run_dir)
    assert main(["repair", str(run_dir)]) == 0
    assert f"moved {run_dir / name}" in capsys.readouterr().out
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert len(RunStore(run_dir).rows()) == 2
    assert json.loads((run_dir / "env.json").read_text())["gemm_flops_per_s"] > 0


def test_repair_of_lost_overrides_says_so_and_keeps_them(run_dir, capsys):
    truncated_overrides(run_dir)
    with pytest.raises(DamagedRun, match="a resume then runs the whole spec"):
        RunStore(run_dir).read_json("overrides.json")
    assert main(["repair", str(run_dir)]) == 0
    assert (run_dir / "overrides.json.rejected").read_text() == '{"variants": ["vani'


def test_a_spec_that_is_a_directory_is_a_clear_error(run_dir, capsys):
    (run_dir / "spec.toml").unlink()
    (run_dir / "spec.toml").mkdir()
    assert main(["run", "--resume", str(run_dir)]) == 2
    assert "spec.toml is a directory, not the run's spec file" in capsys.readouterr().err


def test_repair_of_a_sound_run_changes_nothing(run_dir, capsys):
    before = (run_dir / "results.jsonl").read_bytes()
    assert main(["repair", str(run_dir)]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert (run_dir / "results.jsonl").read_bytes() == before
    assert not (run_dir / REJECTED).exists()
