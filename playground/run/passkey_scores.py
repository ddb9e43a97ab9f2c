"""A language model's passkey retrieval: exact match and the key's log-likelihood over the
needle's depth, at one context length.

The probe is passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2): a
random key hidden in filler text, asked for at the end. Its depth is swept as in Kamradt's
"needle in a haystack" and RULER's single-needle tasks (Hsieh et al. 2024, §3.1), so a
report draws depth × context length as a heatmap. The prompts are the task's
(`LanguageTask.passkey_prompts`: for the lm task, held-out text with the format it trains
on, playground.tasks.lm.passkey); this module only scores them, for any language task.

Both scores are read off one teacher-forced forward pass per batch of prompts, at the
positions that predict the key's bytes:
- exact match: the fraction of prompts whose every key byte is the model's argmax given
  the bytes before it, which is exactly whether greedy decoding would write the key (each
  greedy step sees the key so far only where the previous steps wrote it);
- log-likelihood: log2 P(key | prompt) in bits, the sum over the key's bytes, averaged
  over prompts. A model that knows the answer is `digits` decimal digits and nothing of
  which ones scores `chance_log_likelihood(digits)`; one that cannot see the needle scores
  there or below, RULER's point that a probe must be read against its chance level.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from playground.errors import ConfigError, InvalidOutput
from playground.model.training import EVAL_TOKENS_PER_BATCH, scored_logits
from playground.model.transformer import TransformerClassifier
from playground.tasks import IGNORE, LanguageTask, TaskData


@dataclass(frozen=True)
class PasskeyScore:
    """One model's passkey retrieval at one context length, depth by depth."""

    depths: tuple[float, ...]
    exact: tuple[float, ...]
    """Per depth, the fraction of trials whose every key digit is the argmax (teacher
    forced): equal to greedy decoding reproducing the key."""
    log_likelihood: tuple[float, ...]
    """Per depth, the mean over trials of log2 P(key) in bits (0 is certain, lower worse)."""
    trials: int
    """Prompts scored at each depth."""
    digits: int
    """Key bytes scored in each prompt (the chance level's `digits`)."""


def chance_log_likelihood(digits: int) -> float:
    """log2 P(key) in bits of a uniform guess over `digits` decimal digits: what a model
    that knows the format but cannot see the needle scores at best."""
    return digits * math.log2(1 / 10)


@dataclass(frozen=True)
class _Keys:
    """Every prompt of one depth scored: whether its key is the argmax, its log2 P(key)."""

    exact: torch.Tensor  # (trials,) bool
    bits: torch.Tensor  # (trials,) float64
    digits: int


def _score_prompts(model: TransformerClassifier, data: TaskData, device: str, where: str) -> _Keys:
    """The teacher-forced scores of each prompt's labelled positions (its key's bytes)."""
    count, length = data.tokens.shape
    scored = data.labels != IGNORE  # (trials, length)
    per_prompt = scored.sum(dim=1)
    if int(per_prompt.min()) == 0 or int(per_prompt.min()) != int(per_prompt.max()):
        raise ConfigError(
            f"the passkey prompts {where} label {per_prompt.tolist()} positions each: every "
            f"prompt must label its key's bytes, as many in each; fix the task's passkey_prompts"
        )
    digits = int(per_prompt[0])
    batch_size = max(1, EVAL_TOKENS_PER_BATCH // length)
    exact, bits = [], []
    for start in range(0, count, batch_size):
        rows = slice(start, min(start + batch_size, count))
        tokens, labels = data.tokens[rows].to(device), data.labels[rows].to(device)
        logits, wanted = scored_logits(model, tokens, labels, None)  # (P, 256), (P,)
        if not bool(torch.isfinite(logits).all()):
            raise InvalidOutput(
                f"the model's logits are not finite on the passkey prompts {where}: its "
                f"outputs cannot be scored there"
            )
        log_p = F.log_softmax(logits.double(), dim=-1).gather(1, wanted.unsqueeze(1))
        hits = logits.argmax(dim=-1) == wanted
        # (P,) in row-major order, `digits` per prompt: one row per prompt's key
        exact.append(hits.view(-1, digits).all(dim=1).cpu())
        bits.append(log_p.view(-1, digits).sum(dim=1).cpu() / math.log(2))
    return _Keys(torch.cat(exact), torch.cat(bits), digits)


@torch.no_grad()
def score_passkey(
    model: TransformerClassifier, task: LanguageTask, length: int, *, device: str = "cpu"
) -> PasskeyScore | None:
    """`model`'s passkey retrieval on `task`'s prompts of `length` tokens at every one of
    its `passkey_depths`; None when the task has no probe. ConfigError for a length the
    prompts cannot be made at (the task names the shortest), InvalidOutput for logits
    that are not finite."""
    depths = task.passkey_depths
    if not depths:
        return None
    model.eval()
    scores = [
        _score_prompts(
            model,
            task.passkey_prompts(length, depth),
            device,
            f"of {length} tokens at depth {depth}",
        )
        for depth in depths
    ]
    return PasskeyScore(
        depths=tuple(depths),
        exact=tuple(float(each.exact.double().mean()) for each in scores),
        log_likelihood=tuple(statistics.fmean(each.bits.tolist()) for each in scores),
        trials=len(scores[0].exact),
        digits=scores[0].digits,
    )
