"""Scoring the passkey probe (issue 45 part 2, "Done when"): a model that copies the key
from the needle solves it at every depth; a model that cannot see the needle (a sliding
window of one key) scores no exact match and at most the chance log-likelihood; and a
probe whose scored key is not the hidden one fails even the copying model, so the check
can fail."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from playground.errors import ConfigError, InvalidOutput
from playground.model.training import TrainConfig, train
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry
from playground.run.passkey_scores import PasskeyScore, chance_log_likelihood, score_passkey
from playground.tasks import TaskData
from playground.tasks.lm import ByteLanguageModelling
from playground.tasks.lm.passkey import MARK, QUERY
from tests.tasks.text_corpus import write_corpus

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DIGITS = 5
SEQ_LEN = 64
CHANCE = DIGITS * math.log2(0.1)  # -16.61 bits


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("passkey") / "text", files=12, size=4000)


def make_task(corpus: Path, **options) -> ByteLanguageModelling:
    settings = {"seq_len": SEQ_LEN, "eval_bytes": 512, "passkey_depths": list(DEPTHS)}
    return ByteLanguageModelling(corpus=str(corpus), **{**settings, **options})


class CopyingOracle(torch.nn.Module):
    """Answers the query by copying: at the query and after it, the next byte is the one
    as far after the needle's MARK "key " as the position is after the query's, with a
    logit of `confidence` (the rest 0). It reads nothing but the tokens it is given."""

    def __init__(self, confidence: float = 40.0) -> None:
        super().__init__()
        self.confidence = confidence
        self.calls = 0

    def forward(self, tokens, attention_mask=None, positions=None):
        self.calls += 1
        logits = torch.zeros(*tokens.shape, 256)
        for row, prompt in enumerate(tokens):
            marked = (prompt == MARK).nonzero().flatten().tolist()
            needle, query = marked[0], marked[-1]
            for offset, position in enumerate(range(query + len(QUERY) - 1, tokens.shape[1])):
                copied = prompt[needle + len(QUERY) + offset]
                logits[row, position, copied] = self.confidence
        return logits if positions is None else logits[positions]


def test_chance_is_a_uniform_guess_of_the_digits() -> None:
    assert chance_log_likelihood(5) == pytest.approx(-16.609640, abs=1e-6)
    assert chance_log_likelihood(1) == pytest.approx(math.log2(0.1))


def test_a_model_that_copies_the_needle_solves_every_depth(corpus: Path) -> None:
    task = make_task(corpus, passkey_trials=12)
    for length in (SEQ_LEN, 200):
        score = score_passkey(CopyingOracle(), task, length)  # type: ignore[arg-type]
        assert isinstance(score, PasskeyScore)
        assert score.depths == DEPTHS
        assert score.exact == (1.0,) * len(DEPTHS)
        assert all(-1e-9 < bits <= 0.0 for bits in score.log_likelihood)
        assert (score.trials, score.digits) == (12, DIGITS)


def test_an_unsure_copier_loses_exactly_its_doubt_in_bits(corpus: Path) -> None:
    """With logit 2 on the key's byte and 0 on the 255 others, each digit has probability
    e² / (e² + 255): the log-likelihood is the sum of five such, argmax still the key."""
    score = score_passkey(CopyingOracle(confidence=2.0), make_task(corpus), 100)  # type: ignore[arg-type]
    expected = DIGITS * math.log2(math.exp(2) / (math.exp(2) + 255))
    assert score is not None and score.exact == (1.0,) * len(DEPTHS)
    assert score.log_likelihood == pytest.approx((expected,) * len(DEPTHS))


def test_one_forward_pass_per_batch_of_prompts(corpus: Path) -> None:
    oracle = CopyingOracle()
    score_passkey(oracle, make_task(corpus, passkey_trials=8), 100)  # type: ignore[arg-type]
    assert oracle.calls == len(DEPTHS)  # 8 prompts of 100 tokens fit one batch per depth


def test_a_probe_scored_against_another_key_fails_the_copier(
    corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copier reproduces the hidden key; scored against the next trial's key it gets
    no exact match and a log-likelihood far below chance: the check can fail."""
    task = make_task(corpus, passkey_trials=8)
    prompts = task.passkey_prompts

    def another_trials_key(length: int, depth: float) -> TaskData:
        data = prompts(length, depth)
        return TaskData(data.tokens, data.labels.roll(1, dims=0))

    monkeypatch.setattr(task, "passkey_prompts", another_trials_key)
    score = score_passkey(CopyingOracle(), task, 100)  # type: ignore[arg-type]
    assert score is not None
    assert score.exact == (0.0,) * len(DEPTHS)
    assert max(score.log_likelihood) < CHANCE


