"""Language models through the runner (issue 32): one row per evaluation length, a length
a variant cannot run at recorded `unsupported`, kept weights scored again by `playground
eval`, a corpus that changed refused, and the spec keys checked. Every corpus here is
written by the test; models are tiny and train for a few steps."""

from __future__ import annotations

import io
import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from rich.console import Console

from playground.cli import main
from playground.errors import ConfigError, PlaygroundError
from playground.model.training import bits_per_byte
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry, configure
from playground.run import runner as runner_module
from playground.run.language import corpus_conflict
from playground.run.reevaluate import evaluate_again
from playground.run.runner import Runner
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec
from playground.run.store import ROWS, DamagedRun, RunStore
from playground.tasks.lm import ByteLanguageModelling
from tests.tasks.text_corpus import write_corpus

L = 16

LIMITED = """
    import dataclasses

    import playground

    Vanilla = playground.get_variant("vanilla")

    class Limited(Vanilla):
        name = "limited"
        summary = "vanilla that declares it runs up to 32 tokens"
        capabilities = dataclasses.replace(Vanilla.capabilities, max_seq_len=32)

    @playground.hookimpl
    def register_attention(register):
        register(Limited)
"""


def spec_text(
    corpus: Path, *, variants=("vanilla", "alibi"), extra: str = "", top: str = ""
) -> str:
    listed = "\n".join(f'[[variants]]\nname = "{name}"' for name in variants)
    return textwrap.dedent(
        f"""\
        name = "tiny_lm"
        measures = ["accuracy"]
        accuracy_workers = 1
        {top}
        {listed}

        [[tasks]]
        name = "lm"
        corpus = "{corpus}"
        seq_len = {L}
        eval_bytes = 512
        eval_lengths = [{2 * L}, {4 * L}]
        steps = 4
        batch_size = 4
        seeds = 2
        d_model = 16
        num_heads = 2
        num_layers = 1
        {extra}
        """
    )


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


@pytest.fixture(autouse=True)
def _no_gemm(monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)


@pytest.fixture
def registry(write_plugin) -> Registry:
    path = write_plugin("limited.py", LIMITED)
    return Registry.discover([path.parent], entry_points=False)


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus")


def run_spec(registry: Registry, tmp_path: Path, text: str) -> RunStore:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    spec = load_spec(str(path), registry)
    store = RunStore.create(tmp_path / "results", spec.name)
    runner = Runner(spec, registry, store, Console(file=io.StringIO()))
    runner.start()
    _, completed = runner.measure_pending()
    assert completed
    return store


def by_cell(store: RunStore) -> dict[str, dict]:
    return {row["cell"]: row for row in store.rows()}


def test_a_language_cell_is_a_row_per_evaluation_length(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus))
    rows = by_cell(store)
    label = next(iter(rows.values()))["task_label"]
    lengths = ("", f"|eval_len={2 * L}", f"|eval_len={4 * L}")
    assert set(rows) == {f"{v}|task={label}{n}" for v in ("vanilla", "alibi") for n in lengths}
    fingerprints = {row["corpus_fingerprint"] for row in rows.values()}
    assert len(fingerprints) == 1
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
        assert row["metric"] == "bits_per_byte" and row["train_length"] == L
        assert len(row["bits_per_byte_per_seed"]) == 2
        low, mean, high = (row[f"bits_per_byte_{k}"] for k in ("ci95_low", "mean", "ci95_high"))
        assert low <= mean <= high
        assert row["scored_bytes"] == 512
        assert row["unigram_bits_per_byte"] > row["bigram_bits_per_byte"] > 0
        assert row["tokens_per_s"] > 0 and row["samples"][0]["prompt"] == "def __init__(self"
        assert "evaluations" not in row
    assert {row["eval_length"] for row in rows.values()} == {L, 2 * L, 4 * L}


