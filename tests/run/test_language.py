"""Language models through the runner (issue 32), on a corpus the test writes and models of
one layer, 16 wide, trained for a few steps: one row per (setup, evaluation length), a
length a variant declares it cannot run at recorded `unsupported` for that length alone,
positions beyond the trained table, weights kept and scored again at new lengths, damaged
or missing weights, a corpus that changed refused, and the spec keys checked.

(tests/run/test_language_runs.py covers much of this too; each test here was seen to fail
on a deliberately broken copy of the code: see the report of the session that wrote it.)"""

from __future__ import annotations

import dataclasses
import io
import json
import math
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
from playground.run.language_scores import corpus_conflict, eval_cell_id
from playground.run.reevaluate import evaluate_again
from playground.run.runner import Runner
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec
from playground.run.store import ROWS, DamagedRun, RunStore
from playground.tasks.lm import ByteLanguageModelling
from tests.tasks.text_corpus import write_corpus

L = 16
LIMIT = 2 * L
EVAL_BYTES = 512

CAPPED_PLUGIN = f"""
    import dataclasses

    import playground

    Vanilla = playground.get_variant("vanilla")


    class Capped(Vanilla):
        name = "capped"
        summary = "exact causal attention that declares a limit of {LIMIT} tokens"
        capabilities = dataclasses.replace(
            Vanilla.capabilities,
            max_seq_len={LIMIT},
            max_seq_len_hint="its table of positions stops at {LIMIT}",
        )


    @playground.hookimpl
    def register_attention(register):
        register(Capped)
"""


