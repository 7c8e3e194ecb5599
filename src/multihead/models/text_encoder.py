"""A text encoder (BERT's ``BertModel`` in our modules): token ids -> embeddings -> encoder blocks -> token states.

Embeddings are ``word + position (+ token type)``; BERT-family models then apply a LayerNorm and dropout
(``embed_norm=True``), the tutorial's model adds positions with dropout and no norm. The classifier
(:class:`multihead.TransformerClassifier`) is this encoder plus pooling and a linear head, with the same parameter
names, so a pretrained encoder's weights load into it directly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._config import check_size, from_fields

from ..modules.encoder import EncoderConfig, TransformerEncoder
from ..modules.hooks import HookPoint
from ..modules.positional import build_positional

POOLINGS = ("mean", "cls", "max")
POSITIONALS = ("sinusoidal", "learned", "rope", "none")


@dataclass
class TextEncoderConfig:
    """Everything that defines a :class:`TextEncoder`; round-trips through JSON."""

    vocab_size: int = 10000
    max_len: int = 512  # longest input in tokens (the size of a learned position table)
    positional: str = "sinusoidal"  # sinusoidal | learned | rope | none; sets encoder.rotary (rope: on, tables: off)
    pooling: str = "mean"  # mean over real tokens | cls (first token) | max over real tokens
    pad_id: int | None = 0  # token id treated as padding when no attention_mask is given (None: no padding)
    embed_init_std: float | None = None  # None: PyTorch's N(0, 1) (the tutorial's nn.Embedding)
    type_vocab_size: int = 0  # >0: BERT's token-type (segment) embeddings
    embed_norm: bool = False  # LayerNorm (eps = encoder.layer_norm_eps) then dropout on the summed embeddings (BERT)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {POOLINGS}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; choose one of {POSITIONALS}")
        if self.vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {self.vocab_size}")
        if self.positional == "rope":
            self.encoder.rotary = True
        elif self.positional in ("learned", "sinusoidal"):  # an additive table replaces rotary (e.g. a rope config
            self.encoder.rotary = False  # overridden with positional=learned must not keep rotating q and k)

    def parameter_estimate(self) -> int:
        """About how many parameters this config builds (embeddings and blocks; exact up to norms and biases):
        checked against the ``MULTIHEAD_MAX_PARAMETERS`` ceiling before any tensor is allocated."""
        e, enc = self.encoder.d_model, self.encoder
        d_ff = enc.d_ff or 4 * e
        positions = self.max_len * e if self.positional == "learned" else 0
        per_layer = 4 * e * e + 2 * e * d_ff + 4 * e + d_ff
        return (self.vocab_size + self.type_vocab_size) * e + positions + enc.num_layers * per_layer

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict, where: str = ""):
        return from_fields(cls, d, where)

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(json.loads(text))


class TextEncoder(nn.Module):
    """Token ids ``(B, L)`` -> token states ``(B, L, E)``; :meth:`sentence_embeddings` gives pooled sentence vectors ``(B, E)``.

    Hook points: ``hook_embed`` ``(B, L, E)`` (the encoder's input) and those of every block under
    ``encoder.layers.{i}.`` (e.g. ``encoder.layers.0.attn.hook_pattern`` ``(B, H, L, L)``).
    """

    def __init__(self, config: TextEncoderConfig) -> None:
        super().__init__()
        check_size(config.parameter_estimate(), "the model")  # before anything is allocated
        self.config = config
        e = config.encoder.d_model
        self.embed = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_id)
        if config.embed_init_std is not None:
            nn.init.normal_(self.embed.weight, std=config.embed_init_std)
            if config.pad_id is not None:
                with torch.no_grad():
                    self.embed.weight[config.pad_id].zero_()
        # With embed_norm the dropout comes after the norm (BERT), so the positional module adds none.
        pe_dropout = 0.0 if config.embed_norm else config.encoder.dropout
        self.pe = build_positional(config.positional, e, config.max_len, pe_dropout)
        self.token_type = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size > 0 else None
        if self.token_type is not None and config.embed_init_std is not None:
            nn.init.normal_(self.token_type.weight, std=config.embed_init_std)
        self.embed_norm = nn.LayerNorm(e, eps=config.encoder.layer_norm_eps) if config.embed_norm else None
        self.embed_dropout = nn.Dropout(config.encoder.dropout) if config.embed_norm else None
        self.hook_embed = HookPoint()
        self.encoder = TransformerEncoder(config.encoder)

    def keep_mask(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        """Bool ``(B, L)``, True = real token: ``attention_mask`` or ``input_ids != pad_id`` (None: no padding)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, L) token ids, got shape {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be integer token ids, got {input_ids.dtype}")
        b, l = input_ids.shape
        if l > self.config.max_len:
            raise ValueError(
                f"sequence length {l} exceeds max_len={self.config.max_len}; truncate the input "
                "or build the model with a larger max_len"
            )
        if attention_mask is None:
            return (input_ids != self.config.pad_id) if self.config.pad_id is not None else None
        if attention_mask.shape != (b, l):
            raise ValueError(
                f"attention_mask must be (B, L)=({b}, {l}), True/1 = real token, got {tuple(attention_mask.shape)}"
            )
        return attention_mask.bool()

    def embeddings(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """``(B, L)`` ids -> ``(B, L, E)``: word + position (+ token type) embeddings (then LayerNorm, dropout)."""
        x = self.embed(input_ids)  # (B, L, E)
        if self.pe is not None:
            x = self.pe(x)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type(token_type_ids)  # (B, L, E)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given but the model has no token-type embeddings (type_vocab_size=0)")
        if self.embed_norm is not None:
            x = self.embed_dropout(self.embed_norm(x))
        return self.hook_embed(x)

    def features(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        head_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Token states ``(B, L, E)`` and the bool real-token mask ``(B, L)``. Padded positions hold zeros on the
        unpadded fast path (they are never computed); only real positions are meaningful."""
        b, l = input_ids.shape if input_ids.dim() == 2 else (0, 0)
        keep = self.keep_mask(input_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids)  # (B, L, E)
        if keep is not None and bool(keep.all()):
            keep = None  # no padding: let the kernel run mask-free
        x = self.encoder(x, key_padding_mask=keep, head_mask=head_mask)  # (B, L, E)
        if keep is None:
            keep = torch.ones(b, l, dtype=torch.bool, device=x.device)
        return x, keep

    def pool(self, x: Tensor, keep: Tensor) -> Tensor:
        """``(B, L, E)`` -> ``(B, E)``: mean or max over real tokens, or the first token."""
        if self.config.pooling == "cls":
            return x[:, 0]
        if self.config.pooling == "max":
            return x.masked_fill(~keep.unsqueeze(-1), torch.finfo(x.dtype).min).amax(dim=1)  # (B, E)
        w = keep.to(x.dtype).unsqueeze(-1)  # (B, L, 1)
        return (x * w).sum(1) / w.sum(1).clamp_min(1e-9)  # (B, E)

    def sentence_embeddings(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        normalize: bool = True,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Sentence embeddings ``(B, E)``: pooled token states (``config.pooling``), L2-normalised by default
        (sentence-transformers' ``Pooling`` + ``Normalize``)."""
        x, keep = self.features(input_ids, attention_mask, token_type_ids=token_type_ids)
        pooled = self.pool(x, keep)
        return F.normalize(pooled, p=2, dim=-1) if normalize else pooled

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        head_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """``input_ids`` ``(B, L)``; ``attention_mask`` ``(B, L)`` True/1 = real token (default: ids != pad_id);
        ``head_mask`` ``(num_layers, H)``. Returns token states ``(B, L, E)``."""
        return self.features(input_ids, attention_mask, head_mask, token_type_ids)[0]


__all__ = ["POOLINGS", "POSITIONALS", "TextEncoder", "TextEncoderConfig"]
