"""Decoder block and stack: masked (causal) self-attention -> cross-attention to an encoder's output -> FFN, each
with a residual and LayerNorm (post-LN as the tutorial's encoder block, or pre-LN with ``norm_first=True``).

The same :class:`MultiHeadAttention` in its two other roles: causal self-attention (queries may attend only to keys
at or before their own position) and encoder-decoder cross-attention (queries from the decoder, keys and values from
the encoder's output, the annotated transformer's ``mha(q, k, v, mask)``). Without cross-attention
(``cross_attention=False``) the block is a decoder-only (GPT-style) layer. Incremental decoding passes a
:class:`~multihead.modules.kv.KVCache`.

Shape legend: ``B`` batch, ``T`` target (decoder) positions this call, ``S`` source positions, ``E`` d_model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from .._config import from_fields
from ..attention.attn_mask import AttnMask
from ..attention.patterns import SparsePattern
from .attention import alibi_slope_values
from .variants import LEGACY_FIELDS, AttentionConfig
from .feedforward import NORMS, FeedForward, check_activation, make_norm
from .hooks import HookPoint
from .kv import KVCache, LayerKV
from .positional import Rotary, RotaryEmbedding


@dataclass
class DecoderConfig:
    """Everything that defines a decoder stack; saved as JSON beside each checkpoint."""

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 2
    d_ff: int | None = None  # default 4 * d_model; 0 = attention-only blocks (no FFN), as in Olsson et al.'s toy models
    dropout: float = 0.1
    activation: str = "relu"
    norm_first: bool = False
    layer_norm_eps: float = 1e-5
    bias: bool = True
    rotary: bool = False  # rotary positions in the causal self-attention
    cross_attention: bool = True  # False: decoder-only (no encoder)
    causal: bool = True  # False: the targets see each other both ways (a question read whole, as in a Q-Former)
    memory_dim: int | None = None  # width of the memory (kdim = vdim of cross-attention), default d_model
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm, as Llama/Qwen/Mistral)
    out_bias: bool | None = None  # bias on the attention output projection; default `bias` (Qwen2: False)
    ffn_bias: bool | None = None  # biases in the FFN; default `bias`
    rope_theta: float = 10000.0  # rotary base (SmolLM2: 1e5, Llama 3: 5e5)
    rope_scaling: dict | None = None  # HF's rope_scaling: {"rope_type": "linear"|"llama3"|"yarn", "factor": ...}
    sandwich_norm: bool = False  # also normalise each sublayer's output before the residual add (Gemma 2/3)
    sliding_window: int | None = None  # local layers: query i sees keys j with i - window < j <= i (Gemma 3)
    global_every: int = 0  # with sliding_window: every Nth layer (index N-1, 2N-1, ...) is global; 0: none is
    rope_local_theta: float | None = None  # the rotary base of the local layers (default rope_theta)
    # the self-attention: heads (GQA), backend, variant (gate, ALiBi, sinks, differential, talking heads, MLA); the
    # cross-attention takes its heads, dropout and backend
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    LEGACY_FIELDS: ClassVar[dict] = LEGACY_FIELDS  # the flat fields of older config.json files, read into attention

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig.from_dict(self.attention)
        if self.attention.pattern is not None:
            raise ValueError(
                "sparse patterns describe an encoder's self-attention; a decoder's causal attention "
                "takes none: drop attention.pattern"
            )
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}; choose one of {NORMS}")
        check_activation(self.activation)
        if self.sliding_window is not None and (self.sliding_window < 1 or not self.causal or self.cross_attention):
            raise ValueError(
                f"sliding_window={self.sliding_window}: a causal decoder-only stack takes a window of at least 1 key"
            )
        if self.global_every < 0:
            raise ValueError(f"global_every must be >= 0, got {self.global_every}")
        if self.sliding_window is not None and self.attention.mla_latent:
            raise ValueError("sliding-window layers are not supported with Multi-head Latent Attention")
        if self.rope_scaling is not None or self.rope_theta != 10000.0:
            from .positional import rope_frequencies

            rope_frequencies(2, self.rope_theta, self.rope_scaling)  # refuse a bad base or scaling now

    def is_local(self, layer: int) -> bool:
        """Whether ``layer`` attends through the sliding window (the others attend to every earlier key)."""
        if self.sliding_window is None:
            return False
        return not (self.global_every and layer % self.global_every == self.global_every - 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DecoderConfig:
        return from_fields(cls, d)


class DecoderBlock(nn.Module):
    """One Transformer decoder layer over ``(B, T, E)``.

    Post-LN: ``x = LN(x + Drop(SelfAttn(x, causal)))``; ``x = LN(x + Drop(CrossAttn(x, memory)))``;
    ``x = LN(x + Drop(FFN(x)))``. Pre-LN (``norm_first=True``) normalises each sub-layer's input instead.

    Hook points: ``hook_attn_out`` (self-attention output), ``hook_cross_out``, ``hook_mlp_out``, ``hook_resid_post``
    ``(B, T, E)``; and the attentions' own under ``self_attn.`` and ``cross_attn.`` (``hook_pattern`` of
    ``cross_attn`` is ``(B, H, T, S)``: which source positions each target position reads).
    """

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
        cross_attention: bool = True,
        memory_dim: int | None = None,
        layer_index: int = 0,
        norm: str = "layer",
        out_bias: bool | None = None,
        ffn_bias: bool | None = None,
        sandwich_norm: bool = False,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        attention = AttentionConfig() if attention is None else attention
        self.self_attn = attention.build(
            d_model,
            num_heads,
            bias=bias,
            rotary=rotary,
            layer_index=layer_index,
            out_bias=out_bias,
            norm_eps=layer_norm_eps,
        )
        self.cross_attn = (
            attention.cross.build(d_model, num_heads, bias=bias, kdim=memory_dim) if cross_attention else None
        )
        ffn_bias = bias if ffn_bias is None else ffn_bias
        self.ffn = FeedForward(d_model, d_ff, dropout, activation, ffn_bias) if d_ff != 0 else None  # 0: attention-only
        n = (3 if cross_attention else 2) - (self.ffn is None)
        self.norms = nn.ModuleList(make_norm(norm, d_model, layer_norm_eps) for _ in range(n))
        # Gemma's sandwich: each sublayer's output normalised again before the residual add (pre-LN blocks only)
        self.post_norms = (
            nn.ModuleList(make_norm(norm, d_model, layer_norm_eps) for _ in range(n)) if sandwich_norm else None
        )
        if sandwich_norm and not norm_first:
            raise ValueError("sandwich_norm adds output norms to pre-LN blocks: set norm_first=True")
        self.dropouts = nn.ModuleList(nn.Dropout(dropout) for _ in range(n))
        self.hook_attn_out = HookPoint()
        self.hook_cross_out = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        self_mask: AttnMask | None = None,
        memory_mask: AttnMask | None = None,
        cache: tuple[LayerKV, LayerKV] | None = None,
        positions: Tensor | None = None,
        head_mask: Tensor | None = None,
        cross_head_mask: Tensor | None = None,
    ) -> Tensor:
        """``x`` ``(B, T, E)``; ``memory`` ``(B, S, memory_dim)`` (the encoder's output; None for decoder-only);
        ``self_mask``/``memory_mask`` structured masks built once by the stack; ``cache`` this layer's
        ``(self, cross)`` caches."""
        self_cache, cross_cache = (None, None) if cache is None else cache
        sublayers: list[tuple[Callable[[Tensor], Tensor], HookPoint]] = [
            (
                lambda h: self.self_attn(
                    h, mask=self_mask, cache=self_cache, positions=positions, head_mask=head_mask, need_weights=False
                )[0],
                self.hook_attn_out,
            )
        ]
        cross = self.cross_attn
        if cross is not None:
            if memory is None and (cross_cache is None or cross_cache.k is None):
                raise ValueError("this decoder has cross-attention: pass memory= (the encoder's output)")
            src = x if memory is None else memory  # with a filled cross cache the memory is not projected again
            sublayers.append(
                (
                    lambda h: cross(
                        h, src, mask=memory_mask, cache=cross_cache, head_mask=cross_head_mask, need_weights=False
                    )[0],
                    self.hook_cross_out,
                )
            )
        if self.ffn is not None:
            sublayers.append((self.ffn, self.hook_mlp_out))
        posts: Iterable[Callable[[Tensor], Tensor]] = (
            self.post_norms if self.post_norms is not None else [_identity] * len(self.norms)
        )
        for (fn, hook), norm, post, drop in zip(sublayers, self.norms, posts, self.dropouts):
            dropout = drop if self.training else _identity  # (a module call per sublayer saved when decoding)
            if self.norm_first:
                x = x + dropout(hook(post(fn(norm(x)))))
            else:
                x = norm(x + dropout(hook(fn(x))))
        return self.hook_resid_post(x)


def _identity(x: Tensor) -> Tensor:
    return x


class TransformerDecoder(nn.Module):
    """A stack of :class:`DecoderBlock` over target embeddings ``(B, T, E)`` (additive positions are added by the
    caller; rotary ones live inside the self-attention). Pre-LN stacks end with a final LayerNorm."""

    layers: Sequence[DecoderBlock]  # an nn.ModuleList of them

    def __init__(self, config: DecoderConfig | None = None, **overrides) -> None:
        super().__init__()
        config = DecoderConfig.from_dict(overrides) if config is None else config  # flat attention fields read too
        self.config = config
        head_dim = config.attention.head_dim or config.d_model // config.num_heads
        rotary = (
            RotaryEmbedding(config.attention.rotary_dim(head_dim), config.rope_theta, scaling=config.rope_scaling)
            if config.rotary
            else None
        )
        # local (sliding-window) layers may rotate with their own base (Gemma 3: 1e4 local, 1e6 global)
        local_rotary = rotary
        if config.rotary and config.sliding_window is not None and config.rope_local_theta is not None:
            local_rotary = RotaryEmbedding(config.attention.rotary_dim(head_dim), config.rope_local_theta)
        self.layers = nn.ModuleList(  # type: ignore[assignment]  # (the Sequence above)
            DecoderBlock(
                config.d_model,
                config.num_heads,
                config.d_ff,
                config.dropout,
                attention=config.attention,
                activation=config.activation,
                norm_first=config.norm_first,
                layer_norm_eps=config.layer_norm_eps,
                bias=config.bias,
                rotary=local_rotary if config.is_local(i) else rotary,
                cross_attention=config.cross_attention,
                memory_dim=config.memory_dim,
                layer_index=i,
                norm=config.norm,
                out_bias=config.out_bias,
                ffn_bias=config.ffn_bias,
                sandwich_norm=config.sandwich_norm,
            )
            for i in range(config.num_layers)
        )
        self.local = [config.is_local(i) for i in range(config.num_layers)]
        self.final_norm = make_norm(config.norm, config.d_model, config.layer_norm_eps) if config.norm_first else None
        # ALiBi: one mask part for the whole stack, densified once per call (a pruned layer swaps in its own slopes)
        self._alibi = alibi_slope_values(config.num_heads) if config.attention.alibi else None

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        head_mask: Tensor | None = None,
        cross_head_mask: Tensor | None = None,
        start_at_layer: int = 0,
    ) -> Tensor:
        """``x`` ``(B, T, E)`` new target positions; ``key_padding_mask`` ``(B, cached + T)`` bool, True = real
        token (every self-attention key, cached ones included); ``memory_key_padding_mask`` ``(B, S)``. The causal
        mask is bottom-right aligned, so ``T`` new queries after ``cached`` keys see exactly their past.
        ``head_mask`` / ``cross_head_mask``: one row per layer for the self- / cross-attention heads.
        ``start_at_layer``: ``x`` is the residual stream entering that layer; the layers before it are skipped
        (interventions rerun a model from the layer they change; the same as TransformerLens' argument)."""
        if not 0 <= start_at_layer <= len(self.layers):
            raise ValueError(f"start_at_layer={start_at_layer}: the stack has layers 0..{len(self.layers) - 1}")
        if cache is not None and not (len(cache.self_attn) == len(cache.cross_attn) == len(self.layers)):
            raise ValueError(
                f"this cache has {len(cache.self_attn)} layers and the decoder {len(self.layers)}: it was made for "
                "another model; make one with model.new_cache(...)"
            )
        for name, hm in (("head_mask", head_mask), ("cross_head_mask", cross_head_mask)):
            if hm is not None and len(hm) != len(self.layers):
                raise ValueError(f"{name} must have one row per layer ({len(self.layers)}), got {len(hm)} rows")
        # the structured masks, built once here and passed unchanged to every layer
        # one new query per row over its cache with no padding sees every key: nothing to mask
        step = cache is not None and x.shape[1] == 1 and key_padding_mask is None
        self_mask = None if step else AttnMask.of(None, is_causal=self.config.causal, key_padding=key_padding_mask)
        if self._alibi is not None:
            self_mask = (self_mask or AttnMask()).with_alibi(self._alibi)
        memory_mask = AttnMask.of(None, key_padding=memory_key_padding_mask)
        local_mask = self._local_mask(x.shape[1], cache, key_padding_mask, x.device) if any(self.local) else None
        for i in range(start_at_layer, len(self.layers)):
            layer = self.layers[i]
            layer_cache = None if cache is None else (cache.self_attn[i], cache.cross_attn[i])
            x = layer(
                x,
                memory,
                self_mask=local_mask if self.local[i] else self_mask,
                memory_mask=memory_mask,
                cache=layer_cache,
                positions=positions,
                head_mask=None if head_mask is None else head_mask[i],
                cross_head_mask=None if cross_head_mask is None else cross_head_mask[i],
            )
        return x if self.final_norm is None else self.final_norm(x)

    def _local_mask(self, new: int, cache: KVCache | None, key_padding: Tensor | None, device) -> AttnMask | None:
        """The sliding-window layers' mask, built once per call: a causal window pattern (run by the sparse window
        backend, never densified) when the call holds every key; the same band as a small ``(new, keys)`` mask
        when earlier keys sit in a cache (decoding steps)."""
        w = self.config.sliding_window
        if w is None:
            raise ValueError("this stack has no sliding-window layers (sliding_window=None)")
        cached = 0 if cache is None else cache.self_attn[0].length
        if cached == 0:
            return AttnMask.of(SparsePattern(window=w - 1, causal=True), key_padding=key_padding)
        q = torch.arange(cached, cached + new, device=device)[:, None]
        k = torch.arange(cached + new, device=device)[None, :]
        return AttnMask.of((k <= q) & (k > q - w), key_padding=key_padding)  # (new, cached + new)

    @property
    def num_heads(self) -> list[int]:
        return [layer.self_attn.num_heads for layer in self.layers]


__all__ = ["DecoderBlock", "DecoderConfig", "TransformerDecoder"]