def spec_text(
    corpus: Path,
    variants: tuple[str, ...] = ("vanilla", "alibi"),
    *,
    seeds: int = 2,
    steps: int = 5,
    eval_lengths: str = f"[{2 * L}, {4 * L}]",
    table: str = "",
    top: str = "",
) -> str:
    listed = "\n".join(f'[[variants]]\nname = "{name}"' for name in variants)
    return textwrap.dedent(
        f"""\
        name = "lm_tiny"
        measures = ["accuracy"]
        accuracy_workers = 1
        {top}
        {listed}

        [[tasks]]
        name = "lm"
        corpus = "{corpus}"
        seq_len = {L}
        eval_bytes = {EVAL_BYTES}
        sample_bytes = 8
        prompt = "the "
        eval_lengths = {eval_lengths}
        steps = {steps}
        batch_size = 4
        seeds = {seeds}
        d_model = 16
        num_heads = 2
        num_layers = 1
        {table}
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
    path = write_plugin("capped.py", CAPPED_PLUGIN)
    return Registry.discover([path.parent], entry_points=False)


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus", files=10, size=3000)


def quiet() -> Console:
    return Console(file=io.StringIO())


def run_spec(registry: Registry, directory: Path, text: str) -> RunStore:
    path = directory / "spec.toml"
    path.write_text(text)
    spec = load_spec(str(path), registry)
    store = RunStore.create(directory / "results", spec.name)
    runner = Runner(spec, registry, store, quiet())
    runner.start()
    _, finished = runner.measure_pending()
    assert finished
    return store


def resume_runner(registry: Registry, store: RunStore) -> Runner:
    spec = load_spec(str(store.path("spec.toml")), registry)
    runner = Runner(spec, registry, store, quiet())
    runner.start()
    return runner


def evaluate(store: RunStore, registry: Registry, lengths: list[int]) -> int:
    return evaluate_again(store.directory, registry, lengths, announce=lambda _: None)


def model_of(row: dict, registry: Registry, seed: str, store: RunStore) -> TransformerClassifier:
    fields = {field.name for field in dataclasses.fields(ModelConfig)}
    config = ModelConfig(**{k: v for k, v in row["model"].items() if k in fields})
    model = TransformerClassifier(config, registry)
    state = torch.load(store.path(row["weights"][seed]), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model


def drop_rows(store: RunStore, prefix: str) -> None:
    """Lose every row of the cells whose id starts with `prefix` (a resume measures them
    again)."""
    path = store.path(ROWS)
    kept = [
        line
        for line in path.read_text().splitlines()
        if not json.loads(line)["cell"].startswith(prefix)
    ]
    path.write_text("".join(line + "\n" for line in kept))


# --- rows per length ----------------------------------------------------------------
def test_a_row_per_setup_and_evaluation_length(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus))
    rows = store.rows()
    assert len(rows) == 2 * 3
    label = rows[0]["task_label"]
    expected = {
        f"{variant}|task={label}{suffix}"
        for variant in ("vanilla", "alibi")
        for suffix in ("", f"|eval_len={2 * L}", f"|eval_len={4 * L}")
    }
    assert {row["cell"] for row in rows} == expected
    assert len({row["corpus_fingerprint"] for row in rows}) == 1
    assert (
        rows[0]["corpus_fingerprint"]
        == ByteLanguageModelling(corpus=str(corpus), seq_len=L, eval_bytes=EVAL_BYTES).fingerprint
    )
    for row in rows:
        where = row["cell"]
        assert row["status"] == "ok", (where, row.get("error"))
        assert row["metric"] == "bits_per_byte" and row["train_length"] == L, where
        length = row["eval_length"]
        assert row["cell"].endswith("" if length == L else f"|eval_len={length}")
        assert len(row["bits_per_byte_per_seed"]) == 2
        assert row["bits_per_byte_ci95_low"] <= row["bits_per_byte_mean"]
        assert row["bits_per_byte_mean"] <= row["bits_per_byte_ci95_high"]
        assert 0 < row["bits_per_byte_mean"] < 9  # a few steps from log2(256) = 8
        assert row["scored_bytes"] == EVAL_BYTES
        # one bucket of 64 positions holds every position of these short windows
        assert row["position_bucket"] == 64
        assert row["bits_per_byte_by_position"] == pytest.approx([row["bits_per_byte_mean"]])
        assert 0 < row["bigram_bits_per_byte"] < row["unigram_bits_per_byte"] < 8
        assert row["tokens_per_s"] > 0
        assert [sample["seed"] for sample in row["samples"]] == [0, 1]
        assert all(sample["prompt"] == "the " for sample in row["samples"])
        assert all(isinstance(sample["continuation"], str) for sample in row["samples"])
        assert "evaluations" not in row
    # A finished run has nothing left to resume, and its rows read back as written.
    assert resume_runner(registry, store).pending() == []
    assert RunStore.existing(store.directory).rows() == rows


def test_the_lengths_score_one_model_not_one_model_per_length(registry, tmp_path, corpus):
    """The rows at 2L and 4L are the training-length model scored on longer windows: with
    its weights kept, each length's bits per byte is recomputed from the one state dict."""
    store = run_spec(
        registry,
        tmp_path,
        spec_text(corpus, ("vanilla",), seeds=1, top="save_weights = true"),
    )
    rows = {row["eval_length"]: row for row in store.rows()}
    task = ByteLanguageModelling(corpus=str(corpus), seq_len=L, eval_bytes=EVAL_BYTES)
    model = model_of(rows[L], registry, "0", store)
    for length, row in rows.items():
        direct = bits_per_byte(model, task.held_out(length))
        assert row["bits_per_byte_per_seed"] == pytest.approx([direct], abs=1e-9), length
        assert row["weights"] == rows[L]["weights"]


# --- positions beyond the trained length -------------------------------------------
def test_sinusoids_beyond_the_table_and_nope_without_positions(registry, tmp_path, corpus):
    store = run_spec(
        registry,
        tmp_path,
        spec_text(corpus, ("vanilla",), seeds=1, eval_lengths=f"[{8 * L}]")
        + textwrap.dedent(
            f"""
            [[tasks]]
            name = "lm"
            corpus = "{corpus}"
            seq_len = {L}
            eval_bytes = {EVAL_BYTES}
            eval_lengths = [{8 * L}]
            positional_encoding = "none"
            steps = 3
            batch_size = 4
            seeds = 1
            d_model = 16
            num_heads = 2
            num_layers = 1
            """
        ),
    )
    rows = store.rows()
    assert {row["status"] for row in rows} == {"ok"}, [row.get("error") for row in rows]
    by_positions = {
        (row["model"]["positional_encoding_used"], row["eval_length"]): row for row in rows
    }
    assert set(by_positions) == {(True, L), (True, 8 * L), (False, L), (False, 8 * L)}
    nope = by_positions[False, 8 * L]
    assert "positional_encoding=none" in nope["task_label"]
    assert nope["corpus_fingerprint"] == by_positions[True, L]["corpus_fingerprint"]
    assert by_positions[True, 8 * L]["model"]["max_seq_len"] == L  # the table: L rows

    config = ModelConfig(256, 256, L, "vanilla", d_model=16, num_heads=2, num_layers=1)
    model = TransformerClassifier(dataclasses.replace(config, causal=True), registry)
    assert model.positional_encoding.table.shape == (L, 16)
    added = model.positional_encoding(torch.zeros(2, 8 * L, 16))
    for position in (0, L - 1, L, 3 * L + 5, 8 * L - 1):  # the paper's formula, past L too
        for i in range(8):
            angle = position / 10000 ** (2 * i / 16)
            assert added[0, position, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert added[0, position, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)
    bare = TransformerClassifier(
        dataclasses.replace(config, causal=True, positional_encoding="none"), registry
    )
    assert bare.positional_encoding is None
    assert not any("positional" in name for name, _ in bare.named_modules())
    tokens = torch.randint(0, 256, (1, 8 * L))
    assert torch.isfinite(model(tokens)).all() and torch.isfinite(bare(tokens)).all()


# --- unsupported lengths ------------------------------------------------------------
def test_a_declared_limit_makes_longer_lengths_unsupported_alone(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus, ("capped",), seeds=1))
    rows = {row["eval_length"]: row for row in store.rows()}
    assert set(rows) == {L, 2 * L, 4 * L}
    assert rows[L]["status"] == rows[2 * L]["status"] == "ok"
    assert isinstance(rows[2 * L]["bits_per_byte_mean"], float)
    unsupported = rows[4 * L]
    assert unsupported["status"] == "unsupported"
    assert unsupported["cell"] == eval_cell_id(rows[L]["cell"], 4 * L)
    assert f"sequences of {4 * L} tokens" in unsupported["error"]
    assert f"its limit is {LIMIT}" in unsupported["error"]
    assert f"its table of positions stops at {LIMIT}" in unsupported["error"]  # the hint
    assert not any(key.startswith("bits_per_byte") for key in unsupported)
    assert unsupported["unigram_bits_per_byte"] == rows[L]["unigram_bits_per_byte"]


# --- kept weights, scored again ----------------------------------------------------
def test_kept_weights_are_scored_again_at_a_new_length(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus, top="save_weights = true"))
    trained = store.rows()
    for row in trained:
        assert set(row["weights"]) == {"0", "1"}
        assert all(store.path(path).is_file() for path in row["weights"].values())
    assert len({path for row in trained for path in row["weights"].values()}) == 4

    assert evaluate(store, registry, [8 * L]) == 2
    assert evaluate(store, registry, [8 * L]) == 0  # each cell has that length now
    assert evaluate(store, registry, [8 * L, 2 * L, L]) == 0  # nor its old ones again
    rows = RunStore.existing(store.directory).rows()
    assert rows[: len(trained)] == trained  # appended, nothing rewritten
    new = rows[len(trained) :]
    primary = [row for row in trained if row["eval_length"] == L]
    assert sorted(row["cell"] for row in new) == sorted(
        eval_cell_id(row["cell"], 8 * L) for row in primary
    )
    task = ByteLanguageModelling(corpus=str(corpus), seq_len=L, eval_bytes=EVAL_BYTES)
    for row in new:
        assert row["status"] == "ok" and row["eval_length"] == 8 * L
        assert row["corpus_fingerprint"] == trained[0]["corpus_fingerprint"]
        assert row["scored_bytes"] == EVAL_BYTES
        direct = [
            bits_per_byte(model_of(row, registry, seed, store), task.held_out(8 * L))
            for seed in ("0", "1")
        ]
        assert row["bits_per_byte_per_seed"] == pytest.approx(direct, abs=1e-9)
        assert row["bits_per_byte_mean"] == pytest.approx(sum(direct) / 2, abs=1e-9)
    assert resume_runner(registry, store).pending() == []  # still a finished run


