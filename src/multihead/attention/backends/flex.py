"""``flex``: PyTorch's FlexAttention (``torch.compile``-generated kernel) running every part of an
:class:`~multihead.attention.attn_mask.AttnMask` natively, through :meth:`AttnMask.mask_mod` (key padding, causal at
any offset, :class:`~multihead.attention.patterns.SparsePattern` rules, dense bool masks) and :meth:`AttnMask.score_mod`
(float biases); the block mask lets the kernel skip empty tiles. Fully masked rows come out as zeros (FlexAttention's
own convention, checked against the formula below).

Available where ``torch.compile`` works (a C compiler on CPU); the first call per shape compiles (15-30 s on CPU).
On CPU FlexAttention has no backward, so ``auto`` and named calls that need gradients skip it with that reason.
Block masks are built once per mask and length and reused; a pattern's or a causal mask's comes from its geometry
(:mod:`multihead.attention.flex_kernel`, :mod:`multihead.attention.block_masks`: no ``L x L`` evaluation).

On CPU, PyTorch's compiled FlexAttention kernel (checked with PyTorch 2.13) returns wrong values or NaN at some
lengths (e.g. 8, 24 and 200, while 16, 130 and 256 are right). So on CPU each new shape is verified once against the
fp64 formula on a slice of the real call (the mask's rules evaluated on the sampled rows' indices, never an
``L x L`` dense mask); a shape that fails is declined with that reason from then on (``auto`` skips flex there, a
named call gets the reason and the backends that can run it).
"""

from __future__ import annotations

import shutil
from functools import lru_cache

import torch

from ..flex_kernel import flex_attention
from ..registry import Capabilities, register_backend


@lru_cache(maxsize=1)  # asked on every call auto considers flex: looking for a compiler each time cost ~30 us
def _why_unavailable() -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return "needs torch.nn.attention.flex_attention (PyTorch >= 2.5)"
    if not (shutil.which("cc") or shutil.which("gcc") or torch.cuda.is_available()):
        return "torch.compile needs a C compiler on CPU (none found)"
    return None


_VERDICTS: dict = {}  # CPU: (Lq, Lk, D, dtype) -> None (verified) or the reason it is declined


def _verdict_key(sizes: tuple, dtype) -> tuple:
    return (*sizes, str(dtype))


def _check(call) -> str | None:
    if call.device != "cpu" or not call.sizes:
        return None
    if call.dtype == torch.float64:  # the CPU inductor kernel fails on it after compiling (PyTorch 2.13)
        return "does not run float64 on CPU (PyTorch's compiled FlexAttention kernel fails there); use float32"
    return _VERDICTS.get(_verdict_key(call.sizes, call.dtype))


def _verify(q, k, v, out, *, mask, scale) -> None:
    """Compare ``out`` with the fp64 formula under the same mask (every batch and head when small, else batch 0 and
    128 query rows, one head at a time: a few MiB at 16k keys; rows with no allowed key must be zero), once per shape
    on CPU; raise (and remember) when PyTorch's compiled kernel got it wrong."""
    key = _verdict_key((q.shape[2], k.shape[2], q.shape[3]), q.dtype)
    if key in _VERDICTS:
        if _VERDICTS[key]:
            raise ValueError(f"attention backend 'flex' {_VERDICTS[key]}")
        return
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    nb = b if b * h * lq * lk <= 1 << 24 else 1
    rows = torch.arange(lq) if nb * h * lq * lk <= 1 << 24 else torch.cat([torch.arange(64), torch.arange(lq - 64, lq)])
    rep = h // k.shape[1]
    score_mod = mask.score_mod(lq, lk, q.device) if mask is not None else None
    mask_mod = mask.mask_mod(lq, lk, q.device) if mask is not None else None
    i, j = rows.to(q.device)[None, None, :, None], torch.arange(lk, device=q.device)[None, None, None, :]
    b_i = torch.arange(nb)[:, None, None, None]
    expected = torch.empty(nb, h, len(rows), v.shape[-1], dtype=torch.float64)
    for head in range(h):  # the mask's own rules on the sampled rows' indices: nothing Lq x Lk is built
        h_i = torch.full((1, 1, 1, 1), head)
        scores = q[:nb, head : head + 1, rows].double() @ k[:nb, head // rep : head // rep + 1].double().transpose(
            -1, -2
        )
        scores = scores * scale  # (nb, 1, rows, Lk)
        if score_mod is not None:
            scores = score_mod(scores, b_i, h_i, i, j)
        if mask_mod is not None:
            scores = scores.masked_fill(~mask_mod(b_i, h_i, i, j), float("-inf"))
        vs = v[:nb, head // rep : head // rep + 1].double()
        expected[:, head : head + 1] = (torch.softmax(scores, dim=-1) @ vs).nan_to_num(0.0)  # no key: zeros
    got = out[:nb, :, rows].double()
    bad = not bool(torch.isfinite(got).all())
    err = 0.0 if bad else float((got - expected).abs().max())
    tol = 1e-3 if q.dtype in (torch.float32, torch.float64) else 5e-2
    if bad or err > tol:
        _VERDICTS[key] = (
            f"declines this shape on CPU: PyTorch's compiled FlexAttention kernel returned "
            f"{'NaN' if bad else f'values off by {err:.2g}'} against the fp64 formula at Lq={lq}, "
            f"Lk={lk}, D={q.shape[3]} ({q.dtype}); a PyTorch CPU bug at some lengths. Use backend='sdpa' "
            "or 'reference' (auto skips flex here)"
        )
        raise ValueError(f"attention backend 'flex' {_VERDICTS[key]}")
    _VERDICTS[key] = None


def _boost(call):
    """On CUDA, FlexAttention with the pattern's block mask (full tiles skip mask_mod, empty tiles are never read)
    is the fastest exact path for sparse patterns: PyTorch's compiled kernel beat our window kernel ~9x at 64k on an
    H200. On CPU the window kernel stays first (compile time, no backward, length bugs)."""
    if call.device == "cuda" and call.pattern is not None:
        return 30, f"sparse {call.pattern} patterns on cuda run fastest in FlexAttention with the pattern's block mask"
    return None


@register_backend(
    "flex",
    Capabilities(
        returns_weights=False,
        supports_dropout=False,
        mask_parts=("tensor", "key_padding", "causal", "alibi"),
        patterns=("window", "block"),
        backward_devices=("cuda",),
    ),
    priority=-5,
    description="FlexAttention (torch.compile): masks as mask_mod/score_mod, skips empty blocks; no CPU backward",
    available=_why_unavailable,
    check=_check,
    boost=_boost,
)
def flex_backend(q, k, v, *, mask, dropout_p, scale, need_weights):
    out = flex_attention(q, k, v, mask, scale)
    if q.device.type == "cpu":
        _verify(q, k, v, out, mask=mask, scale=scale)
    return out, None
