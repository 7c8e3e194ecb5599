"""Multi-head Latent Attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1): keys and values from one small
cached latent per token, with a decoupled rotary key shared by the heads.

::

    c_kv = RMSNorm(x W_dkv)                        (B, L, d_c)     the latent: all the cache keeps of k and v
    k_C  = c_kv W_uk,  v = c_kv W_uv               (B, H, L, d_h)  per-head keys and values, up-projected
    k_R  = RoPE(x W_kr)                            (B, 1, L, d_r)  one rotary key shared by every head (cached)
    q    = [x W_uq, RoPE(x W_qr)]                  (B, H, L, d_h + d_r)
    out  = softmax([q_C, q_R] [k_C, k_R]^T / sqrt(d_h + d_r)) v  -> W_o

The cache holds ``c_kv`` and ``k_R``: ``d_c + d_r`` numbers per token and layer, against ``2 H d_h`` for MHA.
**Absorbed decoding** (the paper's inference form) never up-projects the cache: ``q_C . (W_uk c) = (W_uk^T q_C) .
c``, so each head's query is mapped into the latent and attends to the latents directly -- one key/value "head"
shared by all (MQA-shaped, ``d_c + d_r`` wide) -- and ``sum_j p_ij (W_uv c_j) = W_uv (sum_j p_ij c_j)`` up-projects
once per query after the weighted sum. :meth:`forward` uses it with a cache (``absorb=None``); it equals the plain
path to float rounding (tested).

Same call as :class:`~multihead.modules.attention.MultiHeadAttention` (masks, key padding, causal, ``head_mask``,
``cache``, ``positions``, hooks ``hook_q``/``hook_k``/``hook_v``/``hook_pattern``/``hook_z``, ``prune_heads``), so
the decoder block takes it in place of MHA. ALiBi (``alibi=True``) and learned sinks (``sinks=True``) come from the
kernel seam as for MHA -- an ALiBi part of the mask, a sink logit per head passed to ``attention(..., sinks=)`` -- in
both forms. Query compression (the paper's ``c_q``) is left out: at our sizes it
saves parameters, not cache.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..attention.attn_mask import AttnMask
from ..attention.registry import attention, check_backend_name, get_backend
from .attention import alibi_slope_values
from .hooks import HookPoint
from .kv import LayerKV
from .positional import RotaryEmbedding


class MultiHeadLatentAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        kv_latent: int = 64,
        rope_dim: int = 16,
        head_dim: int | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        bias: bool = False,
        need_weights: bool = False,
        max_len: int = 4096,
        alibi: bool = False,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        head_dim = d_model // num_heads if head_dim is None else head_dim
        if num_heads <= 0 or head_dim <= 0 or kv_latent <= 0 or rope_dim <= 0 or rope_dim % 2:
            raise ValueError(
                f"MLA needs num_heads, head_dim, kv_latent > 0 and an even rope_dim > 0; got "
                f"num_heads={num_heads}, head_dim={head_dim}, kv_latent={kv_latent}, rope_dim={rope_dim}"
            )
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        self.kv_latent, self.rope_dim = kv_latent, rope_dim
        self.num_kv_heads = num_heads  # for code that reads it (GQA does not apply: one latent serves every head)
        self.dropout, self.backend, self.need_weights = dropout, check_backend_name(backend), need_weights
        h = num_heads
        self.w_dkv = nn.Linear(d_model, kv_latent, bias=bias)
        self.kv_norm = nn.RMSNorm(kv_latent, eps=1e-6)
        self.w_uk = nn.Linear(kv_latent, h * head_dim, bias=False)
        self.w_uv = nn.Linear(kv_latent, h * head_dim, bias=False)
        self.w_kr = nn.Linear(d_model, rope_dim, bias=bias)
        self.w_uq = nn.Linear(d_model, h * head_dim, bias=bias)
        self.w_qr = nn.Linear(d_model, h * rope_dim, bias=bias)
        self.w_o = nn.Linear(h * head_dim, d_model, bias=bias)
        self.rotary = RotaryEmbedding(rope_dim, max_len=max_len)
        self._alibi = alibi_slope_values(h) if alibi else None  # the ALiBi mask part's slopes
        self.sink_logits = nn.Parameter(torch.zeros(h)) if sinks else None
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_pattern, self.hook_z, self.hook_stats = HookPoint(), HookPoint(), HookPoint()
        self.stats_options: dict = {}
        self.pruned_heads: list[int] = []

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"kv_latent={self.kv_latent}, rope_dim={self.rope_dim}"
        )

    def cache_numbers_per_token(self) -> int:
        """Numbers this layer caches per token (``d_c + d_r``; MHA: ``2 H d_h``)."""
        return self.kv_latent + self.rope_dim

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask=None,
        *,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        head_mask: Tensor | None = None,
        need_weights: bool | None = None,
        cache: LayerKV | None = None,
        positions: Tensor | None = None,
        absorb: bool | None = None,
        **_ignored,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention over ``query`` ``(B, L, E)`` (MLA is self-attention; ``key``/``value`` must be omitted).
        ``absorb``: the absorbed form (default: when a cache is given)."""
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError("MultiHeadLatentAttention is self-attention: keys and values come from the query's latent")
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"query must be (B, L, {self.d_model}), got {tuple(query.shape)}")
        if cache is not None and not isinstance(cache, LayerKV):
            raise ValueError(
                f"multi-head latent attention keeps its latents in a plain cache, not a {type(cache).__name__}: "
                "decode it with policy='full' (a KV policy ranks per-head keys, which MLA does not store)"
            )
        need_weights = self.need_weights if need_weights is None else need_weights
        absorb = cache is not None if absorb is None else absorb
        b, lq, _ = query.shape
        h, d, r = self.num_heads, self.head_dim, self.rope_dim
        latent = self.kv_norm(self.w_dkv(query))  # (B, Lq, d_c)
        k_rope = self.w_kr(query)[:, None]  # (B, 1, Lq, d_r)
        q_c = self.w_uq(query).view(b, lq, h, d).transpose(1, 2)  # (B, H, Lq, d_h)
        q_r = self.w_qr(query).view(b, lq, h, r).transpose(1, 2)  # (B, H, Lq, d_r)
        offset = 0 if cache is None else cache.length
        q_r = self.rotary.rotate(q_r, offset, positions)
        k_rope = self.rotary.rotate(k_rope, offset, positions)
        if cache is not None:  # the cache: latents and rotated rope keys, (B, 1, L, d_c) and (B, 1, L, d_r)
            lat, k_rope = cache.append(latent[:, None], k_rope)
        else:
            lat = latent[:, None]  # (B, 1, Lk, d_c)
        mask = _build_mask(mask, key_padding_mask, is_causal)
        if self._alibi is not None:
            mask = (mask or AttnMask()).with_alibi(self._alibi)
        sinks = None if self.sink_logits is None else self.sink_logits.to(query.dtype)
        scale = 1.0 / math.sqrt(d + r)
        p = self.dropout if self.training else 0.0
        backend = self.backend
        want = need_weights or self.hook_pattern.active
        if want and backend != "auto" and not get_backend(backend).capabilities.returns_weights:
            backend = "auto"
        hook = self.hook_pattern if self.hook_pattern.active else None
        lk = lat.shape[2]
        if absorb:  # queries into the latent; one shared key/value "head" of width d_c (+ d_r for the key)
            w_uk = self.w_uk.weight.view(h, d, self.kv_latent)  # (H, d_h, d_c)
            q = torch.cat([torch.einsum("bhld,hdc->bhlc", q_c, w_uk), q_r], -1)  # (B, H, Lq, d_c + d_r)
            k = torch.cat([lat, k_rope], -1)  # (B, 1, Lk, d_c + d_r)
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(lat)
            self._stats(q, k, mask, scale, sinks)
            z, weights = attention(
                q,
                k,
                v,
                mask=mask,
                dropout_p=p,
                need_weights=need_weights,
                backend=backend,
                scale=scale,
                weights_hook=hook,
                sinks=sinks,
            )  # (B, H, Lq, d_c)
            w_uv = self.w_uv.weight.view(h, d, self.kv_latent)  # (H, d_h, d_c)
            z = torch.einsum("bhlc,hdc->bhld", z, w_uv)  # (B, H, Lq, d_h)
        else:  # the plain form: per-head keys and values up-projected from the latents
            lat0 = lat[:, 0]  # (B, Lk, d_c)
            k_c = self.w_uk(lat0).view(b, lk, h, d).transpose(1, 2)
            v = self.w_uv(lat0).view(b, lk, h, d).transpose(1, 2)  # (B, H, Lk, d_h)
            q = torch.cat([q_c, q_r], -1)
            k = torch.cat([k_c, k_rope.expand(b, h, lk, r)], -1)  # (B, H, Lk, d_h + d_r)
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
            self._stats(q, k, mask, scale, sinks)
            z, weights = attention(
                q,
                k,
                v,
                mask=mask,
                dropout_p=p,
                need_weights=need_weights,
                backend=backend,
                scale=scale,
                weights_hook=hook,
                sinks=sinks,
            )  # (B, H, Lq, d_h)
        z = self.hook_z(z)
        if head_mask is not None:
            hm = head_mask.to(z.dtype)
            z = z * (hm.view(1, h, 1, 1) if hm.dim() == 1 else hm.view(-1, h, 1, 1))
        out = self.w_o(z.transpose(1, 2).reshape(b, lq, h * d))
        return out, (weights if need_weights else None)

    def _stats(self, q: Tensor, k: Tensor, mask, scale: float, sinks: Tensor | None) -> None:
        """``hook_stats``: exact per-head statistics of this call's softmax (absorbed or not, the same map), from
        tiles; nothing ``Lq x Lk`` is built."""
        if self.hook_stats.active:
            from ..attention.stats import attention_stats

            self.hook_stats(attention_stats(q, k, mask=mask, scale=scale, sinks=sinks, **self.stats_options))

    # ------------------------------------------------------------------ pruning
    def prune_heads(self, heads) -> None:
        """Remove heads: their rows of ``W_uk``, ``W_uv``, ``W_uq``, ``W_qr`` and columns of ``W_o``. The latent and
        the shared rope key stay (every head reads them), so pruning shrinks compute, not the cache."""
        from .attention import _select_linear, head_columns

        heads = sorted(set(int(x) for x in heads))
        if not heads:
            return
        h, d, r = self.num_heads, self.head_dim, self.rope_dim
        if min(heads) < 0 or max(heads) >= h:
            raise ValueError(f"head indices must be in [0, {h}), got {heads}")
        keep = [i for i in range(h) if i not in heads]
        idx, ridx = head_columns(keep, d), head_columns(keep, r)
        self.w_uk = _select_linear(self.w_uk, idx, dim=0)
        self.w_uv = _select_linear(self.w_uv, idx, dim=0)
        self.w_uq = _select_linear(self.w_uq, idx, dim=0)
        self.w_qr = _select_linear(self.w_qr, ridx, dim=0)
        self.w_o = _select_linear(self.w_o, idx, dim=1)
        if self.sink_logits is not None:
            self.sink_logits = nn.Parameter(self.sink_logits.detach()[keep].clone())
        if self._alibi is not None:
            self._alibi = tuple(self._alibi[i] for i in keep)
        original = [i for i in range(h + len(self.pruned_heads)) if i not in self.pruned_heads]
        self.pruned_heads = sorted(self.pruned_heads + [original[i] for i in heads])
        self.num_heads = self.num_kv_heads = len(keep)


def _build_mask(mask, key_padding_mask, is_causal):
    if isinstance(mask, Tensor) and mask.dim() == 3:
        mask = mask.unsqueeze(1)
    return AttnMask.of(mask, is_causal=is_causal, key_padding=key_padding_mask)


__all__ = ["MultiHeadLatentAttention"]
