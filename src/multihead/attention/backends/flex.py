"""``flex``: PyTorch's FlexAttention (``torch.compile``-generated kernel) with our masks as ``mask_mod`` /
``score_mod``: dense bool masks, float biases, causal, and :class:`~multihead.attention.patterns.SparsePattern`
(window, dilation, global tokens, BigBird blocks, key padding), whose block mask lets the kernel skip empty tiles.

Available where ``torch.compile`` works (a C compiler on CPU); the first call per shape compiles (15-30 s on CPU).
On CPU FlexAttention has no backward, so ``auto`` and named calls that need gradients skip it with that reason.
Block masks are built once per pattern and length and reused.

On CPU, PyTorch's compiled FlexAttention kernel (checked with PyTorch 2.13) returns wrong values or NaN at some
lengths (e.g. 8, 24 and 200, while 16, 130 and 256 are right). So on CPU each new shape is verified once against the
fp64 formula on a slice of the real call; a shape that fails is declined with that reason from then on (``auto``
skips flex there, a named call gets the reason and the backends that can run it).
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


def _identity(t: torch.Tensor) -> tuple:
    """A cache key that changes when the tensor's contents may have: storage, layout and PyTorch's version counter
    (bumped by every in-place write), so an edited, reused mask buffer never gets a stale block mask."""
    return (t.data_ptr(), tuple(t.shape), t.stride(), str(t.dtype), t._version)


def _block_mask(key, mask_mod, b, h, lq, lk, device):
    from torch.nn.attention.flex_attention import create_block_mask

    if key not in _BLOCK_MASKS:
        if len(_BLOCK_MASKS) > 32:
            _BLOCK_MASKS.clear()
        _BLOCK_MASKS[key] = create_block_mask(mask_mod, b, h, lq, lk, device=device)
    return _BLOCK_MASKS[key]


_VERDICTS: dict = {}  # CPU: (Lq, Lk, D, dtype, mask kind) -> None (verified) or the reason it is declined


def _verdict_key(lq, lk, d, dtype, kind) -> tuple:
    return (lq, lk, d, str(dtype), kind)


def _check(call) -> str | None:
    if call.device != "cpu" or not call.sizes:
        return None
    for kind in ("pattern", "dense", "bias", "causal", "none"):
        reason = _VERDICTS.get(_verdict_key(*call.sizes, call.dtype, kind))
        if reason:
            return reason
    return None


def _verify(q, k, v, out, *, mask, is_causal, scale, kind) -> None:
    """Compare ``out`` with the fp64 formula (every batch and head when small, else batch 0 and 256 query rows),
    once per shape on CPU; raise (and remember) when PyTorch's compiled kernel got it wrong."""
    key = _verdict_key(q.shape[2], k.shape[2], q.shape[3], q.dtype, kind)
    if key in _VERDICTS:
        if _VERDICTS[key]:
            raise ValueError(f"attention backend 'flex' {_VERDICTS[key]}")
        return
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    nb = b if b * h * lq * lk <= 1 << 24 else 1
    rows = torch.arange(lq) if nb * h * lq * lk <= 1 << 24 else torch.cat([torch.arange(128), torch.arange(lq - 128, lq)])
    rep = h // k.shape[1]
    qs = q[:nb, :, rows].double()  # (nb, h, rows, d)
    ks = k[:nb].double().repeat_interleave(rep, dim=1)
    vs = v[:nb].double().repeat_interleave(rep, dim=1)
    scores = (qs @ ks.transpose(-1, -2)) * scale  # (nb, h, rows, Lk)
    if isinstance(mask, SparsePattern):
        allowed = _as_4d(mask.dense(lq, device=q.device)).expand(-1, -1, lq, lk)[:nb, :, rows]
        scores = scores.masked_fill(~allowed, float("-inf"))
    elif mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~_as_4d(mask).expand(-1, -1, lq, lk)[:nb, :, rows], float("-inf"))
    elif mask is not None:
        scores = scores + _as_4d(mask).expand(-1, -1, lq, lk)[:nb, :, rows].double()
    if is_causal:
        scores = scores.masked_fill(torch.arange(lk)[None, :] > rows[:, None], float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ vs
    got = out[:nb, :, rows].double()
    finite = torch.isfinite(expected).all(dim=-1)
    err = float((got[finite] - expected[finite]).abs().max()) if bool(finite.any()) else 0.0
    bad = not bool(torch.isfinite(got[finite]).all())
    tol = 1e-3 if q.dtype in (torch.float32, torch.float64) else 5e-2
    if bad or err > tol:
        _VERDICTS[key] = (f"declines this shape on CPU: PyTorch's compiled FlexAttention kernel returned "
                          f"{'NaN' if bad else f'values off by {err:.2g}'} against the fp64 formula at Lq={lq}, "
                          f"Lk={lk}, D={q.shape[3]} ({q.dtype}); a PyTorch CPU bug at some lengths. Use backend='sdpa' "
                          "or 'reference' (auto skips flex here)")
        raise ValueError(f"attention backend 'flex' {_VERDICTS[key]}")
    _VERDICTS[key] = None


def _as_4d(mask):
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


@register_backend(
    "flex",
    Capabilities(returns_weights=False, supports_dropout=False, patterns=("window", "block"),
                 backward_devices=("cuda",)),
    priority=-5,
    description="FlexAttention (torch.compile): masks as mask_mod/score_mod, skips empty blocks; no CPU backward",
    available=_why_unavailable,
    check=_check,
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
               _identity(p.key_padding), lq, str(q.device))
        block_mask = _block_mask(key, mm, b if p.key_padding is not None else None, None, lq, lk, q.device)
    elif mask is not None and mask.dtype == torch.bool:
        m4 = _as_4d(mask)  # masks may come 2-D or 3-D (broadcastable to (b, h, i, j))
        m = m4.expand(m4.shape[0], m4.shape[1], lq, lk)
        mb, mh = m.shape[0], m.shape[1]

        def mm(bi, hi, qi, kj):
            return m[bi if mb > 1 else 0, hi if mh > 1 else 0, qi, kj]

        block_mask = _block_mask(("dense", _identity(mask)), mm, mb if mb > 1 else None,
                                 mh if mh > 1 else None, lq, lk, q.device)
    elif mask is not None:  # float bias
        b4 = _as_4d(mask)
        bias = b4.expand(b4.shape[0], b4.shape[1], lq, lk)
        bb, bh = bias.shape[0], bias.shape[1]

        def score_mod(score, bi, hi, qi, kj):
            return score + bias[bi if bb > 1 else 0, hi if bh > 1 else 0, qi, kj]

    if is_causal and not isinstance(mask, SparsePattern):
        def causal(bi, hi, qi, kj):
            return kj <= qi

        block_mask = _block_mask(("causal", lq, lk, str(q.device)), causal, None, None, lq, lk, q.device)
    out = _compiled()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    if q.device.type == "cpu":
        kind = ("pattern" if isinstance(mask, SparsePattern) else "none" if mask is None and not is_causal
                else "causal" if mask is None else "dense" if mask.dtype == torch.bool else "bias")
        _verify(q, k, v, out, mask=mask, is_causal=is_causal and not isinstance(mask, SparsePattern), scale=scale,
                kind=kind)
    return out, None


__all__ = ["pattern_mask_mod"]
