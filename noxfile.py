"""nox sessions: the tests, lint, one session per variant, the benchmark suite and its
regression gate, the main comparison and its figures.

    nox -l                                   every session
    nox                                      tests and lint (what CI checks)
    nox -t variants                          every plugin: contract suite, quick run, plots
    nox -s "variant(name='vanilla')"         one of them (a new plugins/NAME.py adds one)
    nox -s bench                             save a benchmark run to .benchmarks/: a baseline
                                             (commit first: bench_compare re-measures that commit)
    nox -s bench_compare                     fail on a confirmed slow-down or any memory growth
                                             (both fail, never pass, when nothing was measured;
                                             PLAYGROUND_BENCH_SEQ_LENS=256 sets their lengths)
    nox -s compare plots                     the main job (`playground compare`), its figures

Environment: every session runs in the environment that runs nox (`venv_backend="none"`),
the one where the README has you install torch and `pip install -e ".[dev]"`. PyTorch is a
multi-GB install, and the alternatives all pay for it again:
- a virtualenv with `--system-site-packages` sees the *base* interpreter's packages, not
  those of the virtualenv nox is installed in (the usual case), so torch is missing there
  and every new session (one per variant) would install it;
- `reuse_venv` keeps that cost to once per session, but there is one session per plugin;
- the uv backend links torch from uv's cache quickly, but needs uv, and still builds an
  environment per session.
With nothing to create or install, a session starts in the time nox takes to start: a
repeated `nox -s "variant(name='vanilla')"` started `playground check` 0.2-0.6 s after
launch, on 2 CPU cores shared with other jobs. What it gives up is isolation: sessions
run the installed (editable) checkout, which is the code a researcher is editing. Run
nox as `python -m nox` with that environment's python if nox is installed elsewhere.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

import nox
import nox.command

ROOT = Path(__file__).resolve().parent
PYTHON = sys.executable
PLAYGROUND = str(Path(PYTHON).parent / "playground")  # the console script users run

VARIANT_FILES = sorted(
    path.stem for path in (ROOT / "plugins").glob("*.py") if not path.name.startswith("_")
)
"""One session per plugin file; a scaffolded plugin's registered name is its file stem."""

BENCH_SEQ_LENS = os.environ.get("PLAYGROUND_BENCH_SEQ_LENS") or "512,1024,2048"
"""The bench sessions' lengths: $PLAYGROUND_BENCH_SEQ_LENS when set (the same variable the
suite reads, so one setting serves both), else real sizes. Save the baseline and compare
with the same lengths: the gates compare only the benchmarks both runs have."""
BENCH_TESTS = "tests/benchmarks/test_attention_benchmarks.py"
BENCH_STORAGE = ".benchmarks"
BENCH_CANDIDATE = "results/benchmarks/bench_compare.json"
TIME_REGRESSION_PERCENT = int(os.environ.get("PLAYGROUND_BENCH_FAIL_PERCENT", "30"))
"""bench_compare fails when a benchmark is more than this much slower on the working tree
than on the baseline's commit, timed in turns on both (playground/gates/time.py;
docs/results.md has the measurements behind the design)."""

nox.options.sessions = ["tests", "lint"]
ENVIRONMENT = {"venv_backend": "none"}


class _NoUvProbeNotice(logging.Filter):
    """Drops nox's "uv binary not found." notice. nox looks for uv before it creates any
    session's environment, whatever its backend (it lists which optional backends exist),
    and says so at info level when uv is absent: a line on every session, although no
    session here uses uv (`venv_backend="none"`). No nox option turns the probe off, so
    the one message is filtered; every other message of nox's, and any real use of uv,
    is untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "uv binary not found."


logging.getLogger("nox").addFilter(_NoUvProbeNotice())


def require_installed(session: nox.Session) -> None:
    """Fail early, saying what to do, when nox runs outside the project's environment."""
    missing = [name for name in ("torch", "playground") if importlib.util.find_spec(name) is None]
    if missing or not Path(PLAYGROUND).is_file():
        session.error(
            f"{', '.join(missing) or 'the playground command'} not installed for {PYTHON}. "
            f"Sessions run in the environment that runs nox: install torch and "
            f'`pip install -e ".[dev]"` there (README), or run `python -m nox` with the '
            f"python of the environment that has them."
        )


def newest_run(experiment_results: Path) -> Path | None:
    """The newest run directory in results/<experiment>/ (their names are timestamps)."""
    runs = sorted(path.parent for path in experiment_results.glob("*/results.jsonl"))
    return runs[-1] if runs else None


@nox.session(**ENVIRONMENT)
def tests(session: nox.Session) -> None:
    """The whole test suite (the README's command); benchmarks run as a smoke test."""
    require_installed(session)
    session.run(PYTHON, "-m", "pytest", "-q", *session.posargs)


@nox.session(**ENVIRONMENT)
def lint(session: nox.Session) -> None:
    """What .ci/run checks before the tests, with the settings in pyproject.toml: ruff's
    lint and formatting, the import contracts (lint-imports) and the type checker (mypy)."""
    tools = {name: Path(PYTHON).parent / name for name in ("ruff", "lint-imports", "mypy")}
    missing = [name for name, path in tools.items() if not path.is_file()]
    if missing:
        session.error(f'{", ".join(missing)} not installed for {PYTHON}: pip install -e ".[dev]"')
    session.run(str(tools["ruff"]), "check", ".")
    session.run(str(tools["ruff"]), "format", "--check", ".")
    session.run(str(tools["lint-imports"]))
    session.run(str(tools["mypy"]))


