"""How a stack's attention is chosen: :class:`AttentionConfig` (nested in the encoder and decoder configs) and its
factory :func:`build_attention`, plus the variants that replace the per-head softmax map, as subclasses of
:class:`~multihead.modules.attention.MultiHeadAttention` that override only what differs (their parameters and
:meth:`_kernel`). Combinations that cannot train are refused when the config is made, with the reason.

Where each variant lives:

* ALiBi and learned sinks are parts of the kernel seam (an ``AttnMask`` part built once per stack; ``attention(...,
  sinks=)``), so every module that calls the seam takes them -- plain MHA and MLA alike;
* the output gate is one option of ``MultiHeadAttention`` applied in one place (before the output projection);
* differential attention and talking heads replace the softmax map: the subclasses below;
* MLA (``mla_latent > 0``) has its own projections and cache: :class:`~multihead.modules.mla.MultiHeadLatentAttention`.

Everything else -- projections, rotary, the KV cache, hooks, ``head_mask``, ``capture``, statistics (of the explicit
map for the subclasses, :func:`multihead.attention.stats.map_stats`) -- is inherited.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from .._config import from_fields
from ..attention.registry import attention, get_backend
from .attention import MultiHeadAttention
from .positional import Rotary

if TYPE_CHECKING:
    from .mla import MultiHeadLatentAttention


def check_variants(*, differential: bool = False, talking_heads: bool = False, sinks: bool = False) -> None:
    """Refuse the variant combinations that cannot work, with the reason (never a silently unused parameter)."""
    if differential and talking_heads:
        raise ValueError(
            "differential attention and talking heads cannot be combined: each replaces the per-head "
            "softmax map (a difference of two maps; maps mixed across heads) and the two would leave "
            "talk_logits/talk_weights without a gradient; choose one"
        )
    if sinks and (differential or talking_heads):
        other = "differential attention" if differential else "talking heads"
        raise ValueError(
            f"learned sinks cannot be combined with {other}: its map is not one softmax per head whose "
            "denominator a sink logit could join, so sink_logits would never be used; choose one"
        )


@dataclass
class AttentionConfig:
    """How a stack builds its (self-)attention; saved inside the encoder's and decoder's config.json. One place a
    variant is chosen: :meth:`build` makes the module, and combinations that cannot train are refused here, when the
    config is made (from Python, JSON or ``--set``), never silently ignored."""

    num_kv_heads: int | None = None  # key/value heads (GQA); default num_heads (MHA); 1 = multi-query attention
    dropout: float = 0.0  # on the attention weights; > 0 costs PyTorch's fused CPU kernel
    backend: str = "auto"  # a kernel-seam backend name, or auto
    pattern: dict | None = None  # sparse self-attention, e.g. {"window": 128} or {"block": 64, "random_blocks": 2}
    gate: bool = False  # a sigmoid gate on each head's output (Qiu et al. 2025)
    alibi: bool = False  # ALiBi distance biases (Press et al. 2022); a CausalLM sets it from positional="alibi"
    sinks: bool = False  # a learned sink logit per head in every softmax denominator (as gpt-oss)
    differential: bool = False  # differential attention (Ye et al. 2025); lambda_init by layer depth
    talking_heads: bool = False  # talking heads (Shazeer et al. 2020; explicit weights)
    mla_latent: int = 0  # > 0: Multi-head Latent Attention with this KV latent width (DeepSeek-V2); its own rope key
    mla_rope_dim: int = 16  # MLA's decoupled rotary key width
    head_dim: int | None = None  # each head's width; default d_model // num_heads (Qwen3, Gemma 3: wider)
    qk_norm: bool = False  # RMSNorm over each head's queries and keys before rotary (Qwen3, Gemma 3)

    def __post_init__(self) -> None:
        check_variants(differential=self.differential, talking_heads=self.talking_heads, sinks=self.sinks)
        if self.mla_latent:
            other = [
                n
                for n in ("gate", "differential", "talking_heads", "pattern", "head_dim", "qk_norm")
                if getattr(self, n)
            ]
            if other:
                raise ValueError(
                    f"Multi-head Latent Attention (mla_latent={self.mla_latent}) does not take "
                    f"{', '.join(other)}: it has one softmax over its latent and no per-head output to "
                    "gate; turn those off or set mla_latent=0 (ALiBi and sinks it takes)"
                )
        if self.pattern is not None and (self.sinks or self.differential or self.talking_heads):
            raise ValueError(
                "a sparse pattern runs one softmax per head on a sparse kernel; it cannot take sinks, "
                "differential attention or talking heads: drop the pattern or the variant"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AttentionConfig:
        return from_fields(cls, d)

    @property
    def cross(self) -> AttentionConfig:
        """The options a cross-attention takes from this config (heads, dropout, backend; no variant)."""
        return AttentionConfig(
            num_kv_heads=self.num_kv_heads, dropout=self.dropout, backend=self.backend, head_dim=self.head_dim
        )

    def build(
        self,
        d_model: int,
        num_heads: int,
        *,
        bias: bool = True,
        rotary: Rotary | None = None,
        kdim: int | None = None,
        layer_index: int = 0,
        need_weights: bool = False,
        out_bias: bool | None = None,
        norm_eps: float = 1e-6,
    ) -> MultiHeadAttention | MultiHeadLatentAttention:
        """The attention module of this config for a stack of width ``d_model`` with ``num_heads`` heads."""
        if self.mla_latent:
            from .mla import MultiHeadLatentAttention

            if out_bias not in (None, bias):
                raise ValueError("Multi-head Latent Attention takes one bias setting for all its projections")
            return MultiHeadLatentAttention(
                d_model,
                num_heads,
                kv_latent=self.mla_latent,
                rope_dim=self.mla_rope_dim,
                dropout=self.dropout,
                backend=self.backend,
                bias=bias,
                alibi=self.alibi,
                sinks=self.sinks,
                need_weights=need_weights,
            )
        return build_attention(
            d_model,
            num_heads,
            num_kv_heads=self.num_kv_heads,
            dropout=self.dropout,
            bias=bias,
            backend=self.backend,
            need_weights=need_weights,
            rotary=rotary,
            kdim=kdim,
            vdim=kdim,
            pattern=self.pattern,
            gate=self.gate,
            alibi=self.alibi,
            sinks=self.sinks,
            differential=self.differential,
            talking_heads=self.talking_heads,
            layer_index=layer_index,
            out_bias=out_bias,
            head_dim=self.head_dim,
            qk_norm=norm_eps if self.qk_norm else None,
        )

    def rotary_dim(self, head_dim: int) -> int:
        """The width a stack's shared rotary module rotates (differential attention rotates each half)."""
        return head_dim // 2 if self.differential else head_dim


