"""Encoder block and stack: x -> MHA -> residual + LayerNorm -> FFN -> residual + LayerNorm (post-LN, the tutorial's),
or the pre-LN variant with ``norm_first=True``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from collections.abc import Sequence
from typing import ClassVar

import torch

from torch import Tensor, nn

from .._config import from_fields

from .attention import MultiHeadAttention
from .feedforward import FeedForward
from .hooks import HookPoint
from .positional import Rotary, RotaryEmbedding
from .variants import LEGACY_FIELDS, AttentionConfig


@dataclass
class EncoderConfig:
    """Everything that defines an encoder stack; saved as JSON beside each checkpoint."""

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 2
    d_ff: int | None = None  # default 4 * d_model
    dropout: float = 0.1  # residual and FFN dropout
    activation: str = "relu"
    norm_first: bool = False  # False: post-LN (tutorial, BERT); True: pre-LN
    layer_norm_eps: float = 1e-5
    bias: bool = True
    rotary: bool = False  # rotary position embedding inside attention
    unpad: bool = True  # with padding, run projections, FFN and norms on real tokens only (same result, less work)
    pruned_heads: dict[int, list[int]] | None = None  # layer -> removed heads (original numbering); see prune_heads
    # LayerScale (Touvron et al. 2021, CaiT; DINOv2): each sublayer's output scaled per channel by a learned vector
    # initialised at this value; None: no scale
    layer_scale: float | None = None
    attention: AttentionConfig = field(default_factory=AttentionConfig)  # heads (GQA), backend, pattern, variant
    LEGACY_FIELDS: ClassVar[dict] = LEGACY_FIELDS  # the flat fields of older config.json files, read into attention

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig.from_dict(self.attention)
        if self.attention.mla_latent:
            raise ValueError(
                "Multi-head Latent Attention caches a decoder's keys and values; an encoder has no cache: "
                "set attention.mla_latent=0 (use a decoder for MLA)"
            )
        if self.layer_scale is not None and not self.norm_first:
            raise ValueError("layer_scale scales the sublayers of pre-LN blocks: set norm_first=True")
        if self.pruned_heads:  # JSON turns the layer keys into strings
            self.pruned_heads = {int(k): sorted(int(h) for h in v) for k, v in self.pruned_heads.items()}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EncoderConfig:
        return from_fields(cls, d)


class EncoderBlock(nn.Module):
    """One Transformer encoder layer over ``(B, L, E)``.

    Post-LN (default, as the tutorial and BERT): ``x = LN(x + Drop(MHA(x)))``; ``x = LN(x + Drop(FFN(x)))``.
    Pre-LN (``norm_first=True``): ``x = x + Drop(MHA(LN(x)))``; ``x = x + Drop(FFN(LN(x)))``.

    With ``layer_scale``, each sublayer's output is multiplied by a learned per-channel vector (``ls1``, ``ls2``)
    before the residual add: ``x = x + Drop(ls1 * MHA(LN(x)))``.

    Hook points: ``hook_attn_out`` ``(B, L, E)`` (attention output, layer-scaled, before the residual),
    ``hook_mlp_out``, ``hook_resid_post``; and the attention's own under ``attn.``.
    """

    attn: MultiHeadAttention
    ls1: nn.Parameter | None
    ls2: nn.Parameter | None

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        *,
        attention: AttentionConfig | None = None,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        rotary: Rotary | None = None,
        layer_index: int = 0,
        layer_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        attention = AttentionConfig() if attention is None else attention
        attn = attention.build(d_model, num_heads, bias=bias, rotary=rotary, layer_index=layer_index)
        if not isinstance(attn, MultiHeadAttention):
            raise ValueError("an encoder block has no key/value cache for MLA: set attention.mla_latent=0")
        self.attn = attn
        self.ffn = FeedForward(d_model, d_ff, dropout, activation, bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        if layer_scale is not None:
            self.ls1 = nn.Parameter(torch.full((d_model,), float(layer_scale)))
            self.ls2 = nn.Parameter(torch.full((d_model,), float(layer_scale)))
        else:
            self.ls1 = self.ls2 = None
        self.hook_attn_out = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        head_mask: Tensor | None = None,
    ) -> Tensor:
        """``x`` ``(B, L, E)``; masks as in :meth:`MultiHeadAttention.forward` (True = may attend / real token), or
        an :class:`~multihead.attention.attn_mask.AttnMask` in ``mask``."""

        return self._residuals(
            x,
            lambda h: self.attn(
                h,
                mask=mask,
                key_padding_mask=key_padding_mask,
                is_causal=is_causal,
                head_mask=head_mask,
                need_weights=False,
            )[0],
        )

    def forward_packed(self, x: Tensor, index: Tensor, keep: Tensor, *, head_mask: Tensor | None = None) -> Tensor:
        """The same block on packed real tokens ``x`` ``(N, E)`` (see :meth:`MultiHeadAttention.forward_packed`).
        The encoder takes this path only while no block-level hook is attached."""
        return self._residuals(x, lambda h: self.attn.forward_packed(h, index, keep, head_mask=head_mask))

    def _residuals(self, x: Tensor, attend) -> Tensor:
        """Attention and FFN sub-layers with residuals and LayerNorm, post-LN or pre-LN; ``attend(h) -> (.., E)``."""
        if self.norm_first:
            if self.ls1 is not None:
                x = x + self.dropout1(self.hook_attn_out(self.ls1 * attend(self.norm1(x))))
                x = x + self.dropout2(self.hook_mlp_out(self.ls2 * self.ffn(self.norm2(x))))
            else:
                x = x + self.dropout1(self.hook_attn_out(attend(self.norm1(x))))
                x = x + self.dropout2(self.hook_mlp_out(self.ffn(self.norm2(x))))
        else:
            x = self.norm1(x + self.dropout1(self.hook_attn_out(attend(x))))
            x = self.norm2(x + self.dropout2(self.hook_mlp_out(self.ffn(x))))
        return self.hook_resid_post(x)

    @property
    def block_hooks_active(self) -> bool:
        return self.hook_attn_out.active or self.hook_mlp_out.active or self.hook_resid_post.active


class TransformerEncoder(nn.Module):
    """A stack of :class:`EncoderBlock` over embeddings ``(B, L, E)`` (positions are added by the caller, except
    rotary ones, which live inside attention). Pre-LN stacks end with a final LayerNorm."""

    layers: Sequence[EncoderBlock]  # an nn.ModuleList of them

    def __init__(self, config: EncoderConfig | None = None, **overrides) -> None:
        super().__init__()
        config = EncoderConfig.from_dict(overrides) if config is None else config  # flat attention fields read too
        self.config = config
        head_dim = config.attention.head_dim or config.d_model // config.num_heads
        rotary = RotaryEmbedding(config.attention.rotary_dim(head_dim)) if config.rotary else None
        self.layers = nn.ModuleList(  # type: ignore[assignment]  # (the Sequence above)
            EncoderBlock(
                config.d_model,
                config.num_heads,
                config.d_ff,
                config.dropout,
                attention=config.attention,
                activation=config.activation,
                norm_first=config.norm_first,
                layer_norm_eps=config.layer_norm_eps,
                bias=config.bias,
                rotary=rotary,
                layer_index=i,
                layer_scale=config.layer_scale,
            )
            for i in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        recorded, config.pruned_heads = config.pruned_heads, None
        if recorded:  # a pruned model rebuilt from its config: same shapes as the saved weights
            self.prune_heads(recorded)

    def prune_heads(self, heads: dict[int, list[int]]) -> None:
        """Remove heads physically: ``{layer: [head, ...]}`` in the *original* numbering (as HF's ``prune_heads``;
        heads already gone are ignored). Q/K/V/output projections shrink (GQA-aware, see
        :meth:`MultiHeadAttention.prune_heads`); a layer may lose every head. ``config.pruned_heads`` records the
        result, so the config saved beside a checkpoint rebuilds the same shapes."""
        for layer, hs in heads.items():
            layer = int(layer)
            if not 0 <= layer < len(self.layers):
                raise ValueError(f"layer {layer} does not exist; the encoder has {len(self.layers)} layers")
            attn = self.layers[layer].attn
            total = attn.num_heads + len(attn.pruned_heads)
            bad = [h for h in hs if not 0 <= int(h) < total]
            if bad:
                raise ValueError(f"layer {layer} has heads 0..{total - 1} (original numbering); got {bad}")
            current = [h for h in range(total) if h not in attn.pruned_heads]  # original index of each current head
            attn.prune_heads([current.index(int(h)) for h in hs if int(h) in current])
        done = {i: list(layer.attn.pruned_heads) for i, layer in enumerate(self.layers) if layer.attn.pruned_heads}
        self.config.pruned_heads = done or None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        head_mask: Tensor | None = None,
    ) -> Tensor:
        """``x`` ``(B, L, E)``; ``head_mask`` ``(num_layers, H)``, or a list of per-layer ``(H_l,)`` when pruning left
        layers with different head counts, or None: one scale per layer and head."""
        if head_mask is not None and len(head_mask) != len(self.layers):
            raise ValueError(f"head_mask must have one row per layer ({len(self.layers)}), got {len(head_mask)} rows")
        if (
            self.config.unpad
            and key_padding_mask is not None
            and mask is None
            and not is_causal
            and key_padding_mask.dtype == torch.bool
            and key_padding_mask.dim() == 2
            and not any(layer.block_hooks_active for layer in self.layers)
        ):
            return self._forward_unpadded(x, key_padding_mask, head_mask)
        # the structured mask, built once here and passed unchanged to every layer (validated once, in the seam)
        attn_mask = self.layers[0].attn.build_mask(mask, key_padding_mask, is_causal) if len(self.layers) else None
        for i, layer in enumerate(self.layers):
            x = layer(x, attn_mask, head_mask=None if head_mask is None else head_mask[i])
        return x if self.final_norm is None else self.final_norm(x)

    def _forward_unpadded(self, x: Tensor, keep: Tensor, head_mask: Tensor | None) -> Tensor:
        """Pack the real tokens once, run every block on them, scatter back; padded positions come out as zeros.

        Per-token work (projections, FFN, norms: >90% of the FLOPs at L=128, d=256) then scales with the real
        tokens, not the padded batch, as PyTorch's nested-tensor fast path does in inference; it works in
        training too. Block-level hook points need the padded layout, so an attached hook disables this path."""
        b, l, e = x.shape
        index = keep.reshape(-1).nonzero().squeeze(1)  # (N,)
        packed = x.reshape(b * l, e).index_select(0, index)  # (N, E)
        for i, layer in enumerate(self.layers):
            packed = layer.forward_packed(packed, index, keep, head_mask=None if head_mask is None else head_mask[i])
        if self.final_norm is not None:
            packed = self.final_norm(packed)
        return packed.new_zeros(b * l, e).index_copy(0, index, packed).view(b, l, e)  # (B, L, E)

    @property
    def num_heads(self) -> list[int]:
        """Heads per layer (differs between layers after pruning)."""
        return [layer.attn.num_heads for layer in self.layers]


__all__ = ["EncoderBlock", "EncoderConfig", "TransformerEncoder"]
