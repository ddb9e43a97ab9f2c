"""The MAD tasks (Poli et al. 2024; mad-lab's generators): every label checked against an
oracle that reads the answer off the tokens alone, the train-versus-test labels of the
recall tasks, MAD's bugs avoided, the compression readout's bottleneck, and a few
training steps of each through the normal accuracy measurement."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn

import playground.run.accuracy as accuracy_module
from playground.contract import AttentionOutput
from playground.errors import ConfigError
from playground.model.training import evaluate
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry
from playground.run.accuracy import measure_accuracy
from playground.run.jobs import AccuracyJob
from playground.tasks import IGNORE, PAD, TargetName, Task, TaskData, example_fingerprints
from playground.tasks.mad import MAD_TASKS
from playground.tasks.mad.common import next_token_labels
from playground.tasks.mad.compression import Compression
from playground.tasks.mad.copying import SelectiveCopying
from playground.tasks.mad.fuzzy_recall import FuzzyInContextRecall
from playground.tasks.mad.memorization import Memorization
from playground.tasks.mad.recall import InContextRecall, NoisyInContextRecall

Labels = list[int]


# --- oracles: the answer at every position, from the tokens alone -----------------------
def recall_labels(task: InContextRecall, tokens: Labels) -> Labels:
    """MAD's test labels: at a key seen before in a real pair, the value it had; at the
    final query key, its value (instances.py:108-131)."""
    non_noise = task.options.vocab_size - task.options.noise_vocab_size
    keys = range(1, non_noise // 2 + 1)  # shifted; values above, noise above the values
    expected, known = [IGNORE] * len(tokens), {}
    for p in range(0, len(tokens) - 1, 2):
        key, value = tokens[p], tokens[p + 1]
        if key not in keys:
            continue  # a noise pair: never scored, never remembered
        if key in known:
            assert known[key] == value  # a key keeps its value
            expected[p] = value
        known[key] = value
    expected[-1] = known[tokens[-1]]  # the query asks a key seen in the context
    return expected


def fuzzy_labels(task: FuzzyInContextRecall, tokens: Labels) -> Labels:
    """MAD's test labels: every token of a value whose key tuple appeared before, scored
    at the position before it (instances.py:311-332)."""
    num_keys = (task.options.vocab_size - 1) // 2
    runs: list[tuple[int, list[int]]] = []  # (start, tokens) of alternating key/value runs
    for p, token in enumerate(tokens):
        if token == PAD:
            assert not runs, "padding only on the left"
            continue
        is_key = token <= num_keys
        if runs and (runs[-1][1][-1] <= num_keys) == is_key:
            runs[-1][1].append(token)
        else:
            runs.append((p, [token]))
    pairs = list(zip(runs[0::2], [*runs[1::2], (len(tokens), [])], strict=False))
    expected, known = [IGNORE] * len(tokens), {}
    for index, ((start, key_run), (_, value_run)) in enumerate(pairs):
        key = tuple(key_run)
        final = index == len(pairs) - 1  # its value's last token is not in the input
        if final or key in known:
            value = known[key]  # the final key was seen: MAD's missing probe is redrawn
            assert final or tuple(value_run) == value
            last_key_token = start + len(key) - 1
            expected[last_key_token : last_key_token + len(value)] = value
        if not final:
            known[key] = tuple(value_run)
    assert len(expected) == len(tokens)
    return expected


def copy_labels(task: SelectiveCopying, tokens: Labels) -> Labels:
    """The non-blank tokens before the copy token, in order, at the last n positions."""
    blank, copy = task.options.vocab_size - 1, task.options.vocab_size
    n = task.options.num_tokens_to_copy
    assert tokens[-n - 1] == copy and tokens[-n - 2] != blank and set(tokens[-n:]) == {blank}
    content = [t for t in tokens[: -n - 1] if t != blank]
    return [IGNORE] * (len(tokens) - n) + content


def memorization_labels(task: Memorization, tokens: Labels) -> Labels:
    value_of = task.value_of().tolist()
    insert = task.options.vocab_size
    assert tokens[1::2] == [insert] * (len(tokens) // 2)
    return [value_of[tokens[p - 1] - 1] if p % 2 else IGNORE for p in range(len(tokens))]


def compression_labels(task: Compression, tokens: Labels) -> Labels:
    assert tokens[-1] == task.options.vocab_size and max(tokens[:-1]) < tokens[-1]
    return list(tokens)


ORACLES: dict[type[Task], Callable] = {
    InContextRecall: recall_labels,
    NoisyInContextRecall: recall_labels,
    FuzzyInContextRecall: fuzzy_labels,
    SelectiveCopying: copy_labels,
    Compression: compression_labels,
    Memorization: memorization_labels,
}

SMALL = [  # small settings keep the file fast; defaults are checked separately
    InContextRecall(seq_len=32),
    NoisyInContextRecall(seq_len=32, frac_noise=0.4),
    FuzzyInContextRecall(seq_len=64),
    SelectiveCopying(seq_len=64, num_tokens_to_copy=8),
    Compression(seq_len=16),
    Memorization(seq_len=16),
]
DEFAULTS = [cls() for cls in MAD_TASKS]


def expected_labels(task: Task, data: TaskData) -> torch.Tensor:
    oracle = ORACLES[type(task)]
    return torch.tensor([oracle(task, row) for row in data.tokens.tolist()])


def test_the_six_tasks_are_registered(bundled_registry: Registry) -> None:
    names = {cls.name for cls in MAD_TASKS}
    assert names == {
        "mad_recall", "mad_fuzzy_recall", "mad_noisy_recall",
        "mad_selective_copy", "mad_compression", "mad_memorization",
    }  # fmt: skip
    assert names <= set(bundled_registry.task_names())
    assert not [e for e in bundled_registry.errors if "playground.tasks" in e.source]


@pytest.mark.parametrize("task", DEFAULTS, ids=lambda t: t.name)
def test_defaults_are_mads_baseline_settings(task: Task) -> None:
    """configs/tasks/*.yml baselines, mad/configs.py:43-44 for the sizes."""
    baseline = {
        "mad_recall": (16, 128, 12_800),
        "mad_fuzzy_recall": (16, 128, 12_800),
        "mad_noisy_recall": (32, 128, 12_800),
        "mad_selective_copy": (16, 256, 12_800),
        "mad_compression": (16, 32, 12_800),
        "mad_memorization": (256, 32, 256),
    }[task.name]
    options = task.options
    assert (options.vocab_size, options.seq_len, task.num_train) == baseline
    assert task.num_test == 1_280 and task.vocab_size == options.vocab_size + 1  # token 0: PAD
    assert task.needs_causal


@pytest.mark.parametrize("task", SMALL, ids=lambda t: t.name)
def test_generation_is_deterministic_and_in_bounds(task: Task) -> None:
    torch_state = torch.random.get_rng_state()
    first, again, other = task.generate(32, seed=5), task.generate(32, seed=5), task.generate(32, 6)
    training, training_again = task.generate_training(32, seed=5), task.generate_training(32, 5)
    assert torch.equal(torch.random.get_rng_state(), torch_state)  # no global generator used
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.labels, again.labels)
    assert torch.equal(training.labels, training_again.labels)
    assert not torch.equal(first.tokens, other.tokens)
    for data in (first, training):
        assert data.tokens.shape == data.labels.shape == (32, task.seq_len)
        assert data.tokens.dtype == data.labels.dtype == torch.long
        assert int(data.tokens.min()) >= 0 and int(data.tokens.max()) < task.vocab_size
        scored = data.labels[data.labels != IGNORE]
        assert int(scored.min()) >= 0 and int(scored.max()) < task.num_classes


@pytest.mark.parametrize("task", SMALL + DEFAULTS[:3], ids=lambda t: t.label)
def test_every_label_is_what_the_generator_semantics_demand(task: Task) -> None:
    data = task.generate(200 if task.seq_len > 100 else 400, seed=1)
    assert torch.equal(data.labels, expected_labels(task, data))


@pytest.mark.parametrize("task", SMALL, ids=lambda t: t.name)
def test_a_model_given_the_answer_scores_one(task: Task) -> None:
    """The oracle read off the tokens, as a model evaluate() scores: 1.0 (memorization's
    oracle knows only the map its training set shows, which covers every test key)."""
    train, test = task.split(seed=0, num_train=256, num_test=128)
    if isinstance(task, Memorization):
        learnt = dict(zip(train.tokens[:, 0::2].flatten().tolist(), train.labels[:, 1::2].flatten().tolist(), strict=True))  # fmt: skip

        def answer(row: Labels) -> Labels:
            return [learnt[row[p - 1]] if p % 2 else PAD for p in range(len(row))]
    else:

        def answer(row: Labels) -> Labels:
            return [max(label, PAD) for label in ORACLES[type(task)](task, row)]

    assert evaluate(AnswerModel(answer, task.num_classes), test) == 1.0


class AnswerModel(nn.Module):
    """Logits that put the answer first, called as training and evaluation call a model."""

    def __init__(self, answer: Callable[[Labels], Labels], num_classes: int) -> None:
        super().__init__()
        self.answer, self.num_classes = answer, num_classes

    def forward(self, tokens, attention_mask=None, positions=None):
        answers = torch.tensor([self.answer(row) for row in tokens.tolist()])
        logits = nn.functional.one_hot(answers, self.num_classes).float()  # (B, L, C)
        return logits if positions is None else logits[positions]


@pytest.mark.parametrize("task", SMALL, ids=lambda t: t.name)
def test_no_test_input_is_in_the_training_set(task: Task) -> None:
    train, test = task.split(seed=0, num_train=512, num_test=128)
    assert len(test) == 128 and len(train) > 500
    seen = set(example_fingerprints(test, labels=False))
    assert not seen & set(example_fingerprints(train, labels=False))


def test_split_drops_a_train_input_that_repeats_a_test_one_whatever_its_labels() -> None:
    """One key and one value: every sequence is the same input, labelled densely in
    training and sparsely in test; the training set must drop every one of them, and
    with nothing left to train on the split says so."""
    task = InContextRecall(seq_len=4, vocab_size=2)
    with pytest.raises(ConfigError, match="nothing is left to train on"):
        task.split(seed=0, num_train=10, num_test=2)


@pytest.mark.parametrize("task", SMALL[:3], ids=lambda t: t.name)
def test_recall_trains_on_every_next_token_and_is_scored_on_recalls(task: Task) -> None:
    """MAD's is_training switch (instances.py:136-140, :340-347)."""
    train, test = task.split(seed=0, num_train=64, num_test=64)
    assert bool((train.labels != IGNORE).all())  # every position is a target
    assert torch.equal(train.labels[:, :-1], train.tokens[:, 1:])  # ... the next token
    scored = test.labels != IGNORE
    assert 0 < int(scored.sum()) < scored.numel() // 2  # test: only the recalls
    # Each recall scored in test is a next token: training on next tokens teaches it.
    assert torch.equal(next_token_labels(test).labels[scored], test.labels[scored])


@pytest.mark.parametrize("task", SMALL[3:], ids=lambda t: t.name)
def test_the_other_tasks_train_on_their_test_labels(task: Task) -> None:
    data, training = task.generate(16, seed=2), task.generate_training(16, seed=2)
    assert torch.equal(data.tokens, training.tokens) and torch.equal(data.labels, training.labels)


def test_fuzzy_keys_have_every_size_in_training_and_the_largest_in_test() -> None:
    """instances.py:235-239: train keys are 1 … k_motif_size tokens, test keys k_motif_size."""
    task = FuzzyInContextRecall(seq_len=64)
    num_keys = (task.options.vocab_size - 1) // 2

    def key_sizes(data: TaskData) -> set[int]:
        sizes = set()
        for row in data.tokens.tolist():
            is_key = [0 < t <= num_keys for t in row] + [False]
            starts = [p for p in range(len(row)) if is_key[p] and (p == 0 or not is_key[p - 1])]
            sizes |= {next(q for q in range(p, len(is_key)) if not is_key[q]) - p for p in starts}
        return sizes

    assert key_sizes(task.generate_training(64, seed=0)) == {1, 2, 3}
    # The query's key is whole in the input too (only its value's last token is cut).
    assert key_sizes(task.generate(64, seed=0)) == {3}


def test_fuzzy_recall_always_shows_the_queried_key_first() -> None:
    """MAD's loop may end before its probe point and then scores a key the context never
    showed (about 2 % of sequences at L 128, 14 % at L 32): redrawn here. The oracle raises
    KeyError on such a row."""
    task = FuzzyInContextRecall(seq_len=32)
    for data in (task.generate(400, seed=3), task.generate_training(400, seed=3)):
        for row in data.tokens.tolist():
            fuzzy_labels(task, row)


def test_noisy_recall_always_has_a_pair_to_query() -> None:
    """Nearly all noise on two slots: MAD's free slot may name the query slot and leave
    no pair (its generator then raises); here one slot is always a real pair."""
    task = NoisyInContextRecall(seq_len=6, frac_noise=0.95)
    data = task.generate(300, seed=0)
    assert torch.equal(data.labels, expected_labels(task, data))
    noise = task.options.vocab_size - task.options.noise_vocab_size
    assert int((data.tokens[:, :4] > noise).sum()) > 300  # mostly noise, yet answerable


def test_memorization_map_is_fixed_across_splits_and_test_keys_are_trained() -> None:
    task = Memorization()  # MAD's baseline: V 256, 256 training sequences of 16 keys
    train, test = task.split(seed=0)
    _, other_test = task.split(seed=1)
    for data in (train, test, other_test):  # one map, whatever the split seed
        assert torch.equal(data.labels, expected_labels(task, data))
    value_of = task.value_of()
    assert len(set(value_of.tolist())) == task.num_keys  # one value per key
    assert set(test.tokens[:, 0::2].unique().tolist()) <= set(
        train.tokens[:, 0::2].unique().tolist()
    )
    assert not torch.equal(Memorization(map_seed=1).value_of(), value_of)


@pytest.mark.parametrize("task", SMALL, ids=lambda t: t.name)
def test_chance_is_a_uniform_guess_over_the_answers_a_position_can_take(task: Task) -> None:
    data = task.generate(2000, seed=4)
    if isinstance(task, Compression):  # V − 1 tokens, then the compression token, always
        assert set(data.labels[:, :-1].unique().tolist()) == set(range(1, task.options.vocab_size))
        assert task.chance == pytest.approx((15 / (task.options.vocab_size - 1) + 1) / 16)
        return
    answers = data.labels[data.labels != IGNORE].unique()
    assert task.chance == pytest.approx(1 / answers.numel())


@pytest.mark.parametrize(
    ("cls", "options", "message"),
    [
        (InContextRecall, {"seq_len": 33}, "even"),
        (InContextRecall, {"causal": False}, "next tokens"),
        (NoisyInContextRecall, {"noise_vocab_size": 31}, "non-noise"),
        (InContextRecall, {"frac_noise": 0.2}, "noise_vocab_size"),
        (FuzzyInContextRecall, {"vocab_size": 6}, "too few"),
        (FuzzyInContextRecall, {"seq_len": 20}, "at least 4"),
        (SelectiveCopying, {"seq_len": 33}, "2 × num_tokens_to_copy"),
        (Memorization, {"seq_len": 31}, "even"),
        (Compression, {"num_train_examples": 0}, "positive"),
    ],
)
def test_bad_options_name_the_problem(cls: type[Task], options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cls(**options)


# --- compression's readout: the last position is the only way through ------------------
def _autoencoder(
    registry: Registry, target: TargetName = "token_from_last"
) -> TransformerClassifier:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=9, num_classes=9, max_seq_len=12, variant="vanilla", d_model=16,
        num_heads=2, target=target, causal=True,
    )  # fmt: skip
    return TransformerClassifier(config, registry).eval()


@pytest.mark.parametrize("target", ["token_from_last", "token"])
def test_only_the_last_position_reaches_the_decoder(
    bundled_registry: Registry, target: TargetName
) -> None:
    """Scramble what the last layer's attention writes at every position but the last:
    the autoencoder's logits do not move (nothing else reaches them); a per-token
    model's do, so the check can fail."""
    model = _autoencoder(bundled_registry, target)
    tokens = torch.randint(1, 9, (3, 12), generator=torch.Generator().manual_seed(1))
    clean = model(tokens)

    def scramble(rows: slice):
        def hook(module, args, output: AttentionOutput) -> AttentionOutput:
            noisy = output.output.clone()
            noisy[:, rows] = 10 * torch.randn_like(noisy[:, rows])
            return output._replace(output=noisy)

        return hook

    handle = model.layers[-1].attention.register_forward_hook(scramble(slice(0, -1)))
    blocked = torch.equal(model(tokens), clean)
    handle.remove()
    assert blocked == (target == "token_from_last")
    handle = model.layers[-1].attention.register_forward_hook(scramble(slice(-1, None)))
    assert not torch.allclose(model(tokens), clean)  # the last position does reach it
    handle.remove()


def test_the_decoder_reads_positions_from_a_fixed_encoding(bundled_registry: Registry) -> None:
    model = _autoencoder(bundled_registry)
    tokens = torch.randint(1, 9, (2, 12), generator=torch.Generator().manual_seed(2))
    logits = model(tokens)  # (B, L, C)
    assert logits.shape == (2, 12, 9) and not torch.allclose(logits[:, 0], logits[:, 5])
    positions = torch.rand(2, 12, generator=torch.Generator().manual_seed(3)) < 0.4
    assert torch.allclose(model(tokens, positions=positions), logits[positions])
    right_padded = torch.ones(2, 12, dtype=torch.bool)
    right_padded[0, 8:] = False  # row 0's last real token is at 7: that one is read
    padded = model(tokens, right_padded)
    assert torch.allclose(padded[1], logits[1])
    assert torch.allclose(padded[0, :8], model(tokens[:1, :8])[0], atol=1e-6)
    with pytest.raises(ConfigError, match="token target"):
        model.prefill(tokens)  # an autoencoder does not decode a continuation
    with pytest.raises(ConfigError, match="causal language model"):
        dataclasses.replace(model.config, architecture="hf_llama")


# --- a few steps of each task through the normal accuracy measurement -------------------
TINY = {
    "mad_recall": {"seq_len": 16, "num_train_examples": 256, "num_test_examples": 64},
    "mad_noisy_recall": {"seq_len": 16, "num_train_examples": 256, "num_test_examples": 64},
    "mad_fuzzy_recall": {"seq_len": 32, "num_train_examples": 256, "num_test_examples": 64},
    "mad_selective_copy": {"seq_len": 24, "num_tokens_to_copy": 4, "num_test_examples": 64},
    "mad_compression": {"seq_len": 8, "num_train_examples": 256, "num_test_examples": 64},
    "mad_memorization": {"vocab_size": 32, "seq_len": 8, "num_test_examples": 64},
}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_few_training_steps_on_each_task(
    bundled_registry: Registry, monkeypatch: pytest.MonkeyPatch, one_thread: None, name: str
) -> None:
    """measure_accuracy, the runner's own path: the training loop gets the training labels
    (dense for recall), the row the test's chance and the model its readout."""
    trained_on: list[TaskData] = []
    real_train = accuracy_module.train

    def spy(model, data, *args, **kwargs):
        trained_on.append(data)
        return real_train(model, data, *args, **kwargs)

    monkeypatch.setattr(accuracy_module, "train", spy)
    job = AccuracyJob(
        "vanilla", {}, name, TINY[name], steps=12, batch_size=16, d_model=16, num_heads=2,
        num_layers=1,
    )  # fmt: skip
    row = measure_accuracy(bundled_registry, job, seeds=[0])
    task = bundled_registry.get_task(name)(**TINY[name])
    assert 0.0 <= row["accuracy_mean"] <= 1.0 and row["chance"] == pytest.approx(task.chance)
    assert row["model"]["target"] == task.target and row["model"]["causal"]
    (data,) = trained_on
    train, _ = task.split(seed=0, num_train=len(data))
    assert torch.equal(data.labels, train.labels)  # generate_training's labels
    if name.endswith("recall"):
        assert bool((data.labels != IGNORE).all())  # every next token
    assert row["accuracy_scored"] == int((task.generate(64, seed=1).labels != IGNORE).sum())
