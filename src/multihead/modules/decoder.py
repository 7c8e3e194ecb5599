"""Decoder block and stack: masked (causal) self-attention -> cross-attention to an encoder's output -> FFN, each
with a residual and LayerNorm (post-LN as the tutorial's encoder block, or pre-LN with ``norm_first=True``).

The same :class:`MultiHeadAttention` in its two other roles: causal self-attention (queries may attend only to keys
at or before their own position) and encoder-decoder cross-attention (queries from the decoder, keys and values from
the encoder's output, the annotated transformer's ``mha(q, k, v, mask)``). Without cross-attention
(``cross_attention=False``) the block is a decoder-only (GPT-style) layer. Incremental decoding passes a
:class:`~multihead.modules.kv_cache.KVCache`.

Shape legend: ``B`` batch, ``T`` target (decoder) positions this call, ``S`` source positions, ``E`` d_model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import Tensor, nn

from .._config import from_fields
from ..attention.attn_mask import AttnMask
from .attention import alibi_slopes
from .variants import build_attention
from .feedforward import FeedForward
from .hooks import HookPoint
from .kv_cache import KVCache, LayerKV
from .positional import RotaryEmbedding


@dataclass
class DecoderConfig:
    """Everything that defines a decoder stack; saved as JSON beside each checkpoint."""

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 2
    d_ff: int | None = None  # default 4 * d_model; 0 = attention-only blocks (no FFN), as in Olsson et al.'s toy models
    num_kv_heads: int | None = None  # default num_heads (MHA); 1 = MQA (the cache holds only these heads)
    dropout: float = 0.1
    attn_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    layer_norm_eps: float = 1e-5
    bias: bool = True
    rotary: bool = False  # rotary positions in the causal self-attention
    backend: str = "auto"
    cross_attention: bool = True  # False: decoder-only (no encoder)
    causal: bool = True  # False: the targets see each other both ways (a question read whole, as in a Q-Former)
    memory_dim: int | None = None  # width of the memory (kdim = vdim of cross-attention), default d_model
    gate: bool = False  # gated self-attention (a sigmoid gate per head output; Qiu et al. 2025)
    alibi: bool = False  # ALiBi distance biases in the self-attention (Press et al. 2022); set by positional="alibi"
    sinks: bool = False  # a learned sink logit per head in the self-attention's softmax (as gpt-oss)
    differential: bool = False  # differential self-attention (Ye et al. 2025); lambda_init by layer depth
    talking_heads: bool = False  # talking-heads self-attention (Shazeer et al. 2020; explicit weights)
    mla_latent: int = 0  # > 0: Multi-head Latent Attention with this KV latent width (DeepSeek-V2); its own rope
    mla_rope_dim: int = 16  # MLA's decoupled rotary key width

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DecoderConfig":
        return from_fields(cls, d)


class DecoderBlock(nn.Module):
    """One Transformer decoder layer over ``(B, T, E)``.

    Post-LN: ``x = LN(x + Drop(SelfAttn(x, causal)))``; ``x = LN(x + Drop(CrossAttn(x, memory)))``;
    ``x = LN(x + Drop(FFN(x)))``. Pre-LN (``norm_first=True``) normalises each sub-layer's input instead.

    Hook points: ``hook_attn_out`` (self-attention output), ``hook_cross_out``, ``hook_mlp_out``, ``hook_resid_post``
    ``(B, T, E)``; and the attentions' own under ``self_attn.`` and ``cross_attn.`` (``hook_pattern`` of
    ``cross_attn`` is ``(B, H, T, S)``: which source positions each target position reads).
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int | None = None, dropout: float = 0.1, *,
                 attn_dropout: float = 0.0, activation: str = "relu", norm_first: bool = False,
                 num_kv_heads: int | None = None, layer_norm_eps: float = 1e-5, bias: bool = True,
                 backend: str = "auto", rotary: nn.Module | None = None, cross_attention: bool = True,
                 memory_dim: int | None = None, gate: bool = False, alibi: bool = False, sinks: bool = False,
                 differential: bool = False, layer_index: int = 0, mla_latent: int = 0,
                 mla_rope_dim: int = 16, talking_heads: bool = False) -> None:
        super().__init__()
        self.norm_first = norm_first

        def mha(rot, kdim=None, **variant):
            return build_attention(d_model, num_heads, num_kv_heads=num_kv_heads, dropout=attn_dropout, bias=bias,
                                   backend=backend, need_weights=False, rotary=rot, kdim=kdim, vdim=kdim, **variant)

        if mla_latent:
            from .mla import MultiHeadLatentAttention

            other = [n for n, on in (("gate", gate), ("differential", differential),
                                     ("talking_heads", talking_heads)) if on]
            if other:
                raise ValueError(f"Multi-head Latent Attention (mla_latent={mla_latent}) does not take "
                                 f"{', '.join(other)}: it has one softmax over its latent and no per-head output to "
                                 "gate; turn those off or set mla_latent=0 (ALiBi and sinks it takes)")

            self.self_attn = MultiHeadLatentAttention(d_model, num_heads, kv_latent=mla_latent, rope_dim=mla_rope_dim,
                                                      dropout=attn_dropout, backend=backend, bias=bias, alibi=alibi,
                                                      sinks=sinks)
        else:
            self.self_attn = mha(rotary, gate=gate, alibi=alibi, sinks=sinks, differential=differential,
                                 layer_index=layer_index, talking_heads=talking_heads)
        self.cross_attn = mha(None, memory_dim) if cross_attention else None
        self.ffn = FeedForward(d_model, d_ff, dropout, activation, bias) if d_ff != 0 else None  # 0: attention-only
        n = (3 if cross_attention else 2) - (self.ffn is None)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model, eps=layer_norm_eps) for _ in range(n))
        self.dropouts = nn.ModuleList(nn.Dropout(dropout) for _ in range(n))
        self.hook_attn_out = HookPoint()
        self.hook_cross_out = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: Tensor, memory: Tensor | None = None, *, self_mask: AttnMask | None = None,
                memory_mask: AttnMask | None = None, cache: tuple[LayerKV, LayerKV] | None = None,
                positions: Tensor | None = None, head_mask: Tensor | None = None,
                cross_head_mask: Tensor | None = None) -> Tensor:
        """``x`` ``(B, T, E)``; ``memory`` ``(B, S, memory_dim)`` (the encoder's output; None for decoder-only);
        ``self_mask``/``memory_mask`` structured masks built once by the stack; ``cache`` this layer's
        ``(self, cross)`` caches."""
        self_cache, cross_cache = (None, None) if cache is None else cache
        sublayers = [(lambda h: self.self_attn(h, mask=self_mask, cache=self_cache, positions=positions,
                                               head_mask=head_mask, need_weights=False)[0], self.hook_attn_out)]
        if self.cross_attn is not None:
            if memory is None and (cross_cache is None or cross_cache.k is None):
                raise ValueError("this decoder has cross-attention: pass memory= (the encoder's output)")
            src = x if memory is None else memory  # with a filled cross cache the memory is not projected again
            sublayers.append((lambda h: self.cross_attn(h, src, mask=memory_mask, cache=cross_cache,
                                                        head_mask=cross_head_mask, need_weights=False)[0],
                              self.hook_cross_out))
        if self.ffn is not None:
            sublayers.append((self.ffn, self.hook_mlp_out))
        for (fn, hook), norm, drop in zip(sublayers, self.norms, self.dropouts):
            drop = drop if self.training else _identity  # (a module call per sublayer saved when decoding)
            if self.norm_first:
                x = x + drop(hook(fn(norm(x))))
            else:
                x = norm(x + drop(hook(fn(x))))
        return self.hook_resid_post(x)


