"""Random score_mod / mask_mod pairs, fast path against reference (tests/kernels/
fuzz.py): a few hundred seeded cases on every run, more behind a flag,

    PLAYGROUND_FUZZ_CASES=10000 [PLAYGROUND_FUZZ_SEED=1] pytest tests/mods/test_fuzz.py

(or `python -m tests.mods.fuzz --cases 10000`), and proof that it catches a
lowering that computes a wrong bias and one that loses a gradient."""

from __future__ import annotations

import os

import pytest

from playground.kernels import native
from playground.mods import lowering as mod_program
from playground.mods.program import Builder
from tests.mods.fuzz import REQUIRED_FEATURES, fuzz, generate

CASES = int(os.environ.get("PLAYGROUND_FUZZ_CASES", "300"))
SEED = int(os.environ.get("PLAYGROUND_FUZZ_SEED", "0"))
needs_native = pytest.mark.skipif(
    not native.build_state().available, reason=f"native kernels: {native.build_state().reason}"
)


def test_random_mods_match_the_reference():
    report = fuzz(CASES, SEED)
    assert report.cases == CASES
    shown = "\n\n".join(report.mismatches[:5])
    assert not report.mismatches, f"{len(report.mismatches)} of {CASES} cases differ:\n{shown}"


def test_the_grammar_holds_every_class_of_mod_issue_42_found_wrong():
    """Keyword arguments, casts, large constants, a table read twice, ties, abs and sqrt
    at 0, attributes and per-batch state changed between calls: all among the cases run
    on every commit."""
    found = set().union(*(generate(number, SEED).features for number in range(CASES)))
    assert found >= REQUIRED_FEATURES, REQUIRED_FEATURES - found


@needs_native
def test_the_fuzzer_catches_a_lowering_that_computes_a_wrong_bias(monkeypatch):
    """score − t lowered as score + t: the outputs differ, and the report shows the mod."""
    monkeypatch.setattr(mod_program, "negate", lambda builder, slot: slot)
    report = fuzz(CASES, SEED, stop_at_first=True)
    assert report.mismatches, "a planted sign error went unnoticed"
    assert "def score_mod" in report.mismatches[0], report.mismatches[0]


@needs_native
def test_the_fuzzer_catches_a_lowering_that_loses_a_gradient(monkeypatch):
    """A table registered once per read again (issue 42's bug): the gradients, kept per
    tensor, lose a read's, and the fuzzer names the table's gradient."""

    def table_number_per_read(self, table):
        self.tables.append(table.detach().reshape(-1).float().contiguous())
        self.table_sources.append(table)
        return len(self.tables) - 1

    monkeypatch.setattr(Builder, "table_number", table_number_per_read)
    report = fuzz(CASES, SEED, stop_at_first=True)
    assert report.mismatches, "a planted gradient error went unnoticed"
    assert "gradient of table" in report.mismatches[0], report.mismatches[0]
