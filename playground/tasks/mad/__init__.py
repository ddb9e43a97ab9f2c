"""The six MAD tasks: Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
Architectures" (arXiv 2403.17844), §3.1, generated as mad-lab generates them
(github.com/athms/mad-lab at commit 0f49a45, mad/data/instances.py; each module cites the
lines of its task).

| name                 | MAD task                  | module         |
|----------------------|---------------------------|----------------|
| `mad_recall`         | in-context recall         | recall         |
| `mad_noisy_recall`   | noisy in-context recall   | recall         |
| `mad_fuzzy_recall`   | fuzzy in-context recall   | fuzzy_recall   |
| `mad_selective_copy` | selective copying         | copying        |
| `mad_compression`    | compression               | compression    |
| `mad_memorization`   | memorization              | memorization   |

Each task's options default to MAD's baseline setting (configs/tasks/<task>.yml) and
cover its difficulty sweep (vocabulary, length, training examples, noise share, tokens to
copy). What is the same in all six:

- Tokens: MAD's token t is our t + 1 (token 0 is PAD in every task here); the option
  `vocab_size` is MAD's V and the model's vocabulary is V + 1.
- Training and test labels: the three recall tasks train on every next token and are
  scored only where a value is recalled (`Task.generate_training`), as MAD's
  `is_training` switch does (instances.py:136-140, :340-347); the other three train on
  the labels they are scored on.
- Sizes: 12 800 training and 1 280 test examples (mad/configs.py:43-44; memorization
  256 training examples), a fixed set sampled in shuffled epochs as MAD's.
- Models: causal attention, MAD's (`causal=False` is allowed where no next token is a
  label); compression decodes every position from the last one
  (`target = "token_from_last"`), MAD's autoencoder.
- Score: per-token accuracy over the scored positions, pooled over all of them (micro),
  the playground's accuracy for every task and Zoology's for MQAR. MAD reports
  torchmetrics' MulticlassAccuracy with its default macro average: the mean over the
  classes of each class's recall (mad/metrics.py:5-14, pl_model_wrapper.py:33-38), and
  picks the checkpoint of lowest test perplexity. With balanced labels the two are close;
  they differ when few positions are scored or the labels are skewed (the compression
  token's position is always right and counts as one class in MAD's mean, one position
  in ours).
"""

from __future__ import annotations

from collections.abc import Callable

from playground.hookspecs import hookimpl
from playground.tasks import Task
from playground.tasks.mad.compression import Compression
from playground.tasks.mad.copying import SelectiveCopying
from playground.tasks.mad.fuzzy_recall import FuzzyInContextRecall
from playground.tasks.mad.memorization import Memorization
from playground.tasks.mad.recall import InContextRecall, NoisyInContextRecall

MAD_TASKS = (
    InContextRecall,
    FuzzyInContextRecall,
    NoisyInContextRecall,
    SelectiveCopying,
    Compression,
    Memorization,
)
"""Every MAD task, registered by the hook below."""


@hookimpl
def register_tasks(register: Callable[[type[Task]], None]) -> None:
    for task in MAD_TASKS:
        register(task)
