"""The passkey probe through the runner (issue 45 part 2): each evaluation length's row
carries exact match and key log-likelihood per depth over the seeds, a length past a
declared max_seq_len is `unsupported` with no probe of its own, and the report draws the
heatmap."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from playground.registry import Registry
from playground.report.plots import plot_run
from playground.run.passkey_scores import chance_log_likelihood
from tests.run.test_language import (  # noqa: F401 (fixtures)
    CAPPED_PLUGIN,
    _no_gemm,
    _reset_default_registry,
    run_spec,
)
from tests.tasks.text_corpus import write_corpus

L = 48
LIMIT = 2 * L


@pytest.fixture
def registry(write_plugin) -> Registry:
    plugin = CAPPED_PLUGIN.replace("max_seq_len=32", f"max_seq_len={LIMIT}")
    path = write_plugin("capped.py", plugin)
    return Registry.discover([path.parent], entry_points=False)


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus", files=10, size=3000)


def spec(corpus: Path) -> str:
    return textwrap.dedent(
        f"""\
        name = "passkey_tiny"
        measures = ["accuracy"]
        accuracy_workers = 1
        [[variants]]
        name = "vanilla"
        [[variants]]
        name = "capped"
        [[tasks]]
        name = "lm"
        corpus = "{corpus}"
        seq_len = {L}
        eval_bytes = 768
        eval_lengths = [{2 * L}, {4 * L}]
        passkey_fraction = 1.0
        passkey_depths = [0.0, 0.5, 1.0]
        passkey_trials = 4
        prompt = "the "
        sample_bytes = 4
        steps = 4
        batch_size = 4
        seeds = 2
        d_model = 16
        num_heads = 2
        num_layers = 1
        """
    )


def test_each_length_row_carries_the_probe_and_past_a_limit_none(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec(corpus))
    rows = {(row["variant"], row["eval_length"]): row for row in store.rows()}
    assert len(rows) == 6
    for (variant, length), row in rows.items():
        if variant == "capped" and length > LIMIT:
            assert row["status"] == "unsupported"
            assert f"sequences of {length} tokens (its limit is {LIMIT})" in row["error"]
            assert not any(key.startswith("passkey_") for key in row), "inherited from L"
            continue
        assert row["status"] == "ok", row.get("error")
        assert row["passkey_depths"] == [0.0, 0.5, 1.0]
        assert row["passkey_trials"] == 4
        per_seed = row["passkey_exact_per_seed"]
        assert len(per_seed) == 2 and all(len(each) == 3 for each in per_seed)
        assert row["passkey_exact"] == pytest.approx(
            [sum(d) / 2 for d in zip(*per_seed, strict=True)]
        )
        assert all(value <= 0 and math.isfinite(value) for value in row["passkey_log_likelihood"])
        assert row["passkey_chance_log_likelihood"] == chance_log_likelihood(5)
    # four steps teach no retrieval: no key is found anywhere
    assert all(v == 0 for row in rows.values() for v in row.get("passkey_exact", []))
    written = {path.stem for path in plot_run(store.directory, registry=registry)}
    assert {"lm_passkey", "lm_by_position", "lm_extrapolation"} <= written
