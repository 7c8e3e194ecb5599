"""The tutorial's end-to-end model: token ids -> embedding -> positions -> encoder blocks -> pooling -> linear."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import Tensor, nn

from ..modules.encoder import EncoderConfig, TransformerEncoder
from ..modules.positional import build_positional

POOLINGS = ("mean", "cls", "max")
POSITIONALS = ("sinusoidal", "learned", "rope", "none")


@dataclass
class ClassifierConfig:
    """Everything that defines a :class:`TransformerClassifier`; round-trips through JSON."""

    vocab_size: int = 10000
    num_classes: int = 10
    max_len: int = 512
    positional: str = "sinusoidal"  # sinusoidal | learned | rope | none
    pooling: str = "mean"  # mean over real tokens | cls (first token) | max over real tokens
    pad_id: int | None = 0  # token id treated as padding when no attention_mask is given (None: no padding)
    embed_init_std: float | None = None  # None: PyTorch's N(0, 1) (the tutorial's nn.Embedding)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {POOLINGS}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; choose one of {POSITIONALS}")
        if self.vocab_size <= 0 or self.num_classes <= 0:
            raise ValueError(f"vocab_size ({self.vocab_size}) and num_classes ({self.num_classes}) must be positive")
        if self.positional == "rope":
            self.encoder.rotary = True

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "ClassifierConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ClassifierConfig fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "ClassifierConfig":
        return cls.from_dict(json.loads(text))


class TransformerClassifier(nn.Module):
    """Text classifier with the tutorial's signature and defaults.

    ``TransformerClassifier(vocab_size=10000, d_model=512, heads=8, num_layers=2, num_classes=10)``; any other
    :class:`ClassifierConfig` / :class:`EncoderConfig` field may be passed by keyword, or build from a config with
    :meth:`from_config`. Unlike the tutorial's ``x.mean(dim=1)``, pooling averages real tokens only.

    Hook points: those of every block, under ``encoder.layers.{i}.`` (e.g. ``encoder.layers.0.attn.hook_pattern``).
    """

    def __init__(self, vocab_size: int = 10000, d_model: int = 512, heads: int = 8, num_layers: int = 2,
                 num_classes: int = 10, *, config: ClassifierConfig | None = None, **kwargs) -> None:
        super().__init__()
        if config is None:
            enc_keys = {f.name for f in fields(EncoderConfig)}
            enc_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in enc_keys}
            encoder = EncoderConfig(d_model=d_model, num_heads=heads, num_layers=num_layers, **enc_kwargs)
            config = ClassifierConfig(vocab_size=vocab_size, num_classes=num_classes, encoder=encoder, **kwargs)
        elif kwargs:
            raise TypeError(f"pass either config= or keyword options, not both (got {sorted(kwargs)})")
        self.config = config
        e = config.encoder.d_model
        self.embed = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_id)
        if config.embed_init_std is not None:
            nn.init.normal_(self.embed.weight, std=config.embed_init_std)
            if config.pad_id is not None:
                with torch.no_grad():
                    self.embed.weight[config.pad_id].zero_()
        self.pe = build_positional(config.positional, e, config.max_len, config.encoder.dropout)
        self.encoder = TransformerEncoder(config.encoder)
        self.fc = nn.Linear(e, config.num_classes)

    @classmethod
    def from_config(cls, config: ClassifierConfig | dict) -> "TransformerClassifier":
        if isinstance(config, dict):
            config = ClassifierConfig.from_dict(config)
        return cls(config=config)

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                 head_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Token states ``(B, L, E)`` and the bool real-token mask ``(B, L)`` used for pooling."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, L) token ids, got shape {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be integer token ids, got {input_ids.dtype}")
        b, l = input_ids.shape
        if l > self.config.max_len:
            raise ValueError(f"sequence length {l} exceeds max_len={self.config.max_len}; truncate the input "
                             "or build the model with a larger max_len")
        if attention_mask is None:
            keep = (input_ids != self.config.pad_id) if self.config.pad_id is not None else None
        else:
            if attention_mask.shape != (b, l):
                raise ValueError(f"attention_mask must be (B, L)=({b}, {l}), True/1 = real token, "
                                 f"got {tuple(attention_mask.shape)}")
            keep = attention_mask.bool()
        x = self.embed(input_ids)  # (B, L, E)
        if self.pe is not None:
            x = self.pe(x)
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
        return (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (B, E)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                head_mask: Tensor | None = None) -> Tensor:
        """``input_ids`` ``(B, L)``; ``attention_mask`` ``(B, L)`` True/1 = real token (default: ids != pad_id);
        ``head_mask`` ``(num_layers, H)``. Returns logits ``(B, num_classes)``."""
        x, keep = self.features(input_ids, attention_mask, head_mask)
        return self.fc(self.pool(x, keep))
