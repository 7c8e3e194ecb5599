"""The tutorial's end-to-end model: token ids -> embedding -> positions -> encoder blocks -> pooling -> linear."""

from __future__ import annotations

from dataclasses import dataclass, fields

from torch import Tensor, nn

from ..modules.encoder import EncoderConfig
from .text_encoder import POOLINGS, POSITIONALS, TextEncoder, TextEncoderConfig


@dataclass
class ClassifierConfig(TextEncoderConfig):
    """A :class:`TextEncoderConfig` plus the number of classes; round-trips through JSON."""

    num_classes: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes <= 0:
            raise ValueError(f"num_classes must be positive, got {self.num_classes}")


class TransformerClassifier(TextEncoder):
    """Text classifier with the tutorial's signature and defaults.

    ``TransformerClassifier(vocab_size=10000, d_model=512, heads=8, num_layers=2, num_classes=10)``; any other
    :class:`ClassifierConfig` / :class:`EncoderConfig` / :class:`AttentionConfig` field may be passed by keyword, or
    build from a config with :meth:`from_config`. Unlike the tutorial's ``x.mean(dim=1)``, pooling averages real
    tokens only.

    It is a :class:`TextEncoder` (same parameter names) with a linear head ``fc`` on the pooled states, so weights
    of a pretrained encoder load into it (``multihead train --init minilm``).

    Hook points: ``hook_embed`` and those of every block, under ``encoder.layers.{i}.``
    (e.g. ``encoder.layers.0.attn.hook_pattern``).
    """

    def __init__(
        self,
        vocab_size: int = 10000,
        d_model: int = 512,
        heads: int = 8,
        num_layers: int = 2,
        num_classes: int = 10,
        *,
        config: ClassifierConfig | None = None,
        **kwargs,
    ) -> None:
        if config is None:
            enc_keys = {f.name for f in fields(EncoderConfig)} | set(EncoderConfig.LEGACY_FIELDS)  # + attention's
            enc_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in enc_keys}
            encoder = EncoderConfig.from_dict(
                dict(d_model=d_model, num_heads=heads, num_layers=num_layers, **enc_kwargs)
            )
            config = ClassifierConfig(vocab_size=vocab_size, num_classes=num_classes, encoder=encoder, **kwargs)
        elif kwargs:
            raise TypeError(f"pass either config= or keyword options, not both (got {sorted(kwargs)})")
        super().__init__(config)
        self.fc = nn.Linear(config.encoder.d_model, config.num_classes)

    @classmethod
    def from_config(cls, config: ClassifierConfig | dict) -> TransformerClassifier:
        if isinstance(config, dict):
            config = ClassifierConfig.from_dict(config)
        return cls(config=config)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        head_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """``input_ids`` ``(B, L)``; ``attention_mask`` ``(B, L)`` True/1 = real token (default: ids != pad_id);
        ``head_mask`` ``(num_layers, H)``. Returns logits ``(B, num_classes)``."""
        x, keep = self.features(input_ids, attention_mask, head_mask, token_type_ids)
        return self.fc(self.pool(x, keep))


__all__ = ["POOLINGS", "POSITIONALS", "ClassifierConfig", "TransformerClassifier"]
