"""``flex``: PyTorch's FlexAttention (``torch.compile``-generated kernel) with our masks as ``mask_mod`` /
``score_mod``: dense bool masks, float biases, causal, and :class:`~multihead.attention.patterns.SparsePattern`
(window, dilation, global tokens, BigBird blocks, key padding), whose block mask lets the kernel skip empty tiles.

Available where ``torch.compile`` works (a C compiler on CPU); the first call per shape compiles (15-30 s on CPU).
On CPU FlexAttention has no backward, so ``auto`` and named calls that need gradients skip it with that reason.
Block masks are built once per pattern and length and reused.
"""
from __future__ import annotations

import shutil
from functools import lru_cache

import torch

from ..patterns import SparsePattern
from ..registry import Capabilities, register_backend


def _why_unavailable() -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return "needs torch.nn.attention.flex_attention (PyTorch >= 2.5)"
    if not (shutil.which("cc") or shutil.which("gcc") or torch.cuda.is_available()):
        return "torch.compile needs a C compiler on CPU (none found)"
    return None


@lru_cache(maxsize=1)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def pattern_mask_mod(p: SparsePattern, length: int, device):
    """``mask_mod(b, h, q_idx, kv_idx) -> bool`` for a pattern (tensor lookups for layouts and padding)."""
    pad = None if p.key_padding is None else p.key_padding.to(device)
    if p.kind == "window":
        g = torch.zeros(length, dtype=torch.bool, device=device)
        if p.global_tokens:
            g[[t for t in p.global_tokens if t < length]] = True
        w, dil = p.window * p.dilation, p.dilation

        def base(b, h, qi, kj):
            d = qi - kj
            return (((d <= w) & (d >= -w) & (d % dil == 0)) | g[qi] | g[kj])
    else:
        layout = p.block_layout(-(-length // p.block)).to(device)
        bs = p.block

        def base(b, h, qi, kj):
            return layout[qi // bs, kj // bs]

    def mask_mod(b, h, qi, kj):
        ok = base(b, h, qi, kj)
        if p.causal:
            ok = ok & (kj <= qi)
        if pad is not None:
            ok = ok & pad[b, kj]
        return ok

    return mask_mod


_BLOCK_MASKS: dict = {}


def _block_mask(key, mask_mod, b, h, lq, lk, device):
    from torch.nn.attention.flex_attention import create_block_mask

    if key not in _BLOCK_MASKS:
        if len(_BLOCK_MASKS) > 32:
            _BLOCK_MASKS.clear()
        _BLOCK_MASKS[key] = create_block_mask(mask_mod, b, h, lq, lk, device=device)
    return _BLOCK_MASKS[key]


@register_backend(
    "flex",
    Capabilities(returns_weights=False, supports_dropout=False, patterns=("window", "block"),
                 backward_devices=("cuda",)),
    priority=-5,
    description="FlexAttention (torch.compile): masks as mask_mod/score_mod, skips empty blocks; no CPU backward",
    available=_why_unavailable,
)
def flex_backend(q, k, v, *, mask, is_causal, dropout_p, scale, need_weights):
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    gqa = k.shape[1] != h
    block_mask, score_mod = None, None
    if isinstance(mask, SparsePattern):
        p = mask.with_causal(is_causal)
        mm = pattern_mask_mod(p, lq, q.device)
        key = ("pattern", p.window, p.dilation, p.global_tokens, p.causal, p.block, p.window_blocks,
               p.global_blocks, p.random_blocks, p.seed, None if p.key_padding is None else
               (p.key_padding.data_ptr(), tuple(p.key_padding.shape)), lq, str(q.device))
        block_mask = _block_mask(key, mm, b if p.key_padding is not None else None, None, lq, lk, q.device)
    elif mask is not None and mask.dtype == torch.bool:
        m = mask.expand(mask.shape[0], mask.shape[1], lq, lk)
        mb, mh = m.shape[0], m.shape[1]

        def mm(bi, hi, qi, kj):
            return m[bi if mb > 1 else 0, hi if mh > 1 else 0, qi, kj]

        block_mask = _block_mask(("dense", m.data_ptr(), tuple(m.shape), m.stride()), mm, mb if mb > 1 else None,
                                 mh if mh > 1 else None, lq, lk, q.device)
    elif mask is not None:  # float bias
        bias = mask.expand(mask.shape[0], mask.shape[1], lq, lk)
        bb, bh = bias.shape[0], bias.shape[1]

        def score_mod(score, bi, hi, qi, kj):
            return score + bias[bi if bb > 1 else 0, hi if bh > 1 else 0, qi, kj]

    if is_causal and not isinstance(mask, SparsePattern):
        def causal(bi, hi, qi, kj):
            return kj <= qi

        block_mask = _block_mask(("causal", lq, lk, str(q.device)), causal, None, None, lq, lk, q.device)
    out = _compiled()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    return out, None


__all__ = ["pattern_mask_mod"]