@nox.session(tags=["variants"], **ENVIRONMENT)
@nox.parametrize("name", VARIANT_FILES)
def variant(session: nox.Session, name: str) -> None:
    """One plugin: its contract suite, its quick benchmark, its figures and report.

    The quick spec runs on the variant alone and ends with the figures and report
    (results/variants/NAME/quick/<timestamp>/report.html).

    `-- --seq-lens 256,512` changes the benchmark's lengths."""
    require_installed(session)
    session.run(PLAYGROUND, "check", name)
    out = ROOT / "results" / "variants" / name
    session.run(PLAYGROUND, "run", "quick", "--variants", name, "--out", str(out), *session.posargs)


def _bench_command(*extra: str) -> list[str]:
    return [
        PYTHON,
        "-m",
        "pytest",
        BENCH_TESTS,
        # pyproject's addopts run pytest-xdist (`-n auto`), and pytest-benchmark disables
        # itself under xdist: every benchmark would run once, unmeasured, and nothing be
        # saved. `-n 0` keeps xdist's options valid and runs in this process.
        "-n",
        "0",
        "--bench-seq-lens",
        BENCH_SEQ_LENS,
        "--benchmark-enable",  # pyproject's addopts disable benchmarks (the smoke run)
        f"--benchmark-storage=file://{ROOT / BENCH_STORAGE}",
        *extra,
    ]


def _saved_runs() -> set[Path]:
    return set((ROOT / BENCH_STORAGE).rglob("*.json"))


@nox.session(tags=["bench"], **ENVIRONMENT)
def bench(session: nox.Session) -> None:
    """Save a benchmark run at real sizes to .benchmarks/: bench_compare's baseline.

    Fails unless it saved a run with measured benchmarks: a baseline that measured nothing
    would leave bench_compare nothing to compare."""
    require_installed(session)
    before = _saved_runs()
    session.run(*_bench_command("--benchmark-autosave", *session.posargs))
    saved = sorted(_saved_runs() - before)
    if not saved:
        session.error(
            f"nothing was saved to {BENCH_STORAGE}/: pytest-benchmark measured no benchmark "
            f"(its warnings above say why: benchmarks disabled, or every one skipped or "
            f"deselected). Run `nox -s bench` without `-n`, `--benchmark-disable` or a `-k` "
            f"that selects nothing"
        )
    session.run(PYTHON, "-m", "playground.gates.measured", "--role", "baseline", *map(str, saved))


@nox.session(tags=["bench"], **ENVIRONMENT)
def bench_compare(session: nox.Session) -> None:
    """Fail on a regression against the last saved run: slower, or more memory.

    The time gate (playground/gates/time.py) times every benchmark on the saved
    baseline's commit and on the working tree in alternating rounds (paired.py), and fails
    on one more than TIME_REGRESSION_PERCENT slower in two such measurements. The memory
    gate (playground/gates/memory.py) fails on any growth of peak memory. Both always run,
    each printing one line per regressed benchmark. Nothing is saved to .benchmarks/, so
    the baseline stays the one `nox -s bench` recorded."""
    require_installed(session)
    candidate = ROOT / BENCH_CANDIDATE
    candidate.parent.mkdir(parents=True, exist_ok=True)
    candidate.unlink(missing_ok=True)
    gates = {
        "time": [
            "-m",
            "playground.gates.time",
            BENCH_STORAGE,
            "--candidate",
            str(candidate),
            "--threshold-percent",
            str(TIME_REGRESSION_PERCENT),
        ],
        "memory": [
            "-m",
            "playground.gates.memory",
            BENCH_STORAGE,
            "--candidate",
            str(candidate),
        ],
    }
    try:
        session.run(*_bench_command(f"--benchmark-json={candidate}", *session.posargs))
    finally:  # each gate's verdict is wanted whatever the other says
        if candidate.is_file():
            failed = []
            for name, arguments in gates.items():
                try:
                    session.run(PYTHON, *arguments)
                except nox.command.CommandFailed:
                    failed.append(name)
            if failed:
                session.error(f"the {' and '.join(failed)} gate failed (see above)")
    if not candidate.is_file():  # never a pass without a comparison
        session.error(
            f"nothing was compared: pytest-benchmark wrote no candidate run to "
            f"{BENCH_CANDIDATE} (its warnings above say why: benchmarks disabled, or every "
            f"one skipped or deselected). Run `nox -s bench_compare` without `-n`, "
            f"`--benchmark-disable` or a `-k` that selects nothing"
        )


@nox.session(**ENVIRONMENT)
def compare(session: nox.Session) -> None:
    """The main job: `playground compare` (the quick spec over every variant)."""
    require_installed(session)
    session.run(PLAYGROUND, "compare", *session.posargs)


@nox.session(**ENVIRONMENT)
def plots(session: nox.Session) -> None:
    """Figures of the newest `playground compare` run and of the benchmark history."""
    require_installed(session)
    run_dir = newest_run(ROOT / "results" / "quick")
    if run_dir is None:
        session.warn("no run under results/quick/: run `nox -s compare` first")
    else:
        session.run(PLAYGROUND, "plot", str(run_dir))
    if any((ROOT / BENCH_STORAGE).rglob("*.json")):
        session.run(
            PYTHON,
            "-m",
            "playground.report.bench_history",
            BENCH_STORAGE,
            "--out",
            "results/benchmarks/bench_history.png",
        )
    else:
        session.warn("no saved benchmark runs in .benchmarks/: run `nox -s bench` first")
