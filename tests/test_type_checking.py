"""What `python -m mypy` (.ci/run, pre-commit, `nox -s lint`) checks, as mypy itself reads
pyproject.toml: every module of the package and every bundled plugin, function bodies
included, and the core under the flags of `--strict`. A module that falls out of the
check (a new folder, a plugin mypy cannot name) fails here instead of going unchecked."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
from mypy import api, config_parser, find_sources
from mypy.options import Options

ROOT = Path(__file__).resolve().parents[1]

CORE = (
    "playground.config",
    "playground.contract",
    "playground.errors",
    "playground.hookspecs",
    "playground.registry",
    "playground.heads",
    "playground.masks",
    "playground.decoding",
    "playground.model",
    "playground.model.transformer",
    "playground.tasks",
    "playground.tasks.mqar",
)
STRICT_FLAGS = {
    "disallow_any_generics": True,
    "disallow_subclassing_any": True,
    "disallow_untyped_calls": True,
    "disallow_untyped_defs": True,
    "disallow_incomplete_defs": True,
    "check_untyped_defs": True,
    "disallow_untyped_decorators": True,
    "warn_return_any": True,
    "warn_redundant_casts": True,
    "warn_unused_ignores": True,
    "implicit_reexport": False,  # --no-implicit-reexport
    "strict_equality": True,
    "extra_checks": True,
}
"""`mypy --strict`'s per-module flags, every one."""


@pytest.fixture
def options(monkeypatch: pytest.MonkeyPatch) -> Options:
    monkeypatch.chdir(ROOT)  # `files` and the package bases are relative to the root
    parsed = Options()
    config_parser.parse_config_file(
        parsed, lambda: None, "pyproject.toml", io.StringIO(), io.StringIO()
    )
    return parsed


def checked_modules(options: Options) -> set[str]:
    return {source.module for source in find_sources.create_source_list(options.files, options)}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_mypy_checks_every_module_and_every_plugin(options):
    expected = {module_name(path) for path in (ROOT / "playground").rglob("*.py")}
    expected |= {module_name(path) for path in (ROOT / "plugins").glob("*.py")}
    missing = expected - checked_modules(options)
    assert not missing, f"outside mypy's [tool.mypy] files: {sorted(missing)}"


def test_function_bodies_are_checked_everywhere(options):
    unchecked = {
        module
        for module in checked_modules(options)
        if not options.clone_for_module(module).check_untyped_defs
    }
    assert unchecked == set()


@pytest.mark.parametrize("module", CORE)
def test_the_core_is_held_to_the_strict_flags(options, module):
    per_module = options.clone_for_module(module)
    off = [flag for flag, value in STRICT_FLAGS.items() if getattr(per_module, flag) != value]
    assert off == []


@pytest.mark.parametrize(("key", "status"), [("time_ms", 0), ("time_mss", 1)])
def test_a_misspelt_row_field_is_a_type_error(tmp_path, monkeypatch, key, status):
    """Rows are typed (playground/run/row_schema.py): a reader's misspelt key fails."""
    monkeypatch.chdir(ROOT)
    reader = tmp_path / "reader.py"
    reader.write_text(
        textwrap.dedent(
            f"""\
            from playground.run.row_schema import Row


            def time_of(row: Row) -> float | None:
                return row["{key}"]
            """
        )
    )
    checked = [str(reader), "playground/run/row_schema.py"]
    flags = ["--follow-imports=skip", "--cache-dir=/dev/null", "--no-error-summary"]
    report, _, exit_status = api.run([*flags, *checked])
    assert exit_status == status, report
    if status:
        assert f'TypedDict "Row" has no key "{key}"' in report
