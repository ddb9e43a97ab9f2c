"""The README's "Write a new variant" story, end to end, through the real console script:
`playground new` → `check` → `list` → `run`, in a throwaway copy of the checkout so the
scaffold lands in that copy's plugins/ exactly as it would in yours."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT_PARTS = ("playground", "plugins", "experiments", "pyproject.toml")


def _console_script() -> Path:
    script = Path(sys.executable).parent / "playground"
    if not script.is_file():
        pytest.skip(f"no `playground` console script beside {sys.executable}: pip install -e .")
    return script


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the parts of the checkout that `playground` reads."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    for part in CHECKOUT_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, copy / part)
    return copy


@pytest.mark.slow
def test_new_variant_story(checkout: Path) -> None:
    """The commands of the README's walkthrough, exactly, in this order."""
    script = _console_script()
    # The copy's package shadows the editable install, so bundled_dir("plugins") is the
    # copy's plugins/; no other plugin source may leak in.
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("PLAYGROUND_PLUGINS_PATH", None)

    def playground(*argv: str) -> str:
        completed = subprocess.run(
            [str(script), *argv], cwd=checkout, env=env, capture_output=True, text=True
        )
        assert completed.returncode == 0, (
            f"playground {' '.join(argv)} exited {completed.returncode}\n"
            f"{completed.stdout}\n{completed.stderr}"
        )
        return completed.stdout

    out = playground("new", "myattn")
    assert (checkout / "plugins" / "myattn.py").is_file()
    assert not (ROOT / "plugins" / "myattn.py").exists()
    assert "playground check myattn" in out and "nox -s \"variant(name='myattn')\"" in out

    out = playground("check", "myattn")
    assert " 0 failed" in out and " passed" in out

    out = playground("list")
    assert "myattn" in out and "plugins/myattn.py" in out

    playground("run", "quick", "--variants", "myattn", "--seq-lens", "64")
    (run_dir,) = (checkout / "results" / "quick").iterdir()
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    all_rows = [json.loads(line) for line in lines]
    cost_rows = [row for row in all_rows if "pass" in row]
    # The spec's baseline runs beside it (issue 42), so the speed-ups have a reference.
    assert {(row["variant"], row["pass"], row["status"]) for row in cost_rows} == {
        (variant, pass_name, "ok")
        for variant in ("vanilla", "myattn")
        for pass_name in ("forward", "forward_backward")
    }
    with (run_dir / "summary.csv").open() as file:
        summary = list(csv.DictReader(file))
    speedups = [line["speedup_vs_baseline"] for line in summary if line["label"] == "myattn"]
    assert speedups and all(float(value) > 0 for value in speedups)
    rows = [row for row in cost_rows if row["variant"] == "myattn"]
    # ...and the quick spec's short accuracy tasks trained it too: the positional one and
    # the recall one, which the scaffold (exact attention) solves as vanilla does
    accuracy = {
        row["task"]: row for row in all_rows if "task" in row and row["variant"] == "myattn"
    }
    assert set(accuracy) == {"lookback", "mqar"}
    assert all(row["status"] == "ok" for row in accuracy.values())
    assert accuracy["lookback"]["accuracy_mean"] > accuracy["lookback"]["chance"]
    assert accuracy["mqar"]["accuracy_mean"] >= 0.95
    assert all(row["time_ms"] > 0 and row["peak_memory_bytes"] > 0 for row in rows)
    # The scaffold is exact attention, so its fidelity to exact attention is exact.
    (forward,) = (row for row in rows if row["pass"] == "forward")
    assert forward["fidelity_rel_error"] < 1e-5 and forward["fidelity_local_rel_error"] < 1e-5
