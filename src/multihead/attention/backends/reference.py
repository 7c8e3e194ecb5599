"""``reference``: the tutorial's explicit ``softmax(q k^T / sqrt(d)) v``, the correctness baseline.

Materialises the ``(B, H, Lq, Lk)`` scores; the only core backend that returns weights, and the one that takes
learned sinks natively (their logit joins each row's softmax denominator). Softmax runs in fp32 for
low-precision inputs (fp64 stays fp64); masked scores are filled with ``-finfo(dtype).max`` of the softmax's dtype
(never ``-1e9``, which overflows fp16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops import expand_kv, probabilities
from ..registry import Capabilities, register_backend


@register_backend(
    "reference",
    Capabilities(returns_weights=True, mask_parts=("tensor", "key_padding", "causal"), sinks=True),
    priority=0,
    description="explicit softmax(QK^T/sqrt(d))V; materialises Lq x Lk; returns weights",
)
def reference_attention(q, k, v, *, mask, dropout_p, scale, need_weights, sinks=None):
    weights = probabilities(q, k, mask, scale, sinks)  # (b, h, i, j); every mask part through its dense form
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = torch.matmul(dropped, expand_kv(v, q.shape[1]))  # (b, h, i, d)
    return out, (weights if need_weights else None)