# Flat fields the encoder/decoder configs had before AttentionConfig: config.json files and ``--set`` keys that
# still name them are read into the nested config (``model.encoder.num_kv_heads`` = ``...attention.num_kv_heads``).
LEGACY_FIELDS = {
    "num_kv_heads": "attention.num_kv_heads",
    "attn_dropout": "attention.dropout",
    "backend": "attention.backend",
    "pattern": "attention.pattern",
    "gate": "attention.gate",
    "alibi": "attention.alibi",
    "sinks": "attention.sinks",
    "differential": "attention.differential",
    "talking_heads": "attention.talking_heads",
    "mla_latent": "attention.mla_latent",
    "mla_rope_dim": "attention.mla_rope_dim",
}


def build_attention(
    d_model: int,
    num_heads: int,
    *,
    differential: bool = False,
    talking_heads: bool = False,
    layer_index: int = 0,
    **options,
) -> MultiHeadAttention:
    """The attention module for these options: :class:`DifferentialAttention`, :class:`TalkingHeadsAttention` or
    plain :class:`MultiHeadAttention` (``options``: its keyword arguments: ``num_kv_heads``, ``gate``, ``alibi``,
    ``sinks``, ``rotary``, ``backend``, ...). Impossible combinations are refused here, with the reason."""
    check_variants(differential=differential, talking_heads=talking_heads, sinks=options.get("sinks", False))
    if differential:
        return DifferentialAttention(d_model, num_heads, layer_index=layer_index, **options)
    if talking_heads:
        return TalkingHeadsAttention(d_model, num_heads, **options)
    return MultiHeadAttention(d_model, num_heads, **options)


