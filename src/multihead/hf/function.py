"""multihead's attention function in HF's registry: HF's call (queries, keys, values, mask, scale, extras) on
multihead's kernel seam and hook points, and a KV-policy cache's attention. Part of :mod:`multihead.hf.attach`."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from ..attention import attention
from ..attention.attn_mask import AttnMask
from ..attention.ops import expand_kv, zero_rows
from .probe import _unknown
from .record import AttachError, AttachedAttention, _RECORDS


# ------------------------------------------------------------------------------------------ the attention function
def _mask(attention_mask, module: nn.Module, lq: int, lk: int, is_causal) -> AttnMask | None:
    """HF's mask as multihead's structured one. None from HF's SDPA mask builder means causal (or nothing, for an
    encoder): the fused path then builds nothing ``Lq x Lk``. A tensor mask is converted once per call of the model
    (every layer gets the same mask object; the conversion is kept on it and dies with it), not once per layer."""
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return AttnMask(causal=True) if causal and lq > 1 else None
    kept = getattr(attention_mask, "_multihead_mask", None)
    if kept is not None and kept[:2] == (attention_mask._version, lk):
        return kept[2]
    am = _convert(attention_mask, lk)
    attention_mask._multihead_mask = (attention_mask._version, lk, am)
    return am


def _convert(attention_mask: Tensor, lk: int) -> AttnMask:
    m = attention_mask
    if m.dim() == 4 and m.shape[-1] != lk:
        m = m[..., :lk]
    if m.dtype == torch.bool:
        return AttnMask(tensor=m)
    low = torch.finfo(m.dtype).min / 2
    blocked = m <= low
    if bool(((m == 0) | blocked).all()):
        return AttnMask(tensor=~blocked)  # an additive 0 / min mask is a bool mask
    return AttnMask(tensor=m.masked_fill(blocked, -math.inf))  # a real bias (T5's positions) stays a bias


def _with_bias(am: AttnMask | None, bias: Tensor | None, lk: int) -> AttnMask | None:
    """T5's relative-position bias (transformers 5 passes it beside the mask) added to the mask as a float part."""
    if bias is None:
        return am
    bias = bias[..., :lk]
    if am is None:
        return AttnMask(tensor=bias)
    if am.tensor is None:
        return replace(am, tensor=bias)
    if am.tensor.dtype == torch.bool:
        return replace(am, tensor=bias.masked_fill(~am.tensor, -math.inf))
    return replace(am, tensor=am.tensor + bias)


def _capped(q: Tensor, k: Tensor, am: AttnMask | None, scale: float, cap: float, sinks: Tensor | None) -> Tensor:
    """Soft-capped weights (Gemma 2): ``softmax(cap tanh(q k^T scale / cap) + mask)``, fp32, empty rows zero."""
    acc = torch.promote_types(q.dtype, torch.float32)
    s = torch.matmul(q.to(acc), expand_kv(k, q.shape[1]).to(acc).transpose(-2, -1)) * scale
    s = torch.tanh(s / cap) * cap
    dense = None if am is None else am.dense(q.shape[2], k.shape[2], q.device)
    row_ok = None
    if dense is not None:
        neg = -torch.finfo(acc).max
        s = s.masked_fill(~dense, neg) if dense.dtype == torch.bool else (s + dense.to(acc)).clamp_min(neg)
        row_ok = (s > neg).any(-1, keepdim=True)
    if sinks is not None:
        b, h, i, _ = s.shape
        p = torch.softmax(torch.cat([sinks.to(acc).view(1, h, 1, 1).expand(b, h, i, 1), s], -1), -1)[..., 1:]
    else:
        p = torch.softmax(s, -1)
    return zero_rows(p, row_ok).to(q.dtype)


