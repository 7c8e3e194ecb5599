"""Multi-head attention module: owns the projections and reshapes, calls the kernel seam.

Shape legend: ``B`` batch, ``Lq``/``Lk`` query/key length, ``E`` d_model, ``H`` query heads, ``G`` key/value heads,
``D`` head dim (``E // H``).

One module over the usual size on purpose: the projections' layout is private to the class and shared by its
forward, packed forward, pruning and the ``nn.MultiheadAttention`` converters.
"""

from __future__ import annotations

import math
import struct
import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..attention import patterns as _patterns
from ..attention.attn_mask import AttnMask
from ..attention.registry import attention, check_backend_name, get_backend
from . import fastpath

if TYPE_CHECKING:
    from .positional import Rotary
from .hooks import HookPoint
from .kv import KVView, LayerKV, attend_groups


def alibi_slope_values(num_heads: int) -> tuple[float, ...]:
    """ALiBi's head slopes (Press et al. 2022) as numbers (what an ``AttnMask``'s ALiBi part holds): ``2^(-8 i / n)``
    for ``i = 1..n`` when ``n`` is a power of two; otherwise those of the next lower power of two, then every other
    slope of the next higher one."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads <= 0:
        return ()
    low = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(low)
    if low < num_heads:
        slopes += power_of_two(2 * low)[0::2][: num_heads - low]
    return tuple(struct.unpack("f", struct.pack("f", s))[0] for s in slopes)  # the fp32 values the buffer holds


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's head slopes as a tensor ``(num_heads,)`` (see :func:`alibi_slope_values`)."""
    return torch.tensor(alibi_slope_values(num_heads)) if num_heads > 0 else torch.zeros(0)


