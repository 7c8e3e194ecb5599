"""``torch.nn.MultiheadAttention``, spelt as PyTorch spells it, computed by multihead.

:class:`MultiheadAttention` takes PyTorch's arguments with PyTorch's defaults and meanings -- ``batch_first=False``
(``(L, B, E)`` in and out), ``attn_mask`` and ``key_padding_mask`` where **True means "may not attend"** (a float
mask is added to the scores), ``need_weights=True`` and ``average_attn_weights=True`` -- and runs multihead's
:class:`~multihead.modules.attention.MultiHeadAttention` inside (``.attention``: its hook points, backends and
head pruning). A model written for PyTorch's module takes it by one line, also inside ``nn.TransformerEncoderLayer``
and ``nn.TransformerDecoderLayer``::

    layer.self_attn = MultiheadAttention.from_torch(layer.self_attn)   # the same weights, the same outputs

A PyTorch ``state_dict`` (``in_proj_weight``, ``out_proj.weight``, ...) loads into it, and :meth:`to_torch` gives
PyTorch's module back. PyTorch's fused fast paths (``nn.TransformerEncoderLayer`` in inference) read the packed
weights directly; this module has none (``in_proj_weight`` is None), so such a layer always calls it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention


class MultiheadAttention(nn.Module):
    """PyTorch's ``nn.MultiheadAttention`` (same arguments, defaults and mask meaning), computed by multihead's
    :class:`~multihead.modules.attention.MultiHeadAttention` (module docstring)."""

    # what nn.TransformerEncoderLayer's fused path reads: None sends the layer through forward()
    in_proj_weight = None
    in_proj_bias = None
    _qkv_same_embed_dim = False

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if add_bias_kv or add_zero_attn:
            raise ValueError(
                "add_bias_kv and add_zero_attn have no multihead equivalent (an extra learned or zero key per "
                "sequence); keep torch.nn.MultiheadAttention for a model that uses them"
            )
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.head_dim, self.batch_first = embed_dim // num_heads, batch_first
        self.attention = MultiHeadAttention(
            embed_dim, num_heads, dropout=dropout, bias=bias, kdim=self.kdim, vdim=self.vdim, need_weights=False
        )
        self._reset_parameters()
        self.to(device=device, dtype=dtype)
        self._register_load_state_dict_pre_hook(_from_torch_keys, with_module=True)

    def _reset_parameters(self) -> None:
        """PyTorch's initialisation: Xavier-uniform over the packed ``(3E, E)`` input projection (one bound for
        q, k and v), zero biases, the output projection's weight as nn.Linear makes it and a zero bias."""
        a = self.attention
        with torch.no_grad():
            if self.kdim == self.vdim == self.embed_dim:
                bound = math.sqrt(6.0 / (self.embed_dim + 3 * self.embed_dim))
                for lin in (a.w_q, a.w_k, a.w_v):
                    lin.weight.uniform_(-bound, bound)
            else:
                for lin in (a.w_q, a.w_k, a.w_v):
                    nn.init.xavier_uniform_(lin.weight)
            for lin in (a.w_q, a.w_k, a.w_v, a.w_o):
                if lin.bias is not None:
                    lin.bias.zero_()

    @property
    def out_proj(self) -> nn.Linear:
        """The output projection (PyTorch's name)."""
        return self.attention.w_o

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """PyTorch's forward: ``(attn_output, attn_weights)``; ``attn_output`` ``(L, B, E)`` (``(B, L, E)`` with
        ``batch_first``), ``attn_weights`` ``(B, L, S)`` averaged over heads or ``(B, H, L, S)``, or None.
        ``attn_mask`` ``(L, S)`` or ``(B * H, L, S)`` and ``key_padding_mask`` ``(B, S)``: True (bool) = may not
        attend, a float is added to the scores. ``is_causal`` with no ``attn_mask``: causal attention."""
        unbatched = query.dim() == 2
        if unbatched:  # PyTorch takes one unbatched sequence (L, E)
            query, key, value = query[:, None], key[:, None], value[:, None]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
        if not self.batch_first or unbatched:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        b, lq, lk = query.shape[0], query.shape[1], key.shape[1]
        mask = _allowed(attn_mask, key_padding_mask, b, self.num_heads, lq, lk)
        out, weights = self.attention(
            query,
            key,
            value,
            mask,
            is_causal=is_causal and attn_mask is None,
            need_weights=need_weights,
            average_attn_weights=average_attn_weights,
        )
        if not self.batch_first or unbatched:
            out = out.transpose(0, 1)
        if unbatched:
            out = out[:, 0]
            weights = None if weights is None else weights[0]
        return out, weights

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiheadAttention:
        """The same module as ``mha`` (weights, ``batch_first``, dropout), computed by multihead."""
        w = mha.out_proj.weight
        new = cls(
            mha.embed_dim,
            mha.num_heads,
            dropout=mha.dropout,
            bias=mha.in_proj_bias is not None,
            add_bias_kv=mha.bias_k is not None,
            add_zero_attn=mha.add_zero_attn,
            kdim=mha.kdim,
            vdim=mha.vdim,
            batch_first=mha.batch_first,
            device=w.device,
            dtype=w.dtype,
        )
        new.load_state_dict(mha.state_dict())
        return new.train(mha.training)

    def to_torch(self) -> nn.MultiheadAttention:
        """PyTorch's module with the same weights and ``batch_first``."""
        mha = self.attention.to_torch()
        mha.batch_first = self.batch_first
        return mha.train(self.training)