def multihead_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """HF's attention-function signature on multihead's kernel seam and hook points; returns ``(B, Lq, H, D)`` and
    the weights when the caller asked for them (``output_attentions``)."""
    rec: AttachedAttention | None = _RECORDS.get(module)
    extra = _unknown(kwargs)
    if extra:  # a code path the probe pass did not take hands tensors this function would ignore
        raise AttachError(
            f"{type(module).__name__} hands the attention function {', '.join(extra)}, which multihead's attention "
            "does not compute with; detach the model (multihead.hf.detach) for this call"
        )
    q, k, v = query, key, value
    if rec is not None:
        rec.observe(q, k)
        q, k, v = rec.hook_q(q), rec.hook_k(k), rec.hook_v(v)
        kv = rec.owner.kv if rec.owner is not None else None
        if kv is not None:  # multihead's cache (HF's is off): one new token reads every cached key, no mask
            k, v = kv.update(rec.index, k, v)
            attention_mask = None if q.shape[2] == 1 else attention_mask
    lq, lk = q.shape[2], k.shape[2]
    am = _with_bias(_mask(attention_mask, module, lq, lk, is_causal), kwargs.get("position_bias"), lk)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scaling is None else float(scaling)
    layer = rec.owner.policy_layer if rec is not None and rec.owner is not None else None
    if layer is not None:  # a multihead KV-policy cache: it keeps the keys and says what to attend
        rec.owner.policy_layer = None
        if layer.get_seq_length() > 0:  # a continuation: the mask spans the kept positions and the new ones
            am = _mask(attention_mask, module, lq, layer.get_seq_length() + lk, is_causal)
        return _policy_attention(module, rec, layer, q, k, v, am, scale, kwargs)
    if rec is not None:
        rec.scale = scale  # the layer's own scaling, as the last call had it (explain recomputes with it)
    cap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    sinks = None if sinks is None else sinks.to(q.dtype)
    p = float(dropout) if module.training else 0.0
    want = bool(kwargs.get("output_attentions", False)) or (
        rec is not None and rec.owner is not None and rec.owner.asking > 0
    )
    pattern = rec.hook_pattern if rec is not None and rec.hook_pattern.active else None
    if cap:
        w = _capped(q, k, am, scale, float(cap), sinks)
        if rec is not None and rec.hook_stats.active:
            from ..attention.stats import map_stats

            rec.hook_stats(map_stats(w.detach(), offset=lk - lq, **rec.stats_options))
        w = pattern(w) if pattern is not None else w
        dropped = nn.functional.dropout(w, p=p) if p > 0 else w
        z = torch.matmul(dropped, expand_kv(v, q.shape[1]))
        weights = w if want else None
    else:
        if rec is not None and rec.hook_stats.active:
            from ..attention.stats import attention_stats

            rec.hook_stats(attention_stats(q, k, mask=am, scale=scale, sinks=sinks, **rec.stats_options))
        z, weights = attention(
            q,
            k,
            v,
            mask=am,
            scale=scale,
            dropout_p=p,
            need_weights=want,
            backend=rec.backend if rec is not None else "auto",
            weights_hook=pattern,
            sinks=sinks,
        )
    if rec is not None:
        z = rec.hook_z(z)
    head_mask = kwargs.get("head_mask")
    if head_mask is not None:  # HF's eager head_mask scales each head's weights: the same as scaling its output
        z = z * head_mask
    return z.transpose(1, 2).contiguous(), weights


def _policy_attention(module, rec, layer, q: Tensor, k: Tensor, v: Tensor, am, scale: float, kwargs):
    """Attention through a multihead KV-policy cache layer (:mod:`multihead.hf.cache`): ``update`` stores what the
    policy keeps and answers the views to attend (one of every head, or one per group of heads with their own
    keys), the views are attended on the kernel seam, then ``done`` scores and evicts."""
    if rec is None or layer.index != rec.index:
        raise AttachError(
            f"{type(module).__name__}: the KV-policy cache's layer {layer.index} reached another layer's attention "
            f"({'not attached' if rec is None else rec.index}); the model's layers call the cache out of order"
        )
    if kwargs.get("softcap") or kwargs.get("position_bias") is not None or kwargs.get("head_mask") is not None:
        raise AttachError(
            f"{type(module).__name__} soft-caps its scores, adds a position bias or masks heads; a KV-policy cache "
            "attends through the kernel seam's plain softmax only"
        )
    sinks = kwargs.get("s_aux")
    q, views = layer.kv.update(q, k, v, mask=am)  # keys arrive rotated at their positions: no rotary here
    want = bool(kwargs.get("output_attentions", False)) or (rec.owner is not None and rec.owner.asking > 0)
    if len(views) == 1 and views[0].heads is None:
        view = views[0]
        pattern = rec.hook_pattern if rec.hook_pattern.active else None
        z, weights = attention(
            q,
            view.k,
            view.v,
            mask=view.mask,
            scale=scale,
            need_weights=want,
            backend=rec.backend,
            weights_hook=pattern,
            sinks=None if sinks is None else sinks.to(q.dtype),
        )
    else:  # heads that keep different keys: no single map to hook or return
        if want or rec.hook_pattern.active or rec.hook_stats.active:
            raise AttachError(
                f"this layer's heads keep different keys under the {layer.kv.policy.name} policy, so there is no single "
                "attention map: capture with policy='full' or a uniform policy"
            )
        from ..modules.kv import attend_groups

        z = attend_groups(q, views, backend=rec.backend, scale=scale, sinks=sinks)
        weights = None
    layer.kv.done(q, views, None if sinks is None else sinks.detach().float())
    z = rec.hook_z(z)
    return z.transpose(1, 2).contiguous(), weights