def head_columns(heads: list[int], width: int) -> Tensor:
    """The feature indices of ``heads`` in a ``(heads x width)`` projection: what pruning keeps of each matrix."""
    return torch.tensor([i * width + c for i in heads for c in range(width)], dtype=torch.long)


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention: ``Concat(head_1..head_H) W_o`` with ``head_i = Attention(Q W_q^i, K W_k^i, V W_v^i)``.

    Args:
        d_model: model width ``E``; must be divisible by ``num_heads``.
        num_heads: query heads ``H``; each head has ``D = E // H`` dims.
        num_kv_heads: key/value heads ``G`` (``H % G == 0``); default ``H`` (MHA), ``1`` is multi-query attention.
        dropout: dropout on the attention weights during training. 0 keeps PyTorch's fast fused CPU kernel (it
            falls back to a slower one with dropout > 0); models keep residual/FFN dropout instead.
        bias: add biases to the projections.
        out_bias: a bias on the output projection; default ``bias`` (Qwen2 has biases on q, k, v but not on the
            output).
        head_dim: each head's width ``D``; default ``E // H``. Given, the projections are ``E -> H * D`` and back
            (Qwen3 and Gemma 3 heads are wider than ``E / H``).
        qk_norm: the epsilon of an RMSNorm over each head's queries and keys (QK-norm, before rotary); None: off.
        kdim, vdim: input widths of key and value (cross-attention from another model), default ``E``.
        backend: attention backend name or ``"auto"`` (see :func:`multihead.attention.list_backends`).
        need_weights: default for :meth:`forward`'s ``need_weights``. **True** by default so that a standalone
            call returns per-head weights as in the tutorial (``o, w = mha(x)``); the library's blocks build their
            attention with ``need_weights=False`` and so never pay for weights unless asked (PyTorch's
            ``need_weights=True`` default silently slows every model that forgets to pass False,
            pytorch/pytorch#34537).
        rotary: optional :class:`multihead.RotaryEmbedding` applied to q and k.
        gate: gated attention (Qiu et al. 2025): ``z_h *= sigmoid(query W_g)_h`` elementwise per head, before the
            output projection (after ``hook_z`` and ``head_mask``).
        alibi: ALiBi (Press et al. 2022): ``-m_h |pos(i) - j|`` added to the scores, slopes ``2^(-8 h / H)``; the
            ALiBi part of the call's :class:`AttnMask` (bottom-right aligned, so a KV cache sees the same distances).
            A stack puts it in the mask it builds once for every layer (densified once, or a FlexAttention
            ``score_mod``); a standalone call adds it here. (Differential attention and talking heads replace the
            per-head softmax map: they are the subclasses :class:`~multihead.modules.variants.DifferentialAttention`
            and :class:`~multihead.modules.variants.TalkingHeadsAttention`;
            :func:`~multihead.modules.variants.build_attention` picks the class from the options.)
        sinks: learned attention sinks: a logit ``sink_h`` per head joins every softmax denominator (the weights
            then sum to ``1 - sink share``), passed to the kernel seam (``attention(..., sinks=)``), which runs them
            natively where a backend can and as one exact extra key elsewhere; weights, ``hook_pattern`` and
            statistics are over the real keys (``hook_stats``' ``sink`` holds each row's share). Not on sparse kernels.
        pattern: optional :class:`~multihead.attention.patterns.SparsePattern` (or its dict) for self-attention:
            each query sees only the pattern's keys (sliding window, global tokens, BigBird blocks); with
            ``backend="auto"`` a sparse backend runs it without building ``L x L``.

    Hook points (read or edit with forward hooks; see :mod:`multihead.modules.hooks`):

        ``hook_q`` ``(B, H, Lq, D)``, ``hook_k``/``hook_v`` ``(B, G, Lk, D)`` (after rotary),
        ``hook_pattern`` ``(B, H, Lq, Lk)`` weights after softmax (editing them changes the output),
        ``hook_z`` ``(B, H, Lq, D)`` per-head outputs before ``head_mask`` and the output projection,
        ``hook_stats`` an :class:`~multihead.attention.stats.AttentionStats` of the call: exact per-head entropy,
        received mass, distance, top-k keys... from tiles, in memory linear in length (computed only when a hook is
        attached; options in the plain attribute ``stats_options``, e.g. ``{"topk": 8, "sets": {...}}``).
        When no hook on ``hook_pattern`` is attached and no weights are requested, nothing ``Lq x Lk`` is built
        on a fused backend.
    """

    rotary: Rotary | None
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    w_gate: nn.Linear | None

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        backend: str = "auto",
        need_weights: bool = True,
        rotary: Rotary | None = None,
        pattern=None,
        gate: bool = False,
        alibi: bool = False,
        sinks: bool = False,
        out_bias: bool | None = None,
        head_dim: int | None = None,
        qk_norm: float | None = None,
    ) -> None:
        super().__init__()
        if num_heads <= 0 or d_model <= 0:
            raise ValueError(f"d_model ({d_model}) and num_heads ({num_heads}) must be positive")
        if head_dim is not None and head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {head_dim}")
        if head_dim is None and d_model % num_heads != 0:
            ok = [h for h in range(1, min(d_model, 64) + 1) if d_model % h == 0]
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; pick num_heads from {ok} "
                f"or a d_model that is a multiple of {num_heads}"
            )
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            ok = [g for g in range(1, num_heads + 1) if num_heads % g == 0]
            raise ValueError(
                f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}; pick num_kv_heads from {ok}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        inner = num_heads * self.head_dim  # H * D: d_model unless head_dim is given (Qwen3, Gemma 3)
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        self.backend = check_backend_name(backend)
        self.need_weights = need_weights
        self.rotary = rotary
        self.pattern = _patterns.as_pattern(pattern)
        kv_width = num_kv_heads * self.head_dim
        self.w_q = nn.Linear(d_model, inner, bias=bias)
        self.w_k = nn.Linear(self.kdim, kv_width, bias=bias)
        self.w_v = nn.Linear(self.vdim, kv_width, bias=bias)
        self.w_o = nn.Linear(inner, d_model, bias=bias if out_bias is None else out_bias)
        # QK-norm (Qwen3, Gemma 3; Dehghani et al. 2023): an RMSNorm over each head's query and key, before rotary
        self.q_norm = nn.RMSNorm(self.head_dim, eps=qk_norm) if qk_norm is not None else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=qk_norm) if qk_norm is not None else None
        # gated attention (Qiu et al. 2025, arXiv 2505.06708, their best placement G1): each head's output scaled
        # elementwise by sigmoid(x W_g) of the query input, before the output projection
        self.w_gate = nn.Linear(d_model, inner, bias=True) if gate else None
        # ALiBi (Press et al. 2022): score_ij -= m_h |pos(i) - j|, one fixed slope per head, no position embedding
        if alibi:
            self.register_buffer("alibi_slopes", alibi_slopes(num_heads), persistent=False)
        else:
            self.alibi_slopes = None
        self._alibi = alibi_slope_values(num_heads) if alibi else None  # the mask part's slopes (no device read)
        # learned attention sinks (as in gpt-oss): one logit per head in every softmax denominator,
        # p_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)); the rows may now sum to less than 1
        self.sink_logits = nn.Parameter(torch.zeros(num_heads)) if sinks else None
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self.hook_stats = HookPoint()
        self.stats_options: dict = {}
        self.pruned_heads: list[int] = []

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, dropout={self.dropout}, backend={self.backend!r}"
            + (f", pattern={self.pattern.kind}" if self.pattern is not None else "")
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        head_mask: Tensor | None = None,
        need_weights: bool | None = None,
        average_attn_weights: bool = False,
        cache: LayerKV | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` (self-attention when they are omitted).

        Args:
            query: ``(B, Lq, E)``. key: ``(B, Lk, kdim)``, default ``query``. value: ``(B, Lk, vdim)``, default ``key``.
            mask: True = may attend (or a float bias). ``(Lq, Lk)``, ``(B, Lq, Lk)`` (shared by heads, as in the
                annotated transformer) or ``(B, H, Lq, Lk)``; any size-1 axis broadcasts. Or an
                :class:`~multihead.attention.attn_mask.AttnMask` built once by the caller (a model passes the same
                one to every layer).
            key_padding_mask: ``(B, Lk)``, **True = real token** (may be attended), False = padding. This is the
                opposite of ``nn.MultiheadAttention``: ``multihead.masks.from_torch_key_padding_mask`` converts
                PyTorch's into a ``(B, 1, 1, Lk)`` mask to pass as ``mask=``; or keep PyTorch's arguments and meaning
                with :class:`multihead.modules.compat.MultiheadAttention`.
            is_causal: causal self-attention (bottom-right aligned when ``Lq != Lk``).
            head_mask: ``(H,)`` or ``(B, H)``: a scale on each head's output (0 removes the head, 1 keeps it);
                differentiable, which is what head-importance scoring uses.
            need_weights: return per-head weights; default: the constructor's ``need_weights``.
            average_attn_weights: average the returned weights over heads ``(B, Lq, Lk)``.
            cache: a :class:`~multihead.modules.kv.LayerKV` for incremental decoding. Self-attention
                (``static=False``): this call's keys/values are appended and the queries attend to every cached key
                (``mask``/``key_padding_mask``/``is_causal`` then describe all ``Lk = cached + new`` keys).
                Cross-attention (``static=True``): keys/values are computed from ``key``/``value`` on the first call
                and reused afterwards.
            positions: ``(B, Lq)`` per-row positions for rotary embeddings (left-padded batches); default: the
                cached length onwards.

        Returns:
            ``(out, weights)``: ``out`` ``(B, Lq, E)``; ``weights`` ``(B, H, Lq, Lk)`` or None.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        need_weights = self.need_weights if need_weights is None else need_weights
        if self.num_heads == 0:  # every head pruned: only the output projection's bias remains
            return self._no_heads(query, key.shape[1], need_weights, average_attn_weights)
        q, k, v = self._project(query, key, value, None if cache is None else cache.source())
        am = self._with_alibi(self.build_mask(mask, key_padding_mask, is_causal))
        rotate = cache is None and positions is None  # rotary, if any, still to apply (inside _attend)
        if cache is not None:  # the cache stores what it keeps and says what to attend
            q, views = cache.update(q, k, v, mask=am, rotary=self.rotary, positions=positions)
        elif self.rotary is not None and positions is not None:
            q, k = self.rotary.rotate_pair(q, k, 0, positions)
            views = [KVView(k, v, am)]
        else:
            views = [KVView(k, v, am)]
        z, weights = self._attend_views(q, views, head_mask, need_weights, rotate)
        if cache is not None:
            cache.done(q, views, self.sink_logits)
        b, lq = query.shape[:2]
        z = z.transpose(1, 2).reshape(b, lq, self.num_heads * self.head_dim)  # (B, H, Lq, D) -> (B, Lq, H * D)
        if self.w_gate is not None:
            z = z * torch.sigmoid(self.w_gate(query))
        out = self.w_o(z)  # (B, Lq, E)
        if not need_weights:
            return out, None
        return out, weights.mean(dim=1) if average_attn_weights else weights  # (B, Lq, Lk) or (B, H, Lq, Lk)

    def _no_heads(self, query: Tensor, lk: int, need_weights: bool, average: bool) -> tuple[Tensor, Tensor | None]:
        """A layer whose every head was pruned: the output projection's bias alone; empty maps."""
        b, lq = query.shape[:2]
        if self.hook_pattern.active:  # analysis sees an empty layer, (B, 0, Lq, Lk)
            self.hook_pattern(query.new_zeros(b, 0, lq, lk))
        out = self.w_o(query.new_zeros(b, lq, 0))  # (B, Lq, E)
        if not need_weights:
            return out, None
        return out, query.new_zeros(b, lq, lk) if average else query.new_zeros(b, 0, lq, lk)

    def _project(self, query: Tensor, key: Tensor, value: Tensor, stored) -> tuple[Tensor, Tensor, Tensor]:
        """``q`` ``(B, H, Lq, D)``, ``k``, ``v`` ``(B, G, Lk, D)``, QK-normed, not rotated. ``stored``: a
        cross-attention cache's keys and values (the source is not projected again)."""
        b, lq, _ = query.shape
        lk = key.shape[1]
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        if key is query and value is query and not torch.is_grad_enabled() and self.fuse_qkv_at_inference:
            q, k, v = self._packed_qkv(query)  # one matmul instead of three (decoding is overhead-bound)
            q, k, v = q.view(b, lq, h, d), k.view(b, lk, g, d), v.view(b, lk, g, d)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H|G, L, D)
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            return q, k, v
        q = self.w_q(query).view(b, lq, h, d).transpose(1, 2)  # (B, H, Lq, D)
        if stored is not None:
            k, v = stored  # (B, G, Ls, D)
        else:
            k = self.w_k(key).view(b, lk, g, d).transpose(1, 2)  # (B, G, Lk, D)
            v = self.w_v(value).view(b, lk, g, d).transpose(1, 2)  # (B, G, Lk, D)
            if self.k_norm is not None:
                k = self.k_norm(k)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return q, k, v

    def _attend_views(self, q: Tensor, views: list[KVView], head_mask, need_weights: bool, rotate: bool):
        """Attend what the cache answered: one view of every head through :meth:`_attend` (hooks, weights); or one
        view per group of query heads, each with its own keys (a head-aware policy), through the kernel, their
        outputs put back in head order before ``hook_z`` and the head mask."""
        if len(views) == 1 and views[0].heads is None:
            view = views[0]
            return self._attend(q, view.k, view.v, view.mask, head_mask, need_weights, rotate=rotate)
        self._refuse_split_heads(need_weights)
        sinks = None if self.sink_logits is None else self.sink_logits.detach().float()
        z = self.hook_z(attend_groups(q, views, backend=self.backend, sinks=sinks))
        if head_mask is not None:
            z = z * self._head_scale(head_mask, q.shape[0], z.dtype)
        return z, None

    def _refuse_split_heads(self, need_weights: bool) -> None:
        """Heads that keep different keys have no one ``(B, H, Q, N)`` map: refuse what would need it."""
        hooked = [n for n in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_stats") if getattr(self, n).active]
        if need_weights or hooked:
            raise ValueError(
                "this layer's heads keep different keys under the head-aware policy, so there is no single "
                f"attention map ({', '.join(hooked) or 'need_weights'}): capture with policy='full' or a uniform policy"
            )
        if type(self)._kernel is not MultiHeadAttention._kernel:
            raise ValueError(
                f"{type(self).__name__} mixes its heads' maps, so its heads cannot keep different keys: "
                "use a uniform policy (window, h2o, snapkv) with this model"
            )

    def forward_packed(self, x: Tensor, index: Tensor, keep: Tensor, *, head_mask: Tensor | None = None) -> Tensor:
        """Self-attention over *packed* tokens: padding is never projected.

        Args:
            x: ``(N, E)`` the real tokens of a ``(B, L)`` batch, in row-major order.
            index: ``(N,)`` their flat positions in ``B * L`` (``keep.flatten().nonzero()``).
            keep: ``(B, L)`` bool, True = real token.
        Returns ``(N, E)``. Projections run on ``N`` rows only; q, k, v are scattered to ``(B, H, L, D)`` for the
        kernel (so hook points see the usual shapes) and the per-head outputs gathered back.
        """
        b, l = keep.shape
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        if h == 0:
            if self.hook_pattern.active:  # analysis sees an empty layer, (B, 0, L, L)
                self.hook_pattern(x.new_zeros(b, 0, l, l))
            return self.w_o(x.new_zeros(x.shape[0], 0))

        def pad(t: Tensor, heads: int) -> Tensor:  # (N, heads * D) -> (B, heads, L, D)
            full = t.new_zeros(b * l, t.shape[-1]).index_copy(0, index, t)  # (B*L, heads*D)
            return full.view(b, l, heads, d).transpose(1, 2)

        q, k, v = pad(self.w_q(x), h), pad(self.w_k(x), g), pad(self.w_v(x), g)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        am = self._with_alibi(self.build_mask(key_padding_mask=keep))
        z, _ = self._attend(q, k, v, am, head_mask, False)  # (B, H, L, D)
        z = z.transpose(1, 2).reshape(b * l, h * d).index_select(0, index)  # (B*L, E) -> (N, E)
        if self.w_gate is not None:
            z = z * torch.sigmoid(self.w_gate(x))
        return self.w_o(z)

    def _map_stats(self, w: Tensor, mask: AttnMask | None) -> None:
        """``hook_stats`` for the variants whose map is not one softmax per head (talking heads, differential): the
        statistics of the explicit map they build anyway (:func:`multihead.attention.stats.map_stats`)."""
        if self.hook_stats.active:
            from ..attention.stats import map_stats

            offset = None if mask is None or mask.causal_offset is None else mask.causal_offset
            self.hook_stats(map_stats(w.detach(), offset=offset, **self.stats_options))

    def _with_alibi(self, am: AttnMask | None) -> AttnMask | None:
        """``am`` with this module's ALiBi slopes as its ALiBi part: unchanged when a stack already put them there
        (one mask, densified once, for every layer); a pruned layer's own slopes replace the stack's."""
        if self._alibi is None:
            return am
        return (am or AttnMask()).with_alibi(self._alibi)

    def build_mask(self, mask=None, key_padding_mask: Tensor | None = None, is_causal: bool = False):
        """The call's :class:`AttnMask` (None when nothing is masked): the module's conventions applied once -- a
        3-D ``mask`` is ``(B, Lq, Lk)`` shared by heads, ``key_padding_mask`` is ``(B, Lk)`` True = real token -- and
        the module's sparse pattern added. Validation happens once, in the kernel seam."""
        if isinstance(mask, Tensor):
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)  # (B, Lq|1, Lk) -> (B, 1, Lq|1, Lk): shared by heads
            elif mask.dim() not in (2, 4):
                raise ValueError(f"mask must be (Lq, Lk), (B, Lq, Lk) or (B, H, Lq, Lk), got shape {tuple(mask.shape)}")
        am = AttnMask.of(mask, is_causal=is_causal, key_padding=key_padding_mask)
        if self.pattern is not None:
            am = (am or AttnMask()).with_pattern(self.pattern)
        return am

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttnMask | Tensor | None,
        head_mask,
        need_weights: bool,
        rotate: bool = True,
    ):
        """Rotary, hooks, the kernel and the head mask on split heads: returns ``z`` ``(B, H, Lq, D)``, weights.
        ``mask`` is the structured mask, passed to the kernel seam as it is."""
        if rotate and self.rotary is not None:
            q, k = self.rotary(q, k)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        p = self.dropout if self.training else 0.0
        backend = self.backend
        if need_weights and not (backend != "auto" and get_backend(backend).capabilities.returns_weights):
            backend = "auto"  # the fused backends return no weights: auto picks one that does
        return self._kernel(q, k, v, mask, head_mask, need_weights, p, backend)

    def _kernel(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: AttnMask | Tensor | None,
        head_mask,
        need_weights: bool,
        p: float,
        backend: str,
    ):
        """The attention of rotated, hooked heads, the head mask applied: ``z`` ``(B, H, Lq, D)`` and the weights.
        What a variant that replaces the softmax map overrides (:mod:`multihead.modules.variants`). With a pattern
        hook attached, the entry point computes the weights explicitly and passes them through the hook (which may
        read or edit them) before dropout and the values: the same path as every other call."""
        hook = self.hook_pattern if self.hook_pattern.active else None
        sinks = self.sink_logits
        if self.hook_stats.active:  # exact statistics from tiles: nothing Lq x Lk is built
            from ..attention.stats import attention_stats

            self.hook_stats(attention_stats(q, k, mask=mask, sinks=sinks, **self.stats_options))
        z, weights = attention(
            q,
            k,
            v,
            mask=mask,
            dropout_p=p,
            need_weights=need_weights,
            backend=backend,
            weights_hook=hook,
            sinks=None if sinks is None else sinks.to(q.dtype),
        )  # (B, H, Lq, D)
        z = self.hook_z(z)  # (B, H, Lq, D)
        if head_mask is not None:
            z = z * self._head_scale(head_mask, q.shape[0], z.dtype)  # (B, H, Lq, D) * (B|1, H, 1, 1)
        return z, weights

    # ------------------------------------------------------------------ helpers
    # Self-attention without autograd (inference, decoding) projects q, k, v with one matmul over the three weights
    # stacked. The stacked copy (3 E^2 numbers per layer, kept while the module lives) is rebuilt whenever a weight
    # changes: its stamp is each tensor's storage and in-place version, so optimizer steps, load_state_dict and
    # prune_heads invalidate it. Set False to trade the speed for the memory.
    fuse_qkv_at_inference: bool = True

    def column_groups(self) -> list[tuple[nn.Linear, ...]]:
        """The projections one input feeds together (self-attention's q, k, v), for
        :func:`~multihead.modules.fastpath.prepare` to pack into one buffer."""
        if self.kdim != self.d_model or self.vdim != self.d_model:
            return []
        return [(self.w_q, self.w_k, self.w_v)]

    def _packed_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        parts = (self.w_q, self.w_k, self.w_v)
        qw, kw = self.w_q.out_features, self.w_k.out_features
        laid = fastpath.columns([m.weight for m in parts])  # one (E, H*D + 2*G*D) buffer: one product, no copy
        if laid is not None:
            y = x @ laid
            if self.w_q.bias is not None:
                y = y + torch.cat([m.bias for m in parts])
            return y.split([qw, kw, kw], -1)
        laid = fastpath.rows([m.weight for m in parts])  # laid out by rows: one (H*D + 2*G*D, E) buffer
        if laid is not None:
            bias = None if self.w_q.bias is None else torch.cat([m.bias for m in parts])
            return nn.functional.linear(x, laid, bias).split([qw, kw, kw], -1)
        tensors = [m.weight for m in parts] + [m.bias for m in parts if m.bias is not None]
        weight, bias = fastpath.packed(
            self,
            tensors,
            lambda: (
                torch.cat([m.weight for m in parts]),
                None if self.w_q.bias is None else torch.cat([m.bias for m in parts]),
            ),
        )
        return fastpath.linear(x, weight, bias, self).split([qw, kw, kw], -1)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, t, width in (("query", query, self.d_model), ("key", key, self.kdim), ("value", value, self.vdim)):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"{name} must be a torch.Tensor, got {type(t).__module__}.{type(t).__name__}; "
                    f"convert it with torch.as_tensor({name})"
                )
            if not t.is_floating_point():  # (float dtypes may differ from the weights' under autocast)
                raise TypeError(
                    f"{name} must be floating point, got {t.dtype}: embed token ids first, or cast with {name}.float()"
                )
            if t.dim() != 3:
                hint = f" (add a batch axis: {name}.unsqueeze(0))" if t.dim() == 2 else ""
                raise ValueError(f"{name} must be (B, L, {width}), got shape {tuple(t.shape)}{hint}")
            if t.shape[-1] != width:
                fix = "kdim=" if name == "key" else "vdim=" if name == "value" else "d_model="
                raise ValueError(
                    f"{name} has width {t.shape[-1]} but the module expects {width}; build it with {fix}{t.shape[-1]}"
                )
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must share (B, Lk)")
        if query.shape[0] != key.shape[0]:
            raise ValueError(f"query batch {query.shape[0]} != key batch {key.shape[0]}")

    def _head_scale(self, head_mask: Tensor, b: int, dtype) -> Tensor:
        h = self.num_heads
        if head_mask.shape == (h,):
            return head_mask.to(dtype).view(1, h, 1, 1)
        if head_mask.shape == (b, h):
            return head_mask.to(dtype).view(b, h, 1, 1)
        raise ValueError(f"head_mask must be ({h},) or ({b}, {h}) (one scale per head), got {tuple(head_mask.shape)}")

    # ------------------------------------------------------------------ pruning
    def prune_heads(self, heads) -> None:
        """Remove query heads (indices into the *current* heads) physically from the projections.

        Q rows and output-projection columns of the removed heads go. With grouped-query attention a key/value head
        is removed only when every query head sharing it is removed. Removing every head leaves a module whose
        output is the output projection's bias (zeros without bias).
        """
        heads = sorted(set(int(x) for x in heads))
        if not heads:
            return
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        if min(heads) < 0 or max(heads) >= h:
            raise ValueError(f"head indices must be in [0, {h}), got {heads}")
        group = h // g
        keep = [i for i in range(h) if i not in heads]
        kv_keep = sorted({i // group for i in keep})
        if keep and any(len([i for i in keep if i // group == kv]) != len(keep) // len(kv_keep) for kv in kv_keep):
            raise ValueError(
                "after pruning, every remaining key/value head must serve the same number of query heads; "
                f"prune whole groups of {group} heads or an equal number from each group"
            )
        q_idx, kv_idx = head_columns(keep, d), head_columns(kv_keep, d)
        self.w_q = _select_linear(self.w_q, q_idx, dim=0)
        self.w_k = _select_linear(self.w_k, kv_idx, dim=0)
        self.w_v = _select_linear(self.w_v, kv_idx, dim=0)
        self.w_o = _select_linear(self.w_o, q_idx, dim=1)
        if self.w_gate is not None:
            self.w_gate = _select_linear(self.w_gate, q_idx, dim=0)
        if self.sink_logits is not None:
            self.sink_logits = nn.Parameter(self.sink_logits.detach()[keep].clone())
        if self.alibi_slopes is not None:
            self.alibi_slopes = self.alibi_slopes[keep]
            self._alibi = tuple(self._alibi[i] for i in keep)
        original = [i for i in range(h + len(self.pruned_heads)) if i not in self.pruned_heads]
        self.pruned_heads = sorted(self.pruned_heads + [original[i] for i in heads])
        self.num_heads = len(keep)
        self.num_kv_heads = len(kv_keep)

    # ------------------------------------------------------------------ interop
    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, *, backend: str = "auto") -> MultiHeadAttention:
        """Build from ``nn.MultiheadAttention``, copying its weights (output is batch-first)."""
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(
                "nn.MultiheadAttention with add_bias_kv / add_zero_attn has no multihead equivalent; "
                "build it without those options"
            )
        bias = mha.in_proj_bias is not None
        new = cls(
            mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=bias, kdim=mha.kdim, vdim=mha.vdim, backend=backend
        )
        e = mha.embed_dim
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                wq, wk, wv = mha.in_proj_weight.split(e, dim=0)
            else:
                wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
            for lin, w in ((new.w_q, wq), (new.w_k, wk), (new.w_v, wv)):
                lin.weight.copy_(w)
            if bias:
                bq, bk, bv = mha.in_proj_bias.split(e)
                new.w_q.bias.copy_(bq)
                new.w_k.bias.copy_(bk)
                new.w_v.bias.copy_(bv)
            new.w_o.weight.copy_(mha.out_proj.weight)
            if mha.out_proj.bias is not None and new.w_o.bias is not None:
                new.w_o.bias.copy_(mha.out_proj.bias)
        return new.to(mha.out_proj.weight.device, mha.out_proj.weight.dtype)

    def to_torch(self) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention(batch_first=True)`` with the same weights (plain MHA only)."""
        if self.num_kv_heads != self.num_heads:
            raise ValueError("nn.MultiheadAttention has no grouped-query attention; build with num_kv_heads=None")
        if self.rotary is not None:
            raise ValueError("nn.MultiheadAttention has no rotary embeddings; build without rotary=")
        if self.pruned_heads:
            raise ValueError(
                "a pruned module has fewer heads than d_model allows; nn.MultiheadAttention cannot hold it"
            )
        if self.num_heads * self.head_dim != self.d_model or self.q_norm is not None:
            raise ValueError(
                "nn.MultiheadAttention has heads of d_model / num_heads and no QK-norm; this module has "
                "its own head_dim or QK-norm"
            )
        bias = self.w_q.bias is not None
        w = self.w_q.weight
        mha = nn.MultiheadAttention(
            self.d_model,
            self.num_heads,
            dropout=self.dropout,
            bias=bias,
            kdim=self.kdim,
            vdim=self.vdim,
            batch_first=True,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                mha.in_proj_weight.copy_(torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight]))
            else:
                mha.q_proj_weight.copy_(self.w_q.weight)
                mha.k_proj_weight.copy_(self.w_k.weight)
                mha.v_proj_weight.copy_(self.w_v.weight)
            if bias:
                mha.in_proj_bias.copy_(torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias]))
                mha.out_proj.bias.copy_(self.w_o.bias)
            mha.out_proj.weight.copy_(self.w_o.weight)
        return mha


def _select_linear(layer: nn.Linear, index: Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping rows (dim=0, outputs) or columns (dim=1, inputs) ``index`` of ``layer``."""
    w = layer.weight.index_select(dim, index.to(layer.weight.device)).detach().clone()
    has_bias = layer.bias is not None
    out_f, in_f = w.shape
    with warnings.catch_warnings():  # a fully pruned layer has zero-size weights: nothing to initialise
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        new = torch.nn.utils.skip_init(nn.Linear, in_f, out_f, bias=has_bias, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        new.weight.copy_(w)
        if has_bias:
            b = layer.bias if dim == 1 else layer.bias.index_select(0, index.to(layer.bias.device))
            new.bias.copy_(b.detach())
    new.weight.requires_grad_(layer.weight.requires_grad)
    return new
