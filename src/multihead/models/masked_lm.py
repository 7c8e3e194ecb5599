"""A masked language model: our :class:`TextEncoder` plus BERT's prediction head (HF ``BertForMaskedLM``).

Head: ``dense (E -> E) -> GELU -> LayerNorm -> decoder (E -> V)`` with the decoder's weight tied to the word
embeddings and a bias of its own. The head is only applied where a prediction is asked for (the ~15% masked
positions), not to every token: the ``(B, L, V)`` logits would cost ~7x the head's useful work.

The encoder keeps its own parameter names under ``encoder.``, so after pretraining
:func:`multihead.pretrained.export` writes ``model.encoder`` as an HF ``BertModel`` folder that
``multihead train --init`` fine-tunes like MiniLM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .text_encoder import TextEncoder, TextEncoderConfig


class MLMHead(nn.Module):
    def __init__(self, config: TextEncoderConfig, embed: nn.Embedding) -> None:
        super().__init__()
        e = config.encoder.d_model
        self.dense = nn.Linear(e, e)
        self.norm = nn.LayerNorm(e, eps=config.encoder.layer_norm_eps)
        self.embed = embed  # tied: the decoder's weight is the word-embedding table
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor) -> Tensor:
        """``(..., E)`` states -> ``(..., V)`` logits."""
        return F.linear(self.norm(F.gelu(self.dense(h))), self.embed.weight, self.bias)


class MaskedLM(nn.Module):
    """``forward(ids, attention_mask, select)`` -> logits ``(N, V)`` at the ``select``-ed positions (bool ``(B, L)``),
    or ``(B, L, V)`` when ``select`` is None."""

    def __init__(self, config: TextEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = TextEncoder(config)
        self.head = MLMHead(config, self.encoder.embed)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, select: Tensor | None = None) -> Tensor:
        h = self.encoder(input_ids, attention_mask)  # (B, L, E)
        if select is not None:
            if select.shape != input_ids.shape:
                raise ValueError(
                    f"select must be a (B, L) bool mask like input_ids {tuple(input_ids.shape)}, got "
                    f"{tuple(select.shape)}"
                )
            h = h[select]  # (N, E)
        return self.head(h)


__all__ = ["MLMHead", "MaskedLM"]