def test_an_eval_length_above_eval_bytes_is_refused_before_anything_is_written(
    registry, tmp_path, corpus
):
    store = run_spec(
        registry, tmp_path, spec_text(corpus, ("vanilla",), seeds=1, top="save_weights = true")
    )
    before = store.path(ROWS).read_bytes()
    with pytest.raises(ConfigError, match=f"eval_bytes = {EVAL_BYTES}"):
        evaluate(store, registry, [8 * L, 2 * EVAL_BYTES])
    with pytest.raises(ConfigError, match="positive"):
        evaluate(store, registry, [0])
    assert store.path(ROWS).read_bytes() == before


# --- damage -------------------------------------------------------------------------
@pytest.fixture
def kept_run(registry, tmp_path, corpus) -> RunStore:
    return run_spec(
        registry,
        tmp_path,
        spec_text(corpus, ("vanilla",), seeds=2, steps=3, top="save_weights = true"),
    )


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "zeros",
        "missing",
        "not tensors",
        "text",
        "empty",
    ],
)
def test_a_damaged_weights_file_is_named(registry, kept_run, damage):
    before = kept_run.path(ROWS).read_bytes()
    victim = kept_run.path(kept_run.rows()[0]["weights"]["1"])
    if damage == "truncated":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    elif damage == "zeros":
        victim.write_bytes(bytes(victim.stat().st_size))
    elif damage == "text":
        victim.write_bytes(b"these are not weights\n" * 50)
    elif damage == "empty":
        victim.write_bytes(b"")
    elif damage == "missing":
        victim.unlink()
    else:
        torch.save({"weight": [1, 2, 3]}, victim)
    with pytest.raises(DamagedRun) as caught:
        evaluate(kept_run, registry, [8 * L])
    assert str(victim) in str(caught.value)
    assert "save_weights = true" in str(caught.value)  # the way out
    assert kept_run.path(ROWS).read_bytes() == before