class _HalfRotary(nn.Module):
    """A rotary module of ``D / 2`` applied to each half of ``(B, H, L, D)`` heads (differential attention rotates
    its two q/k halves separately, as the paper): the same methods as :class:`RotaryEmbedding`."""

    def __init__(self, inner: Rotary) -> None:
        super().__init__()
        self.inner = inner

    @staticmethod
    def _split(t: Tensor) -> Tensor:
        b, h, l, d = t.shape
        return t.view(b, h, l, 2, d // 2).transpose(2, 3).reshape(b, 2 * h, l, d // 2)

    @staticmethod
    def _join(t: Tensor, h: int) -> Tensor:
        b, _, l, half = t.shape
        return t.view(b, h, 2, l, half).transpose(2, 3).reshape(b, h, l, 2 * half)

    def rotate(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        return self._join(self.inner.rotate(self._split(x), offset, positions), x.shape[1])

    def rotate_pair(
        self, q: Tensor, k: Tensor, offset: int = 0, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        a, b = self.inner.rotate_pair(self._split(q), self._split(k), offset, positions)
        return self._join(a, q.shape[1]), self._join(b, k.shape[1])

    def forward(self, q: Tensor, k: Tensor):
        a, b = self.inner(self._split(q), self._split(k))
        return self._join(a, q.shape[1]), self._join(b, k.shape[1])


class DifferentialAttention(MultiHeadAttention):
    """Differential attention (Ye et al. 2025, arXiv 2410.05258).

    Per head ``(softmax(q1 k1^T) - lambda softmax(q2 k2^T)) v`` with q, k split in halves (scale ``(D/2)^-1/2``; a
    rotary module of ``D / 2`` rotates each half), ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init``,
    ``lambda_init = 0.8 - 0.6 exp(-0.3 layer_index)``, then RMSNorm per head and ``* (1 - lambda_init)``. One kernel
    call over ``2H`` half heads; ``hook_pattern`` and weights are the differential map ``A1 - lambda A2``
    (read-only). ``layer_index`` sets ``lambda_init``. Not with learned sinks.
    """

    def __init__(self, d_model: int, num_heads: int, *, layer_index: int = 0, **options) -> None:
        check_variants(differential=True, sinks=options.get("sinks", False))
        super().__init__(d_model, num_heads, **options)
        # each head's q and k split in halves, two softmax maps over the same values, (A1 - lambda A2) V,
        # RMS-normalised per head and scaled by (1 - lambda_init)
        if self.head_dim % 2:
            raise ValueError(
                f"differential attention splits each head's q and k in two; head_dim={self.head_dim} "
                "is odd: choose d_model / num_heads even"
            )
        half = self.head_dim // 2
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_index)
        self.lambda_q = nn.Parameter(torch.randn(2, half) * 0.1)  # lambda = exp(q1.k1) - exp(q2.k2) + init
        self.lambda_k = nn.Parameter(torch.randn(2, half) * 0.1)
        self.diff_norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        if self.rotary is not None:
            self.rotary = _HalfRotary(self.rotary)

    def differential_lambda(self) -> Tensor:
        lq, lk = self.lambda_q, self.lambda_k
        return torch.exp((lq[0] * lk[0]).sum()) - torch.exp((lq[1] * lk[1]).sum()) + self.lambda_init

    def _kernel(self, q, k, v, mask, head_mask, need_weights: bool, p: float, backend: str):
        """Both maps in one kernel call: heads split into halves ``(B, 2H, L, D/2)`` (half a, half b of each head
        adjacent), the values repeated for both; then ``A1 V - lambda A2 V``, RMSNorm per head, ``1 - lambda_init``."""
        b, h, lq, d = q.shape
        g = k.shape[1]

        def halves(t: Tensor, n: int) -> Tensor:
            return t.view(b, n, t.shape[2], 2, d // 2).transpose(2, 3).reshape(b, 2 * n, t.shape[2], d // 2)

        want = need_weights or self.hook_pattern.active or self.hook_stats.active
        if mask is not None and mask.alibi is not None:  # each head's slope for both of its half heads
            mask = mask.with_alibi([m for m in mask.alibi for _ in range(2)])
        if want and backend != "auto" and not get_backend(backend).capabilities.returns_weights:
            backend = "auto"
        z2, w2 = attention(
            halves(q, h),
            halves(k, g),
            v.repeat_interleave(2, dim=1),
            mask=mask,
            dropout_p=p,
            need_weights=want,
            backend=backend,
            scale=(d // 2) ** -0.5,
        )  # (B, 2H, Lq, D)
        lam = self.differential_lambda().to(z2.dtype)
        z2 = z2.view(b, h, 2, lq, d)
        z = self.diff_norm(z2[:, :, 0] - lam * z2[:, :, 1]) * (1 - self.lambda_init)  # (B, H, Lq, D)
        weights = None
        if want and w2 is not None:
            w2 = w2.view(b, h, 2, lq, -1)
            weights = w2[:, :, 0] - lam * w2[:, :, 1]  # (B, H, Lq, Lk): the differential map
            self._map_stats(weights, mask)
            if self.hook_pattern.active:
                self.hook_pattern(weights)
        z = self.hook_z(z)
        if head_mask is not None:
            z = z * self._head_scale(head_mask, b, z.dtype)
        return z, weights if need_weights else None


class TalkingHeadsAttention(MultiHeadAttention):
    """Talking-heads attention (Shazeer et al. 2020, arXiv 2003.02436).

    ``s'_g = sum_h P_l[h, g] s_h`` before the softmax and ``w'_g = sum_h P_w[h, g] w_h`` after it, ``P`` learned
    ``H x H`` (identity at start). Needs the explicit ``L x L`` weights of every head (no fused kernel can mix
    heads): memory is quadratic. Heads are mixed, so removing one changes the others: ``prune_heads`` is refused
    (``head_mask`` still works). Not with learned sinks.
    """

    def __init__(self, d_model: int, num_heads: int, **options) -> None:
        check_variants(talking_heads=True, sinks=options.get("sinks", False))
        super().__init__(d_model, num_heads, **options)
        # the heads' logits mixed by a learned H x H matrix before the softmax, the weights by another after it
        # (both start as the identity: plain MHA)
        self.talk_logits = nn.Parameter(torch.eye(num_heads))
        self.talk_weights = nn.Parameter(torch.eye(num_heads))

    def _kernel(self, q, k, v, mask, head_mask, need_weights: bool, p: float, backend: str):
        """Talking heads, explicitly: scores ``(B, H, Lq, Lk)`` mixed across heads, masked, softmax, mixed again."""
        from ..attention.ops import expand_kv, zero_rows

        h = q.shape[1]
        k, v = expand_kv(k, h), expand_kv(v, h)
        work = torch.promote_types(q.dtype, torch.float32)
        s = torch.matmul(q, k.transpose(-2, -1)).to(work) * q.shape[-1] ** -0.5  # (B, H, Lq, Lk)
        s = torch.einsum("bhij,hg->bgij", s, self.talk_logits.to(work))
        dense = (
            None
            if mask is None
            else mask.check(q.shape[0], h, q.shape[2], k.shape[2], q.device, q.dtype).dense(
                q.shape[2], k.shape[2], q.device
            )
        )
        row_ok = None
        if dense is not None:
            if dense.dtype == torch.bool:
                s = s.masked_fill(~dense, -math.inf)
            else:
                s = s + dense.to(work)
            row_ok = torch.isfinite(s).any(-1, keepdim=True)
            s = s.masked_fill(~row_ok, 0.0)
        w = zero_rows(torch.softmax(s, -1), row_ok)
        w = torch.einsum("bhij,hg->bgij", w, self.talk_weights.to(work)).to(q.dtype)
        self._map_stats(w, mask)
        if self.hook_pattern.active:
            w = self.hook_pattern(w)
        z = torch.matmul(torch.nn.functional.dropout(w, p) if p else w, v)
        z = self.hook_z(z)
        if head_mask is not None:
            z = z * self._head_scale(head_mask, q.shape[0], z.dtype)
        return z, (w if need_weights else None)

    def prune_heads(self, heads) -> None:
        if sorted(set(int(x) for x in heads)):
            raise ValueError(
                "talking-heads attention mixes its heads: removing one changes every other, so it cannot "
                "be pruned physically; mask heads with head_mask= instead"
            )


__all__ = [
    "AttentionConfig",
    "DifferentialAttention",
    "LEGACY_FIELDS",
    "TalkingHeadsAttention",
    "build_attention",
    "check_variants",
]
