"""Text-image question answering through cross-attention: question tokens query image patches.

::

    canvas (B, C, H, W) -> VisionTransformer (no classifier head)  -> patches (B, N, E_img)   keys and values
    question (B, T)     -> word + position embeddings (B, T, E_txt) -> TransformerDecoder (causal=False):
                             self-attention over the question -> cross-attention to the patches -> FFN   (x layers)
                        -> mean over the question's tokens -> answer logits (B, answers)

The cross-attention is our :class:`~multihead.MultiHeadAttention` with ``kdim = vdim = E_img`` (the text and image
widths differ), inside the decoder's own :class:`~multihead.modules.decoder.DecoderBlock` with the causal mask off:
the same block, hooks, ``head_mask`` and pictures as every other role. The answer is read from the text stream
only, so everything the model knows about the image has passed through the cross-attention heads: masking them all
(``cross_head_mask``) leaves the question alone, i.e. chance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from .._config import check_rules, check_size, from_fields
from ..modules.decoder import DecoderConfig, TransformerDecoder
from ..modules.encoder import EncoderConfig
from ..modules.hooks import HookPoint
from .vision import VisionConfig, VisionTransformer


def _default_vision() -> VisionConfig:
    # 2-D sine-cosine positions: "what is at the top left?" is a question about places, and fixed positions give the
    # keys their place from the first step. (Measured on Fashion-MNIST canvases: both learned and sine-cosine
    # positions sit at the question-only loss for the first ~800 steps; the sine-cosine run then broke through;
    # the learned one was not run that long.)
    return VisionConfig(
        image_size=56,
        patch_size=7,
        stem="patch",
        pooling="mean",
        positional="sincos",
        num_classes=0,
        encoder=EncoderConfig(
            d_model=128, num_heads=4, num_layers=3, d_ff=256, dropout=0.0, activation="gelu", norm_first=True
        ),
    )


def _default_text() -> DecoderConfig:
    return DecoderConfig(
        d_model=64, num_heads=4, num_layers=2, d_ff=128, dropout=0.0, activation="gelu", norm_first=True, causal=False
    )


@dataclass
class GroundingConfig:
    """Everything that defines a :class:`GroundedQA`; round-trips through JSON. ``text.memory_dim`` is the image
    width (set from ``vision``)."""

    vocab_size: int = 24
    max_question: int = 7
    num_answers: int = 14
    vision: VisionConfig = field(default_factory=_default_vision)
    text: DecoderConfig = field(default_factory=_default_text)

    def __post_init__(self) -> None:
        if isinstance(self.vision, dict):
            self.vision = VisionConfig.from_dict(self.vision, "vision")
        if isinstance(self.text, dict):
            self.text = DecoderConfig.from_dict(self.text)
        check_rules(
            [
                ("vocab_size", 2 <= self.vocab_size <= 100_000, "in [2, 100000]"),
                ("max_question", 1 <= self.max_question <= 512, "in [1, 512]"),
                ("num_answers", self.num_answers >= 2, ">= 2"),
                ("vision.num_classes", self.vision.num_classes == 0, "0 (the ViT is the image encoder here)"),
                ("vision.pooling", self.vision.pooling == "mean", "mean (the keys are the patches; no [CLS] token)"),
                ("text.cross_attention", self.text.cross_attention, "true (the question reads the image through it)"),
                ("text.causal", not self.text.causal, "false (the question is read whole)"),
                ("text.d_model", self.text.d_model % self.text.num_heads == 0, "a multiple of text.num_heads"),
            ]
        )
        self.text.memory_dim = self.vision.encoder.d_model

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "") -> GroundingConfig:
        return from_fields(cls, d, where)

    def parameter_estimate(self) -> int:
        t = self.text
        per_layer = 2 * 4 * t.d_model**2 + 2 * t.d_model * (t.d_ff or 4 * t.d_model)
        return (
            self.vision.parameter_estimate()
            + (self.vocab_size + self.max_question) * t.d_model
            + t.num_layers * per_layer
            + t.d_model * self.num_answers
        )


class GroundedQA(nn.Module):
    """``model(canvases, questions)`` -> answer logits ``(B, answers)``; ``questions`` ``(B, T)`` word ids, 0 = padding.

    Hook points: the ViT's under ``vision.``, the question stack's under ``text.layers.{i}.``
    (``text.layers.0.cross_attn.hook_pattern`` ``(B, H, T, N)``: which patches each question token reads), and
    ``hook_question`` ``(B, E_txt)`` (the pooled question the answer is read from).
    """

    def __init__(self, config: GroundingConfig) -> None:
        super().__init__()
        check_size(config.parameter_estimate(), "the model")
        self.config = config
        e = config.text.d_model
        self.vision = VisionTransformer(config.vision)
        self.embed = nn.Embedding(config.vocab_size, e, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, config.max_question, e) * 0.02)
        self.text = TransformerDecoder(config.text)
        self.hook_question = HookPoint()
        self.fc = nn.Linear(e, config.num_answers)

    def forward(
        self,
        images: Tensor,
        questions: Tensor,
        *,
        head_mask: Tensor | None = None,
        cross_head_mask: Tensor | None = None,
    ) -> Tensor:
        """``head_mask``: the ViT's heads (one row per layer); ``cross_head_mask``: the question stack's
        cross-attention heads (one row per layer; all zeros cuts the image off)."""
        c = self.config
        if questions.dim() != 2 or questions.dtype != torch.long:
            raise ValueError(f"questions must be (B, T) int64 word ids; got {tuple(questions.shape)} {questions.dtype}")
        if questions.shape[1] > c.max_question or questions.shape[0] != images.shape[0]:
            raise ValueError(
                f"questions {tuple(questions.shape)} must have the images' batch ({images.shape[0]}) and "
                f"at most {c.max_question} tokens"
            )
        if questions.numel() and (int(questions.min()) < 0 or int(questions.max()) >= c.vocab_size):
            raise ValueError(
                f"question ids must be in [0, {c.vocab_size}); got {int(questions.min())}..{int(questions.max())}"
            )
        patches = self.vision.features(images, head_mask)  # (B, N, E_img)
        real = questions != 0  # (B, T)
        x = self.embed(questions) + self.pos[:, : questions.shape[1]]
        x = self.text(x, patches, key_padding_mask=real, cross_head_mask=cross_head_mask)  # (B, T, E_txt)
        w = real.unsqueeze(-1).to(x.dtype)
        pooled = self.hook_question((x * w).sum(1) / w.sum(1).clamp_min(1))
        return self.fc(pooled)

    @property
    def cross_heads(self) -> list[int]:
        return [layer.cross_attn.num_heads for layer in self.text.layers]


def quadrant_of_patches(vision: VisionConfig) -> Tensor:
    """``(N,)`` the canvas quadrant (0 top left, 1 top right, 2 bottom left, 3 bottom right) of each patch. Patches
    that straddle the middle (odd grids) count for the quadrant holding their centre."""
    g, p, half = vision.grid, vision.patch_size, vision.image_size / 2
    centre = torch.arange(g) * p + (p - 1) / 2
    row = (centre >= half).long()
    return (row[:, None] * 2 + row[None, :]).flatten()


def grounding_share(patterns: list[Tensor], questions: Tensor, quadrant: Tensor, vision: VisionConfig) -> Tensor:
    """Per cross-attention layer and head, the share of the question tokens' attention that falls on the patches of
    the quadrant the question is about, averaged over real tokens and canvases: ``(layers, H)`` in [0, 1] (chance
    0.25). ``patterns``: each layer's ``(B, H, T, N)``; ``quadrant`` ``(B,)``."""
    quad = quadrant_of_patches(vision)  # (N,)
    on = (quad[None, :] == quadrant[:, None]).double()  # (B, N)
    real = (questions != 0).double()  # (B, T)
    out = []
    for p in patterns:
        share = (p.double() * on[:, None, None, :]).sum(-1)  # (B, H, T)
        per = (share * real[:, None]).sum(-1) / real.sum(-1)[:, None]  # (B, H)
        out.append(per.mean(0))
    return torch.stack(out).float()


__all__ = ["GroundedQA", "GroundingConfig", "grounding_share", "quadrant_of_patches"]