def test_weights_of_another_model_are_refused_naming_the_file(registry, kept_run, tmp_path):
    victim = kept_run.path(kept_run.rows()[0]["weights"]["0"])
    other = TransformerClassifier(
        ModelConfig(256, 256, L, "vanilla", d_model=32, num_heads=2, num_layers=1, causal=True),
        registry,
    )
    torch.save(other.state_dict(), victim)
    with pytest.raises(ConfigError, match=victim.name):
        evaluate(kept_run, registry, [8 * L])


def test_a_run_without_kept_weights_says_how_to_keep_them(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus, ("vanilla",), seeds=1, steps=3))
    assert not any("weights" in row for row in store.rows())
    with pytest.raises(PlaygroundError, match="save_weights = true") as caught:
        evaluate(store, registry, [8 * L])
    assert "--save-weights" in str(caught.value)


def test_a_corpus_changed_since_training_is_refused_naming_both_fingerprints(
    registry, kept_run, corpus
):
    trained = kept_run.rows()[0]["corpus_fingerprint"]
    victim = sorted(corpus.iterdir())[5]
    data = bytearray(victim.read_bytes())
    data[0] ^= 1
    victim.write_bytes(bytes(data))
    now = ByteLanguageModelling(corpus=str(corpus), seq_len=L, eval_bytes=EVAL_BYTES).fingerprint
    assert now != trained
    before = kept_run.path(ROWS).read_bytes()
    with pytest.raises(ConfigError) as caught:
        evaluate(kept_run, registry, [8 * L])
    assert trained[:12] in str(caught.value) and now[:12] in str(caught.value)
    assert kept_run.path(ROWS).read_bytes() == before


