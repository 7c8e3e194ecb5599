"""One way to call PyTorch's FlexAttention with an :class:`~multihead.attention.attn_mask.AttnMask`, shared by the
``flex`` backend, the CUDA route of the ``memory_efficient`` backend and the statistics' log-sum-exp pass.

* the mask's bool parts become ``mask_mod`` and its float part ``score_mod`` (:meth:`AttnMask.mask_mod`);
* the block mask comes from geometry where the structure allows it (:mod:`multihead.attention.block_masks`: a
  sparse pattern, or causal at any offset, with full tiles that skip ``mask_mod``), else from ``create_block_mask``
  over the mask's tensor (which is ``Lq x Lk`` already); built once per :meth:`AttnMask.cache_key`;
* ``lse=True`` also returns the row log-sum-exp (natural log, ``-inf`` for rows with no allowed key), through
  ``return_aux=AuxRequest(lse=True)`` (PyTorch >= 2.9) or ``return_lse=True`` before it.

``compiled=True`` runs ``torch.compile(flex_attention)`` (the fast kernel; on CPU inference only, and no lse);
``compiled=False`` runs FlexAttention's eager reference (materialises the scores: for checking this code on CPU).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from .attn_mask import AttnMask


@lru_cache(maxsize=1)
def compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


_BLOCK_MASKS: dict = {}


def block_mask(mask: AttnMask | None, b: int, lq: int, lk: int, device):
    """The block mask of ``mask``'s bool parts (None when it has none), cached by :meth:`AttnMask.cache_key` (the
    pattern by value; tensors by storage and version counter, so an in-place edit never returns a stale mask)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from .block_masks import causal_block_mask, pattern_block_mask

    has_tensor = mask is not None and mask.tensor is not None and mask.tensor.dtype == torch.bool
    if mask is None or not (mask.pattern is not None or mask.causal or mask.key_padding is not None or has_tensor):
        return None  # no bool part: nothing to skip (a float part is a score_mod)
    key = mask.cache_key(lq, lk, device)  # checked before anything is built: a hit costs no device work
    if key not in _BLOCK_MASKS:
        if len(_BLOCK_MASKS) > 32:
            _BLOCK_MASKS.clear()
        if mask.pattern is not None and not has_tensor and lq == lk:
            _BLOCK_MASKS[key] = pattern_block_mask(mask, lq, device)  # O((L / block)^2), not L^2
        elif mask.pattern is None and mask.causal and not has_tensor:
            _BLOCK_MASKS[key] = causal_block_mask(mask, lq, lk, device)
        else:
            per_batch, per_head = mask.mask_mod_axes()
            _BLOCK_MASKS[key] = create_block_mask(
                mask.mask_mod(lq, lk, device),
                b if per_batch else None,
                _heads(mask) if per_head else None,
                lq,
                lk,
                device=device,
            )
    return _BLOCK_MASKS[key]


def _heads(mask: AttnMask) -> int:
    t = mask.tensor
    if t is None:
        return 1
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).shape[1]


def flex_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: AttnMask | None, scale: float, *, lse: bool = False, compiled: bool = True
):
    """``out`` ``(b, h, i, dv)``, or ``(out, lse (b, h, i))`` with ``lse=True``: softmax attention under every part
    of ``mask``; ``k``/``v`` may have fewer heads (GQA)."""
    from torch.nn.attention import flex_attention as fa

    b, h, lq, _ = q.shape
    lk = k.shape[2]
    bm = block_mask(mask, b, lq, lk, q.device)
    score_mod = mask.score_mod(lq, lk, q.device) if mask is not None else None
    fn = compiled_flex() if compiled else fa.flex_attention
    kwargs = dict(score_mod=score_mod, block_mask=bm, scale=scale, enable_gqa=k.shape[1] != h)
    if not lse:
        return fn(q, k, v, **kwargs)
    if hasattr(fa, "AuxRequest"):
        out, aux = fn(q, k, v, return_aux=fa.AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    return fn(q, k, v, return_lse=True, **kwargs)


def why_no_fast_flex(device: torch.device | str) -> str | None:
    """None where the compiled FlexAttention kernel runs with gradients and lse (CUDA), else the reason."""
    if torch.device(device).type != "cuda":
        return "the compiled FlexAttention kernel runs with gradients and log-sum-exp only on CUDA"
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return "needs torch.nn.attention.flex_attention (PyTorch >= 2.5)"
    return None


__all__ = ["block_mask", "compiled_flex", "flex_attention", "why_no_fast_flex"]
