"""A tiny Transformer encoder whose attention is any registered variant.

Vaswani et al. 2017, "Attention Is All You Need": token embedding scaled by √d_model
(§3.4), sinusoidal positional encoding (§3.5), N layers of attention and a position-wise
feed-forward network (§3.3), each wrapped in a residual connection with LayerNorm (§3.1).
The LayerNorm sits before each sublayer (pre-LN, Xiong et al. 2020), which trains stably
with the short warm-ups a CPU budget allows; a final LayerNorm follows the stack.

Across layers the model shares what each variant's paper shares, through the variant's
`share_with_first_layer` hook (T5's bias table, Raffel et al. 2020 §2.1; Linformer's
layerwise projection, Wang et al. 2020 §4); a length-sized option the user left unset is
fitted to the task's length by the variant's `fit_options`.

Heads: per-token classification (`target="token"`, logits at every position),
whole-sequence classification (`target="sequence"`) from the first position (a [CLS]
token, made global through the variant's `global_token_arguments`) or from the mean over
real tokens, or every position decoded from the last position alone
(`target="token_from_last"`): the autoencoder of MAD's compression task (Poli et al. 2024,
arXiv 2403.17844, §3.1; mad-lab's mad/model/auto_encoder.py:53-125, global_pool="last").
The encoder is this stack; its state at the last position, plus a fixed sinusoidal
encoding of the position asked for, goes through a small MLP (LayerNorm, Linear, GELU,
twice, then LayerNorm) and the head, so nothing else of the input reaches the logits.
MAD's position table is fairseq's (sines then cosines); this one interleaves them
(§3.5), the same family up to a channel order the decoder's first layer absorbs.

A causal token-target model decodes incrementally (`prefill`, then `decode_step`): each
layer's attention keeps its own decoding state, a new token gets the positional encoding
of its own position, and the feed-forward sublayers and the head run on its row only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from torch import nn

from playground.contract import AttentionOutput, AttentionVariant
from playground.decoding import DecodingState, left_aligned, shifted
from playground.errors import ConfigError, UnsupportedFeature
from playground.hook_calls import checked_options_hook, checked_share_with_first_layer
from playground.model.linear_layers import use_fast_linears
from playground.registry import Registry
from playground.tasks import TargetName

PositionalEncodingName = Literal["auto", "sinusoidal", "none"]
ArchitectureName = Literal["playground", "hf_llama"]
ARCHITECTURES: tuple[str, ...] = ("playground", "hf_llama")
"""The networks a variant trains in: this module's TransformerClassifier, or a tiny
transformers Llama with the variant swapped in (playground.hf.LlamaLanguageModel)."""


@dataclass(frozen=True)
class ModelConfig:
    """Everything that shapes a model; the variant's own options ride in `variant_options`."""

    vocab_size: int
    """Token ids are [0, vocab_size)."""
    num_classes: int
    """Outputs of the classification head."""
    max_seq_len: int
    """Longest sequence: sizes the positional table and what the variant fits to a length
    (its `fit_options`)."""
    variant: str
    """Registered attention variant used in every layer."""
    variant_options: dict[str, Any] = field(default_factory=dict)
    """Options of that variant (as `playground.build` takes them)."""
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 0
    """Hidden width of the feed-forward network; 0 = 4 · d_model (§3.3)."""
    dropout: float = 0.0
    """Dropout on embeddings and sublayer outputs (paper 0.1; off for tiny, short runs)."""
    positional_encoding: PositionalEncodingName = "auto"
    """"auto": sinusoidal unless the variant encodes positions itself (a relative bias
    that can be shared across layers, like T5's, replaces it, as in T5); "none": no
    positions from the model at all (NoPE, Kazemnejad et al. 2023), so a variant that does
    not encode them sees only the causal mask's order."""
    share_across_layers: bool = True
    """Share T5's bias table across layers, and Linformer's projection when its
    sharing="layerwise", as the papers do."""
    target: TargetName = "token"
    """What the head reads (playground.tasks.TargetName): "token_from_last" adds the
    decoder that reads every position out of the last one (module docstring)."""
    causal: bool = False
    """Every layer attends with `is_causal=True` (position i sees positions <= i)."""
    pooling: Literal["first", "mean"] = "first"
    """Sequence target only: classify from position 0 ([CLS]) or from the mean of real tokens."""
    architecture: ArchitectureName = "playground"
    """The network around the attention: "playground" (this module's), or "hf_llama", a
    transformers Llama of the same width, depth and heads (RMSNorm, SwiGLU, rotary
    positions) with the variant swapped into each layer; a causal token model only."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_classes", "max_seq_len", "d_model", "num_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.num_layers < 1:
            raise ConfigError(f"num_layers must be at least 1; got {self.num_layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1); got {self.dropout}")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"architecture must be one of {', '.join(ARCHITECTURES)}; got {self.architecture!r}"
            )
        if self.architecture == "hf_llama" and not (self.causal and self.target == "token"):
            raise ConfigError(
                "architecture 'hf_llama' is a causal language model: it trains on causal, "
                "per-token tasks (lm, or mqar), not on sequence targets or bidirectional ones"
            )


def sinusoids(length: int, d_model: int, start: int = 0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(…) (Vaswani et al. §3.5):
    (length, d_model) float32 at positions start … start + length − 1, each row the same
    values whatever `start` and `length` (a decoded token's row equals the full table's)."""
    position = torch.arange(start, start + length, dtype=torch.float32)[:, None]  # (L, 1)
    frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)  # (L, d_model)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
    return table