def test_a_sinusoidal_model_runs_beyond_its_table_and_nope_has_no_positions(registry):
    config = ModelConfig(256, 256, L, "vanilla", d_model=16, num_heads=2, num_layers=1, causal=True)
    model = TransformerClassifier(config, registry)
    assert model.positional_encoding is not None
    assert model.positional_encoding.table.shape[0] == L
    tokens = torch.randint(0, 256, (1, 8 * L))
    logits = model(tokens)
    assert logits.shape == (1, 8 * L, 256) and torch.isfinite(logits).all()
    # Positions beyond the table are the paper's formula, not a repeat of the table.
    short = model.positional_encoding(torch.zeros(1, L, 16))
    long = model.positional_encoding(torch.zeros(1, 2 * L, 16))
    assert torch.allclose(long[:, :L], short) and not torch.allclose(long[:, L:], short)
    nope = TransformerClassifier(
        ModelConfig(
            256,
            256,
            L,
            "vanilla",
            d_model=16,
            num_heads=2,
            num_layers=1,
            causal=True,
            positional_encoding="none",
        ),
        registry,
    )
    assert nope.positional_encoding is None


def test_a_length_the_variant_cannot_run_at_is_unsupported_for_that_length_alone(
    registry, tmp_path, corpus
):
    store = run_spec(registry, tmp_path, spec_text(corpus, variants=("limited",)))
    rows = {row["eval_length"]: row for row in store.rows()}
    assert rows[L]["status"] == rows[2 * L]["status"] == "ok"
    assert rows[4 * L]["status"] == "unsupported"
    assert "its limit is 32" in rows[4 * L]["error"]
    assert "bits_per_byte_mean" not in rows[4 * L]


def test_kept_weights_are_scored_again_at_new_lengths(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus, top="save_weights = true"))
    trained = by_cell(store)
    for row in trained.values():
        assert all(store.path(path).is_file() for path in row["weights"].values())
    assert evaluate_again(store.directory, registry, [8 * L, L], announce=lambda _: None) == 2
    assert evaluate_again(store.directory, registry, [8 * L], announce=lambda _: None) == 0
    new = [row for row in store.rows() if row["cell"] not in trained]
    assert {row["eval_length"] for row in new} == {8 * L} and len(new) == 2
    for row in new:
        task = ByteLanguageModelling(**row["task_options"])
        config = ModelConfig(
            **{k: v for k, v in row["model"].items() if k in ModelConfig.__dataclass_fields__}
        )
        values = []
        for seed in ("0", "1"):
            model = TransformerClassifier(config, registry)
            model.load_state_dict(torch.load(store.path(row["weights"][seed]), weights_only=True))
            values.append(bits_per_byte(model, task.held_out(8 * L)))
        assert row["bits_per_byte_per_seed"] == pytest.approx(values, abs=1e-9)


def test_the_eval_command_appends_rows_and_refuses_bad_lengths(registry, tmp_path, corpus, capsys):
    store = run_spec(registry, tmp_path, spec_text(corpus, top="save_weights = true"))
    before = len(store.rows())
    plugins = str(tmp_path / "plugins")
    args = ["eval", str(store.directory), "--plugins-dir", plugins, "--eval-lengths"]
    assert main([*args, f"{8 * L}"]) == 0
    assert len(store.rows()) == before + 2
    assert main([*args, "0,x"]) == 2
    assert "--eval-lengths takes comma-separated integers" in capsys.readouterr().err
    assert main([*args, "100000"]) == 2
    assert "eval_bytes" in capsys.readouterr().err


def test_a_run_that_kept_no_weights_says_how_to_keep_them(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus))
    with pytest.raises(PlaygroundError, match="save_weights = true"):
        evaluate_again(store.directory, registry, [8 * L], announce=lambda _: None)


def test_a_damaged_weights_file_is_named(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus, top="save_weights = true"))
    row = store.rows()[0]
    victim = store.path(row["weights"]["1"])
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(DamagedRun, match=victim.name):
        evaluate_again(store.directory, registry, [8 * L], announce=lambda _: None)


def test_a_changed_corpus_is_refused_by_eval_naming_both_fingerprints(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus, top="save_weights = true"))
    before = store.rows()[0]["corpus_fingerprint"]
    (corpus / "doc_00.txt").write_bytes(b"other text\n" * 300)
    after = ByteLanguageModelling(corpus=str(corpus), seq_len=L, eval_bytes=512).fingerprint
    with pytest.raises(ConfigError) as caught:
        evaluate_again(store.directory, registry, [8 * L], announce=lambda _: None)
    assert before[:12] in str(caught.value) and after[:12] in str(caught.value)


