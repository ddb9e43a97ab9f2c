"""The README's regression workflow, run as written on a throwaway copy of the checkout:
commit, `nox -s bench` (the baseline), change a plugin, `nox -s bench_compare`. The
baseline must hold measured benchmarks, and a slow-down written into a plugin's fast path
must fail bench_compare, named in its output.

Kept cheap by the suite's own settings, read from the environment so that the README's
commands run unchanged: one variant (`PYTEST_ADDOPTS=-k vanilla`), one short length
(`PLAYGROUND_BENCH_SEQ_LENS`), one thread (`PLAYGROUND_BENCH_THREADS`), and the native
kernels off (vanilla does not use them; a build must not land in this test's time).

The slow-down: every other call of vanilla's fast path does all its work twice and
returns the mean of the two (equal) outputs, 1.5 times the work in all, whatever the load,
against the gate's default threshold of 30 %. The gate times the two codes in alternating
rounds, so a load shared with other tests meets both alike. Nothing here asserts a time:
only the gate's verdict.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from playground.report.bench_history import load_saved_runs

ROOT = Path(__file__).resolve().parents[2]
SEQ_LEN = 256
SLOWED = "vanilla"

WRITTEN_SLOWDOWN = '''    _calls = 0
    """Calls of the fast path so far, in this process (the written slow-down's count)."""

    def forward_fast(self, *arguments):
        # A written slow-down: every other call does its work twice, 1.5 times in all.
        once = self._forward_fast_once(*arguments)
        type(self)._calls += 1
        if type(self)._calls % 2:
            return once
        again = self._forward_fast_once(*arguments)
        return AttentionOutput((once.output + again.output) / 2, None)

    def _forward_fast_once(
'''


def readme_workflow() -> list[str]:
    """The README's two nox commands of "Benchmarks and regressions", as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Benchmarks and regressions", 1)[1].split("\n## ", 1)[0]
    commands = [
        line.split("#", 1)[0].strip()
        for line in section.splitlines()
        if re.match(r"nox -s bench(_compare)?\b", line)
    ]
    assert commands == ["nox -s bench", "nox -s bench_compare"], commands
    return commands


def copy_checkout(destination: Path) -> None:
    """The working tree (tracked files and new ones git does not ignore) in a new git
    repository with one commit: the README's "commit first"."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    git = ["git", "-C", str(destination), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "baseline"]):
        subprocess.run([*git, *command], check=True, capture_output=True)


def environment() -> dict[str, str]:
    """This environment, without pytest's variables (pytest-benchmark disables itself in
    an xdist worker, which it tells by PYTEST_XDIST_WORKER) and the gate's settings, with
    the suite's knobs set small."""
    keep = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTEST_", "PLAYGROUND_BENCH_"))
    }
    return {
        **keep,
        "PYTEST_ADDOPTS": f"-k {SLOWED} -p no:cacheprovider",
        "PLAYGROUND_BENCH_SEQ_LENS": str(SEQ_LEN),
        "PLAYGROUND_BENCH_THREADS": "1",
        "PLAYGROUND_NATIVE": "0",
    }


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A README command, with this interpreter's nox (`nox` is `python -m nox`)."""
    return subprocess.run(
        [sys.executable, "-m", *shlex.split(command)],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_readme_workflow_saves_a_measured_baseline_and_catches_a_slowdown(tmp_path):
    bench, bench_compare = readme_workflow()
    checkout = tmp_path / "checkout"
    copy_checkout(checkout)

    saved = run(bench, checkout)
    output = saved.stdout + saved.stderr
    assert saved.returncode == 0, output
    saved_runs = load_saved_runs(checkout / ".benchmarks")
    assert len(saved_runs) == 1, output  # nothing saved: pytest-benchmark was disabled
    baseline = saved_runs[0]
    measured = sorted(benchmark["name"] for benchmark in baseline.measured_benchmarks())
    assert measured == [
        f"test_attention[{SLOWED}-n{SEQ_LEN}-forward]",
        f"test_attention[{SLOWED}-n{SEQ_LEN}-forward_backward]",
    ], output
    assert baseline.clean_commit is not None  # committed: the gate can time it again
    assert "uv binary not found" not in output

    plugin = checkout / "plugins" / f"{SLOWED}.py"
    source = plugin.read_text()
    assert source.count("    def forward_fast(\n") == 1, "vanilla's fast path moved"
    plugin.write_text(source.replace("    def forward_fast(\n", WRITTEN_SLOWDOWN))

    compared = run(bench_compare, checkout)
    output = compared.stdout + compared.stderr
    assert compared.returncode != 0, output
    assert "time gate: FAILED" in output, output
    assert re.search(rf"SLOWER +test_attention\[{SLOWED}-n{SEQ_LEN}-forward", output), output
    assert "uv binary not found" not in output
