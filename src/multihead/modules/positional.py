"""Positional encodings: sinusoidal (the tutorial's), learned, and rotary (RoPE)."""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor, nn


class Rotary(Protocol):
    """What attention needs of a rotary module (:class:`RotaryEmbedding`, or a wrapper with the same methods)."""

    def rotate(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor: ...

    def rotate_pair(
        self, q: Tensor, k: Tensor, offset: int = 0, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]: ...

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]: ...


class SinusoidalPositionalEncoding(nn.Module):
    pe: Tensor

    """Vaswani et al.'s fixed encoding added to ``(B, L, E)`` embeddings: ``PE[p, 2i] = sin(p / 10000^(2i/E))``."""

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0) -> None:
        super().__init__()
        self.max_len = max_len
        position = torch.arange(max_len).unsqueeze(1)  # (L, 1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (ceil(E/2),)
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div[: d_model // 2])
        self.register_buffer("pe", pe, persistent=False)  # (L, E); recomputed, never saved
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x`` ``(B, L, E)`` at positions ``offset ..`` (or per-row ``positions`` ``(B, L)``: left-padded batches)."""
        _check_length(x.shape[1], offset, positions, self.max_len)
        if positions is not None:
            return self.dropout(x + self.pe[positions].to(x.dtype))  # (B, L, E) + (B, L, E)
        l = x.shape[1]
        return self.dropout(x + self.pe[offset : offset + l].to(x.dtype))  # (B, L, E) + (L, E)


def check_positions(positions: Tensor, max_len: int) -> None:
    """Raise (naming the fix) when any position is beyond a model's ``max_len`` positions."""
    _check_length(positions.shape[-1], 0, positions, max_len)


def _check_length(length: int, offset: int, positions: Tensor | None, max_len: int) -> None:
    last = offset + length if positions is None else (int(positions.max()) + 1 if positions.numel() else 0)
    if last > max_len:
        raise ValueError(
            f"position {last - 1} is beyond the {max_len} positions this model has (max_len={max_len}); "
            "shorten the input or the generation (max_new_tokens), or raise max_len when building the "
            "model"
        )


class LearnedPositionalEncoding(nn.Module):
    """A trained embedding per position (BERT style), added to ``(B, L, E)``."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0) -> None:
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x`` ``(B, L, E)`` at positions ``offset ..`` (or per-row ``positions`` ``(B, L)``: left-padded batches)."""
        _check_length(x.shape[1], offset, positions, self.max_len)
        l = x.shape[1]
        pos = torch.arange(offset, offset + l, device=x.device) if positions is None else positions
        return self.dropout(x + self.embedding(pos))  # (B, L, E) + ((B,) L, E)


class RotaryEmbedding(nn.Module):
    inv_freq: Tensor

    """Rotary position embedding (Su et al. 2021), applied to q and k inside attention.

    Rotates pairs ``(x[..., i], x[..., i + D/2])`` by angle ``p * base^(-2i/D)`` (the "rotate half" layout used by
    GPT-NeoX and HF LLaMA), so ``q_p . k_r`` depends only on ``p - r``. ``head_dim`` must be even.
    ``forward(q, k)`` takes ``(B, H, Lq, D)`` and ``(B, G, Lk, D)``; with ``Lq < Lk`` the queries are taken to be the
    last ``Lq`` positions (as with a KV cache).
    """

    def __init__(
        self, head_dim: int, base: float = 10000.0, max_len: int = 4096, *, scaling: dict | None = None
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}; change d_model or num_heads")
        self.head_dim = head_dim
        self._frequencies = (base, scaling, max_len)  # what inv_freq is computed from (reset_buffers)
        inv_freq, self.attention_factor = rope_frequencies(head_dim, base, scaling, max_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,)

    def reset_buffers(self, device=None) -> None:
        """Compute ``inv_freq`` again, on ``device`` (default: where it is): a model built on the meta device
        (shapes only, its weights assigned afterwards) gets its frequencies so."""
        base, scaling, max_len = self._frequencies
        device = self.inv_freq.device if device is None else device
        with torch.device(device):
            inv_freq, self.attention_factor = rope_frequencies(self.head_dim, base, scaling, max_len)
        self.inv_freq = inv_freq

    def _cos_sin(self, length: int, offset: int, device, dtype, positions: Tensor | None = None):
        # one rotary module serves every layer of a stack, and the layers of one call ask for the same angles:
        # the last answer is kept (keyed on the positions tensor itself, held here, so its identity is not reused)
        key = (
            positions,
            None if positions is None else positions._version,
            length,
            offset,
            device,
            dtype,
            self.inv_freq._version,
        )
        memo = self.__dict__.get("_memo")
        if memo is not None and memo[0][0] is key[0] and memo[0][1:] == key[1:]:
            return memo[1]
        self.__dict__["_memo"] = (key, self._angles(length, offset, device, dtype, positions))
        return self.__dict__["_memo"][1]

    def _angles(self, length: int, offset: int, device, dtype, positions: Tensor | None):
        if positions is None:
            pos = torch.arange(offset, offset + length, device=device, dtype=torch.float32)  # (L,)
        else:
            pos = positions.to(device=device, dtype=torch.float32)[:, None, :]  # (B, 1, L): per-row positions
        angles = pos[..., None] * self.inv_freq.to(device)  # (.., L, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (.., L, D)
        if self.attention_factor != 1.0:  # YaRN scales cos and sin (and so the logits) by its attention factor
            return (angles.cos() * self.attention_factor).to(dtype), (angles.sin() * self.attention_factor).to(dtype)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    @staticmethod
    def _rotate_half(x: Tensor) -> Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    def rotate(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Rotate ``(B, H, L, D)`` as positions ``offset .. offset + L - 1`` (or per-row ``positions`` ``(B, L)``)."""
        cos, sin = self._cos_sin(x.shape[-2], offset, x.device, x.dtype, positions)
        return x * cos + self._rotate_half(x) * sin

    def rotate_pair(
        self, q: Tensor, k: Tensor, offset: int = 0, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """:meth:`rotate` of queries and keys at the same positions (new tokens entering a cache): the angles are
        computed once."""
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"rotate_pair needs as many queries as keys, got {q.shape[-2]} and {k.shape[-2]}")
        cos, sin = self._cos_sin(q.shape[-2], offset, q.device, q.dtype, positions)
        return q * cos + self._rotate_half(q) * sin, k * cos + self._rotate_half(k) * sin

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        lq, lk = q.shape[-2], k.shape[-2]
        return self.rotate(q, offset=max(lk - lq, 0)), self.rotate(k)


ROPE_SCALINGS = ("default", "linear", "llama3", "yarn")


def rope_frequencies(
    head_dim: int, base: float = 10000.0, scaling: dict | None = None, max_len: int = 4096
) -> tuple[Tensor, float]:
    """RoPE's inverse frequencies ``(D/2,)`` and the factor on cos/sin, for ``scaling`` as HF configs spell it
    (``rope_scaling``: ``{"rope_type": "linear" | "llama3" | "yarn", "factor": ..., ...}``; None: plain RoPE).

    * linear (position interpolation, Chen et al. 2023): every frequency divided by ``factor``;
    * llama3: low frequencies divided by ``factor``, high ones kept, a smooth ramp between (Llama 3.1);
    * yarn (Peng et al. 2023): interpolation blended with extrapolation per frequency, cos/sin scaled by
      ``0.1 ln(factor) + 1`` (or the given ``attention_factor``).
    """
    if not (isinstance(base, (int, float)) and math.isfinite(base) and base > 1):
        raise ValueError(f"rope theta (base) must be a finite number > 1, got {base!r}")
    dims = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**dims)  # (D/2,), as HF computes it (bit-identical frequencies)
    if not scaling:
        return inv_freq, 1.0
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_SCALINGS:
        raise ValueError(
            f"rope scaling {kind!r} is not supported; supported: {ROPE_SCALINGS} (dynamic NTK and "
            "LongRoPE change the frequencies with the input length)"
        )
    if kind == "default":
        return inv_freq, 1.0
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor >= 1:
        raise ValueError(f"rope scaling {kind!r} needs a number factor >= 1, got {factor!r}")
    if kind == "linear":
        return inv_freq / factor, 1.0
    original = scaling.get("original_max_position_embeddings") or max_len
    if kind == "llama3":
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        if not high > low:
            raise ValueError(f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got {high} and {low}")
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original / high) & ~(wavelen > original / low)
        return torch.where(medium, smoothed, scaled), 1.0

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = correction(fast), correction(slow)
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    keep = 1 - ramp  # the share of each frequency left unscaled (extrapolated)
    return inv_freq / factor * (1 - keep) + inv_freq * keep, float(attention_factor)


def build_positional(kind: str, d_model: int, max_len: int, dropout: float = 0.0) -> nn.Module | None:
    """The additive encoding named ``kind`` (``sinusoidal``/``learned``), or None for ``rope``/``none``."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len, dropout)
    if kind == "learned":
        return LearnedPositionalEncoding(d_model, max_len, dropout)
    if kind in ("rope", "none"):
        return None
    raise ValueError(f"unknown positional encoding {kind!r}; choose sinusoidal, learned, rope or none")