# --- one run, one corpus ------------------------------------------------------------
def test_corpus_conflict_refuses_a_second_fingerprint_of_the_same_task():
    known: dict[str, str] = {}
    row = {"task": "lm", "task_options": {"corpus": "x", "seq_len": L}}
    first = {**row, "corpus_fingerprint": "a" * 40}
    assert corpus_conflict(first, known) is None
    assert corpus_conflict(first, known) is None  # the same again
    message = corpus_conflict({**row, "corpus_fingerprint": "b" * 40}, known)
    assert message is not None and "different corpus" in message
    assert "b" * 12 in message and "a" * 12 in message
    other = {**row, "task_options": {"corpus": "y", "seq_len": L}, "corpus_fingerprint": "b" * 40}
    assert corpus_conflict(other, known) is None  # another task: its own corpus
    assert corpus_conflict({"task": "mqar", "task_options": {}}, known) is None
    nope = {**row, "task_label": "lm positional_encoding=none", "corpus_fingerprint": "c" * 40}
    assert "different corpus" in (corpus_conflict(nope, known) or "")  # model settings: one task


def test_the_runner_marks_a_cell_measured_on_another_corpus(registry, tmp_path, corpus):
    store = run_spec(registry, tmp_path, spec_text(corpus, seeds=1, steps=3))
    fingerprint = store.rows()[0]["corpus_fingerprint"]
    drop_rows(store, "alibi")
    shutil.rmtree(corpus)
    write_corpus(corpus, files=10, size=3000, first=30)  # other text, the same name
    runner = resume_runner(registry, store)
    assert [cell.variant.label for cell in runner.pending()] == ["alibi"]
    runner.measure_pending()
    alibi = [row for row in store.rows() if row["cell"].startswith("alibi")]
    assert len(alibi) == 3
    for row in alibi:
        assert row["corpus_fingerprint"] != fingerprint
        assert row["status"] == "error"
        assert "different corpus" in row["error"] and fingerprint[:12] in row["error"]
        assert isinstance(row["bits_per_byte_mean"], float)  # the numbers stay in the row
    vanilla = [row for row in store.rows() if row["cell"].startswith("vanilla")]
    assert {row["status"] for row in vanilla} == {"ok"}


def test_eval_scores_only_cells_on_the_corpus_here_and_never_a_conflicting_one(
    registry, tmp_path, corpus
):
    """The run's first rows are on corpus A; alibi is measured again on corpus B (its rows
    are errors, as the test above shows). On B, `playground eval` has no cell it may score
    (vanilla trained on A, alibi's rows are errors) and refuses, appending nothing; back on
    A it scores vanilla alone."""
    store = run_spec(
        registry, tmp_path, spec_text(corpus, seeds=1, steps=3, top="save_weights = true")
    )
    original = tmp_path / "original"
    shutil.copytree(corpus, original)
    assert evaluate(store, registry, [8 * L]) == 2
    drop_rows(store, "alibi")
    shutil.rmtree(corpus)
    write_corpus(corpus, files=10, size=3000, first=30)
    resume_runner(registry, store).measure_pending()
    before = store.path(ROWS).read_bytes()
    with pytest.raises(ConfigError, match="is not the one cell 'vanilla"):
        evaluate(store, registry, [4 * L + 8])
    assert store.path(ROWS).read_bytes() == before
    shutil.rmtree(corpus)
    shutil.copytree(original, corpus)
    assert evaluate(store, registry, [4 * L + 8]) == 1
    (late,) = [row for row in store.rows() if row["cell"].endswith(f"={4 * L + 8}")]
    assert late["cell"].startswith("vanilla") and late["status"] == "ok"


# --- spec keys ----------------------------------------------------------------------
def load(registry: Registry, tmp_path: Path, text: str):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return load_spec(str(path), registry)


