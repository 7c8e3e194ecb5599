"""Linear attention, ``O(L)`` time and memory, approximate: ``out_i = phi(q_i) S / (phi(q_i) z)`` with
``S = sum_j phi(k_j) v_j^T`` and ``z = sum_j phi(k_j)`` (causal: prefix sums, computed chunk by chunk).

* ``linear_elu``: ``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020). A different model, not an approximation of
  softmax: use it to train from scratch.
* ``performer``: FAVOR+ positive orthogonal random features (Choromanski et al. 2021),
  ``phi(x) = exp(w^T x' - |x'|^2 / 2) / sqrt(m)`` with ``x' = x * scale^(1/2)``, so ``E[phi(q) phi(k)] =
  exp(q.k * scale)``: an unbiased estimate of softmax attention whose error shrinks as the number of features ``m``
  grows (tested). Features are drawn once per ``(d, m, seed)`` and reused.

Masks: key padding (``(B, Lk)`` bool, True = real key) and causal with ``Lq == Lk``, taken natively from the
:class:`~multihead.attention.attn_mask.AttnMask`; the registry declines other masks with the fix. No weights, no
dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..registry import Capabilities, register_backend
from ..ops import expand_kv

CHUNK = 256
_FEATURES: dict = {}


def orthogonal_features(d: int, m: int, seed: int = 0, device=None, dtype=torch.float32) -> Tensor:
    """``(m, d)`` random features: blocks of orthogonal rows with chi-distributed norms (FAVOR+)."""
    key = (d, m, seed, str(device), dtype)
    if key not in _FEATURES:
        gen = torch.Generator().manual_seed(seed)
        blocks = []
        for _ in range(-(-m // d)):
            qmat, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
            blocks.append(qmat.T)
        w = torch.cat(blocks)[:m]  # (m, d), orthonormal rows within each block
        norms = torch.randn(m, d, generator=gen, dtype=torch.float64).norm(dim=1, keepdim=True)
        _FEATURES[key] = (w * norms).to(device=device, dtype=dtype)
    return _FEATURES[key]


def _linear(fq: Tensor, fk: Tensor, v: Tensor, keep: Tensor | None, causal: bool, chunk: int = CHUNK) -> Tensor:
    """``fq`` ``(b, h, i, m)``, ``fk`` ``(b, h, j, m)`` non-negative features; returns ``(b, h, i, dv)``."""
    if keep is not None:
        fk = fk * keep[:, None, :, None].to(fk.dtype)  # padded keys contribute nothing
    if not causal:
        s = torch.einsum("bhjm,bhjd->bhmd", fk, v)  # (b, h, m, dv)
        z = fk.sum(2)  # (b, h, m)
        num = torch.einsum("bhim,bhmd->bhid", fq, s)
        den = torch.einsum("bhim,bhm->bhi", fq, z)[..., None]
        return num / den.clamp_min(1e-12)
    b, h, length, m = fq.shape
    s = fq.new_zeros(b, h, m, v.shape[-1])
    z = fq.new_zeros(b, h, m)
    out = []
    tri = None
    for i0 in range(0, length, chunk):
        qc, kc, vc = fq[:, :, i0 : i0 + chunk], fk[:, :, i0 : i0 + chunk], v[:, :, i0 : i0 + chunk]
        n = qc.shape[2]
        if tri is None or tri.shape[0] != n:
            tri = torch.ones(n, n, dtype=torch.bool, device=fq.device).tril()
        a = torch.einsum("bhim,bhjm->bhij", qc, kc) * tri  # (b, h, n, n): inside the chunk, j <= i
        num = torch.einsum("bhim,bhmd->bhid", qc, s) + a @ vc
        den = torch.einsum("bhim,bhm->bhi", qc, z) + a.sum(-1)
        out.append(num / den[..., None].clamp_min(1e-12))
        s = s + torch.einsum("bhjm,bhjd->bhmd", kc, vc)
        z = z + kc.sum(2)
    return torch.cat(out, 2)


def elu_features(x: Tensor) -> Tensor:
    return F.elu(x) + 1


def performer_features(x: Tensor, w: Tensor, scale: float, is_query: bool) -> Tensor:
    """FAVOR+ positive features of ``(b, h, L, d)`` -> ``(b, h, L, m)``; a per-row (queries) or per-head (keys)
    stabiliser is subtracted in the exponent and cancels in the ratio."""
    x = x * math.sqrt(scale)  # so that phi(q).phi(k) estimates exp(q.k * scale)
    proj = x @ w.T  # (b, h, L, m)
    logits = proj - (x * x).sum(-1, keepdim=True) / 2
    stab = logits.amax(-1, keepdim=True) if is_query else logits.amax((-1, -2), keepdim=True)
    return torch.exp(logits - stab) / math.sqrt(w.shape[0])


def performer_attention(
    q,
    k,
    v,
    *,
    num_features: int = 256,
    seed: int = 0,
    key_padding: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """FAVOR+ attention ``(b, h, i, d)``; ``key_padding`` ``(b, j)`` bool, True = real key."""
    _causal_square(q, k, is_causal)
    b, h, lq, d = q.shape
    scale = d**-0.5 if scale is None else scale
    work = torch.promote_types(q.dtype, torch.float32)
    keep = key_padding
    k, v = expand_kv(k, h).to(work), expand_kv(v, h).to(work)
    w = orthogonal_features(d, num_features, seed, q.device, work)
    fq = performer_features(q.to(work), w, scale, True)
    fk = performer_features(k, w, scale, False)
    return _linear(fq, fk, v, keep, is_causal).to(q.dtype)


def elu_attention(q, k, v, *, key_padding: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """``elu(x) + 1`` linear attention ``(b, h, i, d)``; ``key_padding`` ``(b, j)`` bool, True = real key."""
    _causal_square(q, k, is_causal)
    h = q.shape[1]
    work = torch.promote_types(q.dtype, torch.float32)
    keep = key_padding
    k, v = expand_kv(k, h).to(work), expand_kv(v, h).to(work)
    return _linear(elu_features(q.to(work)), elu_features(k), v, keep, is_causal).to(q.dtype)


def _causal_square(q, k, is_causal):
    if is_causal and q.shape[2] != k.shape[2]:
        raise ValueError("causal linear attention needs Lq == Lk")


@register_backend(
    "performer",
    Capabilities(
        returns_weights=False, supports_dropout=False, exact=False, mask_parts=("key_padding", "causal_square")
    ),
    priority=-10,
    description="Performer FAVOR+ (256 positive orthogonal random features): O(L), approximates softmax",
)
def performer_backend(q, k, v, *, mask, dropout_p, scale, need_weights):
    kp, causal = (None, False) if mask is None else (mask.key_padding, mask.causal)
    return performer_attention(q, k, v, key_padding=kp, is_causal=causal, scale=scale), None


@register_backend(
    "linear_elu",
    Capabilities(
        returns_weights=False, supports_dropout=False, exact=False, mask_parts=("key_padding", "causal_square")
    ),
    priority=-10,
    description="linear attention with elu(x)+1 features (Katharopoulos et al. 2020): O(L), not softmax",
)
def elu_backend(q, k, v, *, mask, dropout_p, scale, need_weights):
    kp, causal = (None, False) if mask is None else (mask.key_padding, mask.causal)
    return elu_attention(q, k, v, key_padding=kp, is_causal=causal), None


__all__ = ["elu_attention", "orthogonal_features", "performer_attention"]