def test_a_cell_measured_on_another_corpus_is_not_reported_beside_the_others(
    registry, tmp_path, corpus
):
    store = run_spec(registry, tmp_path, spec_text(corpus))
    rows = store.path(ROWS)
    kept = [
        line
        for line in rows.read_text().splitlines()
        if not json.loads(line)["cell"].startswith("alibi")
    ]
    rows.write_text("\n".join(kept) + "\n")  # alibi's rows lost: a resume measures them again
    shutil.rmtree(corpus)
    write_corpus(corpus, first=40)  # other text under the same name
    spec = load_spec(str(store.path("spec.toml")), registry)
    runner = Runner(spec, registry, store, Console(file=io.StringIO()))
    runner.start()
    runner.measure_pending()
    alibi = [row for row in store.rows() if row["cell"].startswith("alibi")]
    assert alibi and all(row["status"] == "error" for row in alibi)
    assert all("different corpus" in row["error"] for row in alibi)
    assert all(isinstance(row["bits_per_byte_mean"], float) for row in alibi)  # kept


def test_corpus_conflict_keys_by_task_and_options_not_model_settings():
    known: dict[str, str] = {}
    row = {"task": "lm", "task_options": {"seq_len": 8}, "corpus_fingerprint": "a" * 40}
    assert corpus_conflict(row, known) is None
    nope = {**row, "task_label": "lm positional_encoding=none", "corpus_fingerprint": "b" * 40}
    assert "different corpus" in (corpus_conflict(nope, known) or "")
    other_task = {**row, "task_options": {"seq_len": 16}, "corpus_fingerprint": "b" * 40}
    assert corpus_conflict(other_task, known) is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('positional_encoding = "nope"', "'nope' is not one of auto, sinusoidal, none"),
        ("", r"tasks\[0\].eval_lengths: must be a non-empty list of positive integers"),
        ("", "eval_bytes"),
    ],
)
def test_the_language_keys_of_a_spec_are_checked(registry, tmp_path, corpus, extra, expected):
    text = spec_text(corpus, extra=extra)
    if "non-empty" in expected:
        text = text.replace(f"eval_lengths = [{2 * L}, {4 * L}]", "eval_lengths = [0, 1.5]")
    elif expected == "eval_bytes":
        text = text.replace(f"eval_lengths = [{2 * L}, {4 * L}]", "eval_lengths = [4096]")
    path = tmp_path / "spec.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=expected):
        load_spec(str(path), registry)


def test_eval_lengths_on_a_task_scored_by_accuracy_is_refused(registry, tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(
        'name = "x"\nmeasures = ["accuracy"]\n[[tasks]]\nname = "mqar"\neval_lengths = [128]\n'
    )
    with pytest.raises(SpecError, match=r"tasks\[0\].eval_lengths: task 'mqar'"):
        load_spec(str(path), registry)


def test_a_variant_sized_to_the_training_length_keeps_that_size_beyond_it(
    registry, tmp_path, corpus
):
    """Sigmoid attention fits b = -log n to the length it is built for (`fit_options`):
    evaluated at 4 × L, the trained model keeps the b of L, and its weights are scored as
    they were trained."""
    store = run_spec(
        registry, tmp_path, spec_text(corpus, variants=("sigmoid",), top="save_weights = true")
    )
    rows = {row["eval_length"]: row for row in store.rows()}
    assert {row["status"] for row in rows.values()} == {"ok"}
    assert rows[4 * L]["model"]["max_seq_len"] == L
    config = ModelConfig(
        **{k: v for k, v in rows[L]["model"].items() if k in ModelConfig.__dataclass_fields__}
    )
    model = TransformerClassifier(config, registry)
    assert all(attention.config.bias_length == L for attention in model.attentions)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("top", 'save_weights = "yes"'), "save_weights.*must be true or false"),
        (("extra", "curriculum = [{ seq_len = 8 }]"), r"tasks\[0\].curriculum: a language task"),
    ],
)
def test_save_weights_and_curricula_are_checked(registry, tmp_path, corpus, change, expected):
    where, text = change
    path = tmp_path / "spec.toml"
    path.write_text(spec_text(corpus, **{where: text}))
    with pytest.raises(SpecError, match=expected):
        load_spec(str(path), registry)


def test_save_weights_cannot_be_added_on_resume(registry, tmp_path, corpus, capsys):
    store = run_spec(registry, tmp_path, spec_text(corpus))
    assert main(["run", "--resume", str(store.directory), "--save-weights"]) == 2
    assert "drop --save-weights" in capsys.readouterr().err