def test_the_spec_keys_are_read(registry, tmp_path, corpus):
    spec = load(
        registry,
        tmp_path,
        spec_text(corpus, table='positional_encoding = "sinusoidal"', top="save_weights = true"),
    )
    (task,) = spec.tasks
    assert spec.save_weights is True
    assert task.eval_lengths == (2 * L, 4 * L)
    assert task.positional_encoding == "sinusoidal"
    assert load(registry, tmp_path, spec_text(corpus)).save_weights is False


def test_eval_lengths_on_a_task_that_does_not_scale_is_refused(registry, tmp_path):
    text = (
        'name = "x"\nmeasures = ["accuracy"]\n[[tasks]]\nname = "listops"\neval_lengths = [256]\n'
    )
    with pytest.raises(SpecError, match=r"tasks\[0\]\.eval_lengths: task 'listops' is scored at"):
        load(registry, tmp_path, text)


def test_eval_lengths_past_what_mqar_can_scale_to_name_the_pairs(registry, tmp_path):
    """MQAR at 8 × 64 needs 32 pairs; the default vocabulary of 64 holds 31 keys."""
    text = 'name = "x"\nmeasures = ["accuracy"]\n[[tasks]]\nname = "mqar"\neval_lengths = [512]\n'
    with pytest.raises(SpecError, match=r"needs 32 key-value pairs .*raise vocab_size"):
        load(registry, tmp_path, text)


@pytest.mark.parametrize("lengths", ["[0]", "[1.5]", '["64"]', "[]", "64", f"[{L}, -1]"])
def test_eval_lengths_must_be_positive_integers(registry, tmp_path, corpus, lengths):
    with pytest.raises(SpecError, match=r"tasks\[0\]\.eval_lengths: must be a non-empty list"):
        load(registry, tmp_path, spec_text(corpus, eval_lengths=lengths))


def test_positional_encoding_must_be_one_of_the_choices(registry, tmp_path, corpus):
    text = spec_text(corpus, table='positional_encoding = "nope"')
    with pytest.raises(SpecError, match=r"tasks\[0\]\.positional_encoding") as caught:
        load(registry, tmp_path, text)
    assert "'nope' is not one of auto, sinusoidal, none" in str(caught.value)


def test_an_eval_length_above_eval_bytes_is_a_spec_error(registry, tmp_path, corpus):
    text = spec_text(corpus, eval_lengths=f"[{2 * L}, {2 * EVAL_BYTES}]")
    with pytest.raises(SpecError, match=rf"tasks\[0\]\.eval_lengths: .*eval_bytes = {EVAL_BYTES}"):
        load(registry, tmp_path, text)


@pytest.mark.parametrize(
    ("where", "text", "expected"),
    [
        ("top", 'save_weights = "yes"', "save_weights.*must be true or false"),
        ("table", "curriculum = [{ seq_len = 8 }]", r"tasks\[0\].curriculum: a language task"),
    ],
)
def test_save_weights_and_curricula_are_checked(registry, tmp_path, corpus, where, text, expected):
    with pytest.raises(SpecError, match=expected):
        load(registry, tmp_path, spec_text(corpus, **{where: text}))


def test_save_weights_cannot_be_added_on_resume(registry, tmp_path, corpus, capsys):
    store = run_spec(registry, tmp_path, spec_text(corpus, ("vanilla",), seeds=1, steps=2))
    assert main(["run", "--resume", str(store.directory), "--save-weights"]) == 2
    assert "drop --save-weights" in capsys.readouterr().err


def test_a_variant_sized_to_the_training_length_keeps_that_size_beyond_it(
    registry, tmp_path, corpus
):
    """Sigmoid attention fits b = -log n to the length it is built for (`fit_options`):
    evaluated at 4 × L, the trained model keeps the b of L."""
    store = run_spec(registry, tmp_path, spec_text(corpus, ("sigmoid",), top="save_weights = true"))
    rows = {row["eval_length"]: row for row in store.rows()}
    assert {row["status"] for row in rows.values()} == {"ok"}
    assert rows[4 * L]["model"]["max_seq_len"] == L
    model = model_of(rows[L], registry, "0", store)
    assert all(attention.config.bias_length == L for attention in model.attentions)