def _identity(x: Tensor) -> Tensor:
    return x


class TransformerDecoder(nn.Module):
    """A stack of :class:`DecoderBlock` over target embeddings ``(B, T, E)`` (additive positions are added by the
    caller; rotary ones live inside the self-attention). Pre-LN stacks end with a final LayerNorm."""

    def __init__(self, config: DecoderConfig | None = None, **overrides) -> None:
        super().__init__()
        config = DecoderConfig(**overrides) if config is None else config
        self.config = config
        head_dim = config.d_model // config.num_heads
        rotary = RotaryEmbedding(head_dim // 2 if config.differential else head_dim) if config.rotary else None
        self.layers = nn.ModuleList(
            DecoderBlock(config.d_model, config.num_heads, config.d_ff, config.dropout,
                         attn_dropout=config.attn_dropout, activation=config.activation,
                         norm_first=config.norm_first, num_kv_heads=config.num_kv_heads,
                         layer_norm_eps=config.layer_norm_eps, bias=config.bias, backend=config.backend,
                         rotary=rotary, cross_attention=config.cross_attention, memory_dim=config.memory_dim,
                         gate=config.gate, alibi=config.alibi, sinks=config.sinks, differential=config.differential,
                         layer_index=i, mla_latent=config.mla_latent, mla_rope_dim=config.mla_rope_dim,
                         talking_heads=config.talking_heads)
            for i in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        # ALiBi: one mask part for the whole stack, densified once per call (a pruned layer swaps in its own slopes)
        self._alibi = tuple(alibi_slopes(config.num_heads).tolist()) if config.alibi else None

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    def forward(self, x: Tensor, memory: Tensor | None = None, *, key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, cache: KVCache | None = None,
                positions: Tensor | None = None, head_mask: Tensor | None = None,
                cross_head_mask: Tensor | None = None) -> Tensor:
        """``x`` ``(B, T, E)`` new target positions; ``key_padding_mask`` ``(B, cached + T)`` bool, True = real
        token (every self-attention key, cached ones included); ``memory_key_padding_mask`` ``(B, S)``. The causal
        mask is bottom-right aligned, so ``T`` new queries after ``cached`` keys see exactly their past.
        ``head_mask`` / ``cross_head_mask``: one row per layer for the self- / cross-attention heads."""
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
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache.self_attn[i], cache.cross_attn[i])
            x = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask, cache=layer_cache, positions=positions,
                      head_mask=None if head_mask is None else head_mask[i],
                      cross_head_mask=None if cross_head_mask is None else cross_head_mask[i])
        return x if self.final_norm is None else self.final_norm(x)

    @property
    def num_heads(self) -> list[int]:
        return [layer.self_attn.num_heads for layer in self.layers]


__all__ = ["DecoderBlock", "DecoderConfig", "TransformerDecoder"]