def _allowed(attn_mask, key_padding_mask, b: int, h: int, lq: int, lk: int) -> Tensor | None:
    """PyTorch's two masks (True = may not attend; floats added) as one multihead mask: bool True = may attend, or
    a float bias, ``(B or 1, H or 1, Lq, Lk)``."""
    parts = []
    for m, shape in ((attn_mask, None), (key_padding_mask, (b, 1, 1, lk))):
        if m is None:
            continue
        if shape is None:  # attn_mask: (L, S) or (B * H, L, S)
            if m.dim() == 3:
                if m.shape[0] != b * h:
                    raise ValueError(
                        f"attn_mask of shape {tuple(m.shape)}: a 3-D mask is (batch * num_heads, L, S) = "
                        f"({b * h}, {lq}, {lk})"
                    )
                m = m.view(b, h, lq, lk)
            elif m.dim() != 2:
                raise ValueError(f"attn_mask of shape {tuple(m.shape)}: pass (L, S) or (batch * num_heads, L, S)")
        else:
            if tuple(m.shape) != (b, lk):
                raise ValueError(f"key_padding_mask of shape {tuple(m.shape)}: pass (batch, S) = ({b}, {lk})")
            m = m.view(shape)
        parts.append(m)
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        blocked = parts[0] if len(parts) == 1 else parts[0] | parts[1]
        return ~blocked
    bias = None
    for p in parts:
        add = (
            torch.zeros(p.shape, dtype=torch.float32, device=p.device).masked_fill(p, -math.inf)
            if (p.dtype == torch.bool)
            else p
        )
        bias = add if bias is None else bias + add
    return bias


_TORCH_KEYS = ("in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.")


def _from_torch_keys(module: MultiheadAttention, state_dict, prefix, *args) -> None:
    """Load PyTorch's ``nn.MultiheadAttention`` keys into ``attention``'s projections (in place)."""
    if not any(k.startswith(prefix + t) for k in state_dict for t in _TORCH_KEYS):
        return
    e, a = module.embed_dim, prefix + "attention."
    packed = state_dict.pop(prefix + "in_proj_weight", None)
    if packed is not None:
        for name, w in zip("qkv", packed.split(e)):
            state_dict[f"{a}w_{name}.weight"] = w
    for name in "qkv":
        w = state_dict.pop(f"{prefix}{name}_proj_weight", None)
        if w is not None:
            state_dict[f"{a}w_{name}.weight"] = w
    bias = state_dict.pop(prefix + "in_proj_bias", None)
    if bias is not None:
        for name, bb in zip("qkv", bias.split(e)):
            state_dict[f"{a}w_{name}.bias"] = bb
    for part in ("weight", "bias"):
        w = state_dict.pop(f"{prefix}out_proj.{part}", None)
        if w is not None:
            state_dict[f"{a}w_o.{part}"] = w


__all__ = ["MultiheadAttention"]