class PositionalEncoding(nn.Module):
    """The sinusoids of §3.5 added to the embeddings: a fixed buffer for the model's
    `max_seq_len`, computed afresh for a longer input (evaluation beyond the training
    length), so the encoding is defined at every position, as the paper's formula is."""

    table: torch.Tensor  # (max_len, d_model), registered as a buffer below

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoids(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (B, L, d_model) at positions offset … offset + L − 1 (a decoded token's own)."""
        end = offset + x.shape[1]
        if end <= self.table.shape[0]:
            rows = self.table[offset:end]
        else:  # only the rows asked for: a decoded token past the table costs one row
            rows = sinusoids(x.shape[1], x.shape[-1], start=offset)
        return x + rows.to(x.device, x.dtype)  # (B, L, d_model)


class EncoderLayer(nn.Module):
    """x + Attention(LN(x)), then x + FFN(LN(x)) (pre-LN form of §3.1)."""

    def __init__(self, attention: AttentionVariant, config: ModelConfig) -> None:
        super().__init__()
        d_ff = config.d_ff or 4 * config.d_model
        self.attention = attention
        self.causal = config.causal
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.feed_forward = nn.Sequential(
            nn.Linear(config.d_model, d_ff), nn.GELU(), nn.Linear(d_ff, config.d_model)
        )
        self.feed_forward_norm = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None, extra: dict[str, Any]
    ) -> torch.Tensor:
        return self.feed(self.attend(x, attention_mask, extra))

    def attend(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None, extra: dict[str, Any]
    ) -> torch.Tensor:
        """x + Attention(LN(x)): the sublayer that mixes positions. (B, L, d_model)."""
        mixed: AttentionOutput = self.attention(
            self.attention_norm(x), attention_mask=attention_mask, is_causal=self.causal, **extra
        )
        update: torch.Tensor = self.dropout(mixed.output)
        return x + update

    def feed(self, x: torch.Tensor) -> torch.Tensor:
        """x + FFN(LN(x)): position-wise, so it takes any (..., d_model) selection of rows."""
        update: torch.Tensor = self.dropout(self.feed_forward(self.feed_forward_norm(x)))
        return x + update


def share_across_layers(layers: list[AttentionVariant]) -> list[str]:
    """Tie what the papers tie across a stack (each variant's `share_with_first_layer`);
    returns what was shared, for the record."""
    first, shared = layers[0], []
    for layer in layers[1:]:
        shared = list(checked_share_with_first_layer(layer, first))
    return shared


class TransformerClassifier(nn.Module):
    """Embedding → positional encoding → N encoder layers → LayerNorm → classifier."""

    decoder_positions: torch.Tensor  # (max_seq_len, d_model), target "token_from_last" only

    def __init__(self, config: ModelConfig, registry: Registry) -> None:
        super().__init__()
        self.config = config
        options = checked_options_hook(
            registry.get(config.variant), "fit_options", config.variant_options, config.max_seq_len
        )
        attentions = [
            registry.build(config.variant, config.d_model, config.num_heads, **options)
            for _ in range(config.num_layers)
        ]
        first = attentions[0]
        caps = first.capabilities_for(first.config)
        limit = caps.max_seq_len
        if limit is not None and config.max_seq_len > limit:
            raise UnsupportedFeature(
                config.variant,
                f"sequences of {config.max_seq_len} tokens (its limit is {limit})",
                caps.max_seq_len_hint,
            )
        self.shared = share_across_layers(attentions) if config.share_across_layers else []
        use_sinusoids = config.positional_encoding == "sinusoidal" or (
            config.positional_encoding == "auto" and not type(first).encodes_positions
        )
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        # std d^-1/2, times √d in forward: unit-scale embeddings next to the unit-scale
        # sinusoids (nn.Embedding's std 1 times √d would drown the positions).
        nn.init.normal_(self.embedding.weight, std=config.d_model**-0.5)
        self.positional_encoding = (
            PositionalEncoding(config.d_model, config.max_seq_len) if use_sinusoids else None
        )
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(EncoderLayer(a, config) for a in attentions)
        self.final_norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.num_classes)
        if config.target == "token_from_last":  # MAD's decoder: auto_encoder.py:62-72
            d = config.d_model
            self.decoder = nn.Sequential(  # then the head, MAD's unembedding
                *(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()),
                *(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()),
                nn.LayerNorm(d),
            )
            self.register_buffer(
                "decoder_positions", sinusoids(config.max_seq_len, d), persistent=False
            )
        # A sequence classified from position 0 makes that position global where the
        # variant has global attention (Longformer §3.1: [CLS] is global for classification).
        self.global_first_token = config.target == "sequence" and config.pooling == "first"
        # Its own layers and its attention's projections on the faster float32 CPU GEMM
        # (playground.model.linear_layers: oneDNN where torch's MKL runs below the CPU's width).
        use_fast_linears(self)

    @property
    def attentions(self) -> list[AttentionVariant]:
        return [layer.attention for layer in self._encoder_layers]

    @property
    def _encoder_layers(self) -> Sequence[EncoderLayer]:
        # nn.ModuleList types its items as plain Modules; every one here is an EncoderLayer.
        return cast("Sequence[EncoderLayer]", self.layers)

    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens (B, L) int64; attention_mask (B, L) bool, True = real token, or None.

        Returns logits (B, L, num_classes) for a token target, (B, num_classes) for a
        sequence target. `positions` (B, L) bool, per-token targets only: the positions whose
        logits are wanted (the scored ones in training); returns their (P, num_classes),
        in row-major order, the same values the full output holds there.

        After the last attention sublayer nothing mixes positions, so the last
        feed-forward sublayer, the final norm and the head run only on the rows read out:
        the wanted positions, or position 0 of a sequence classified from it. The logits
        are the full computation's; the work skipped is the rows nothing reads.
        """
        x = self._embedded(tokens, offset=0)  # (B, L, d_model)
        extra: dict[str, Any] = {}
        if self.global_first_token:
            is_global = torch.zeros_like(tokens, dtype=torch.bool)  # (B, L)
            is_global[:, 0] = True
            extra = self._encoder_layers[0].attention.global_token_arguments(is_global)
        for layer in self.layers[:-1]:
            x = layer(x, attention_mask, extra)
        x = self._encoder_layers[-1].attend(x, attention_mask, extra)  # (B, L, d_model)
        if positions is not None:
            if self.config.target == "sequence":
                raise ConfigError("positions selects tokens: give it for a token target only")
            if positions.shape != tokens.shape or positions.dtype != torch.bool:
                raise ConfigError(
                    f"positions must be a bool mask shaped like tokens {tuple(tokens.shape)};"
                    f" got {positions.dtype} {tuple(positions.shape)}"
                )
        if self.config.target == "token_from_last":
            return self._decoded_from_last(x, attention_mask, positions)
        if self.config.target == "token":
            if positions is not None:
                x = x[positions]  # (P, d_model)
            features = self._read_out(x)  # (B, L, d_model) | (P, d_model)
        elif self.config.pooling == "first":
            features = self._read_out(x[:, 0])  # (B, d_model): the only position read out
        else:
            x = self._read_out(x)  # (B, L, d_model)
            if attention_mask is None:
                features = x.mean(dim=1)
            else:
                weights = attention_mask.to(x.dtype)[..., None]  # (B, L, 1)
                features = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        logits: torch.Tensor = self.head(features)  # (B, L, C) | (P, C) | (B, C)
        return logits

    # --- decoding: one token at a time, each layer's attention with its own state -------
    def prefill(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_length: int | None = None,
    ) -> tuple[torch.Tensor, ModelState]:
        """Start decoding a causal token-target model: tokens (B, P) int64, padded on the
        left or the right (attention_mask (B, P) bool). Returns the logits (B, P, C) and
        the state for `decode_step`. `max_length` bounds the tokens the state will hold,
        the prompt's included (its caches are then allocated once).

        Positions are those of the left-padded batch, as the attention's own state keeps
        them: a right-padded prompt is decoded as if its padding came first, so its logits
        (returned in the caller's layout) and every token after it are the forward's on
        the left-padded batch; a left-padded or unpadded prompt's are the forward's."""
        if not (self.config.causal and self.config.target == "token"):
            raise ConfigError(
                "decoding needs a causal model with a token target (ModelConfig(causal=True, "
                f"target='token')); this one has causal={self.config.causal}, "
                f"target={self.config.target!r}"
            )
        shift = left_aligned(attention_mask)  # positions of the left-padded batch, as the
        if shift is not None and attention_mask is not None:  # attention's state keeps
            tokens, attention_mask = shifted(tokens, shift), shifted(attention_mask, shift)
        x = self._embedded(tokens, offset=0)  # (B, P, d_model)
        states = []
        for layer in self._encoder_layers:
            mixed, state = layer.attention.prefill(
                layer.attention_norm(x), attention_mask=attention_mask, max_length=max_length
            )
            states.append(state)
            x = layer.feed(x + layer.dropout(mixed))
        logits = self.head(self.final_norm(x))  # (B, P, C)
        if shift is not None:
            logits = shifted(logits, shift, -1)
        return logits, ModelState(states, tokens.shape[1])

    def decode_step(self, token: torch.Tensor, state: ModelState) -> torch.Tensor:
        """The next token of every sequence, (B, 1) int64: its logits (B, 1, C), those the
        forward gives at its position; `state` is updated in place."""
        if token.dim() != 2 or token.shape[1] != 1:
            raise ConfigError(f"decode_step takes (batch, 1) token ids; got {tuple(token.shape)}")
        x = self._embedded(token, offset=state.length)  # (B, 1, d_model)
        for layer, layer_state in zip(self._encoder_layers, state.layers, strict=True):
            mixed, _ = layer.attention.decode_step(layer.attention_norm(x), layer_state)
            x = layer.feed(x + layer.dropout(mixed))
        state.length += 1
        logits: torch.Tensor = self.head(self.final_norm(x))  # (B, 1, C)
        return logits

    def _embedded(self, tokens: torch.Tensor, offset: int) -> torch.Tensor:
        """Token embeddings (§3.4) with the positional encoding from `offset` on."""
        x = self.embedding(tokens) * math.sqrt(self.config.d_model)  # (B, L, d_model)
        if self.positional_encoding is not None:
            x = self.positional_encoding(x, offset)
        embedded: torch.Tensor = self.embedding_dropout(x)
        return embedded

    def _decoded_from_last(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None, positions: torch.Tensor | None
    ) -> torch.Tensor:
        """Target "token_from_last": logits (B, L, C), or (P, C) at `positions`, each from
        the last real position's state and the sinusoid of the position asked for."""
        batch, length = x.shape[:2]
        last = torch.full((batch,), length - 1, device=x.device)  # (B,)
        if attention_mask is not None:  # the last real token, wherever the padding is
            last = last - attention_mask.flip(1).int().argmax(dim=1)
        encoding = self._read_out(x[torch.arange(batch, device=x.device), last])  # (B, d_model)
        table = self.decoder_positions
        if length > table.shape[0]:  # longer than the model was built for: the same formula
            table = sinusoids(length, x.shape[-1])
        table = table[:length].to(x.device, x.dtype)  # (L, d_model)
        if positions is None:
            decoded = encoding[:, None] + table  # (B, L, d_model)
        else:  # row-major, as x[positions] orders them
            rows, columns = positions.nonzero(as_tuple=True)
            decoded = encoding[rows] + table[columns]  # (P, d_model)
        logits: torch.Tensor = self.head(self.decoder(decoded))  # (B, L, C) | (P, C)
        return logits

    def _read_out(self, x: torch.Tensor) -> torch.Tensor:
        """The last feed-forward sublayer and the final norm, on the rows (…, d_model)."""
        normed: torch.Tensor = self.final_norm(self._encoder_layers[-1].feed(x))
        return normed


@dataclass
class ModelState:
    """A model's decoding state: each layer's attention state, and the tokens so far."""

    layers: list[DecodingState]
    length: int
    """Tokens so far, padding included: the next token's position."""

    @property
    def nbytes(self) -> int:
        return sum(state.nbytes for state in self.layers)


def describe(model: TransformerClassifier) -> dict[str, Any]:
    """What a result row should say about the model."""
    config = dataclasses.asdict(model.config)
    config["parameters"] = sum(p.numel() for p in model.parameters())  # shared ones once
    config["shared_across_layers"] = model.shared
    config["positional_encoding_used"] = model.positional_encoding is not None
    return config