@pytest.fixture(scope="module")
def blind_model(corpus: Path) -> TransformerClassifier:
    """A real model whose every layer attends to its own position only (a sliding window
    of one key), trained on windows that all carry a passkey: it learns the format, and
    the bytes that follow a byte, but cannot look back at the needle."""
    torch.manual_seed(0)
    task = make_task(corpus, passkey_fraction=1.0)
    config = ModelConfig(
        vocab_size=256,
        num_classes=256,
        max_seq_len=256,
        variant="sliding_window",
        variant_options={"window": 1},
        d_model=32,
        num_heads=2,
        causal=True,
    )
    model = TransformerClassifier(config, Registry.discover(entry_points=False))
    losses = train(
        model,
        task.generate(240, seed=0),
        TrainConfig(steps=30, batch_size=8, learning_rate=1e-2),
        seed=0,
    ).losses
    assert losses[-1] < losses[0] - 1.0  # it learnt something: the bytes of the text
    return model


def test_a_model_that_cannot_see_the_needle_scores_at_chance(
    corpus: Path, blind_model: TransformerClassifier
) -> None:
    task = make_task(corpus)
    for length in (SEQ_LEN, 256):
        score = score_passkey(blind_model, task, length)
        assert score is not None and score.trials == 32
        assert score.exact == (0.0,) * len(DEPTHS)
        assert sum(score.log_likelihood) / len(DEPTHS) <= CHANCE + 0.5


def test_a_task_without_depths_is_not_probed(corpus: Path) -> None:
    oracle = CopyingOracle()
    assert score_passkey(oracle, make_task(corpus, passkey_depths=[]), 100) is None  # type: ignore[arg-type]
    assert oracle.calls == 0


def test_a_length_too_short_for_the_key_is_a_config_error(corpus: Path) -> None:
    with pytest.raises(ConfigError, match="at least 36"):
        score_passkey(CopyingOracle(), make_task(corpus), 30)  # type: ignore[arg-type]


def test_logits_that_are_not_finite_are_invalid_output(corpus: Path) -> None:
    class Broken(CopyingOracle):
        def forward(self, tokens, attention_mask=None, positions=None):
            logits = super().forward(tokens, attention_mask, positions)
            return logits.index_fill(0, torch.tensor([0]), float("nan"))

    with pytest.raises(InvalidOutput, match="not finite on the passkey prompts of 100 tokens"):
        score_passkey(Broken(), make_task(corpus), 100)  # type: ignore[arg-type]


def test_prompts_that_label_no_key_are_refused(
    corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_task(corpus, passkey_trials=4)
    prompts = task.passkey_prompts

    def unlabelled(length: int, depth: float) -> TaskData:
        data = prompts(length, depth)
        labels = data.labels.clone()
        labels[0] = -100
        return TaskData(data.tokens, labels)

    monkeypatch.setattr(task, "passkey_prompts", unlabelled)
    with pytest.raises(ConfigError, match=r"label \[0, 5, 5, 5\] positions each"):
        score_passkey(CopyingOracle(), task, 100)  # type: ignore[arg-type]
