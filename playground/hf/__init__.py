"""Your variant inside a transformers model (docs/design.md, "The transformers bridge").

- `register(name, **options)`: the variant's attention as the transformers attention
  implementation `playground:NAME`, on the model's own projections (kernel level);
- `swap_attention(model, name, **options)`: each self-attention module of a Llama, Mistral,
  Qwen2, GPT-2 or BERT model replaced by the variant's own module, the weights it shares
  with the model ported (module level).

transformers is optional: `pip install 'attention-playground[hf]'`.
"""

from playground.hf.kernel import register
from playground.hf.swap import SwapReport, swap_attention

__all__ = ["SwapReport", "register", "swap_attention"]
