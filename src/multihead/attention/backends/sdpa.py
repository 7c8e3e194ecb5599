"""``sdpa``: PyTorch's fused ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels).

Never materialises ``Lq x Lk`` on its fused kernels and returns no weights. On CPU, PyTorch silently falls back to
its slower MATH kernel when ``dropout_p > 0`` or when the mask requires grad: keep attention dropout at 0 for speed.
"""

from __future__ import annotations

import torch.nn.functional as F

from ..registry import Capabilities, register_backend
from ..ops import expand_kv


@register_backend(
    "sdpa",
    Capabilities(returns_weights=False, mask_parts=("tensor", "causal_alone"), nan_rows=False),
    priority=10,
    description="torch.nn.functional.scaled_dot_product_attention (fused; no weights)",
)
def sdpa_attention(q, k, v, *, mask, dropout_p, scale, need_weights):
    b, h, i, d = q.shape
    g = k.shape[1]
    if g != h and i == 1 and mask is None:  # one query per row over all keys (a decoding step): the h / g query
        # heads that share a key/value head are read as h / g queries of that head -- no expanded copy of the cache
        out = F.scaled_dot_product_attention(q.reshape(b, g, h // g, d), k, v, dropout_p=dropout_p, scale=scale)
        return out.reshape(b, h, 1, out.shape[-1]), None  # (the value width may differ from d: MLA)
    if g != h:  # grouped-query: expand views (CPU kernels do not take enable_gqa on every path)
        k, v = expand_kv(k, h), expand_kv(v, h)
    bias = None if mask is None else mask.tensor
    if bias is not None and bias.is_floating_point() and bias.dtype != q.dtype:
        # a float bias in another dtype than the queries (an fp32 ALiBi bias, fp64 queries): PyTorch's CPU kernel
        # gives wrong rows for it once it holds -inf (padding), so the bias is cast to the queries' dtype
        bias = bias.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=bias,
        dropout_p=dropout_p,
        is_causal=mask is not None and mask.causal,
        scale=scale,
    )  # (b, h, i, d); causal arrives here only alone and square (its top-left flag agrees then)
    return out, None
