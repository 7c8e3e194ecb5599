"""Position-wise feed-forward network (plain or gated) and the norms a block may use."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import fastpath

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {  # ReLU in place: no extra (B, L, F) buffer
    "relu": lambda: nn.ReLU(inplace=True),
    "gelu": nn.GELU,  # exact (erf), BERT's "gelu"
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # HF "gelu_new" / "gelu_pytorch_tanh" (GPT-2)
    "silu": nn.SiLU,
}
# Gated units (Shazeer 2020, "GLU variants"): act(x W_gate) * (x W_1), then W_2. SwiGLU is Llama's/Qwen's/Mistral's
# MLP (gate_proj, up_proj, down_proj); GeGLU (tanh GELU) is Gemma's.
GATED: dict[str, Callable[[Tensor], Tensor]] = {"swiglu": F.silu, "geglu": lambda t: F.gelu(t, approximate="tanh")}
NORMS = ("layer", "rms")  # LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019: no centring, no bias)


def make_activation(name: str) -> nn.Module:
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS) + sorted(GATED)}") from None


def check_activation(name: str) -> None:
    if name not in ACTIVATIONS and name not in GATED:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS) + sorted(GATED)}")


def make_norm(kind: str, width: int, eps: float) -> nn.Module:
    """``"layer"``: :class:`torch.nn.LayerNorm` (weight and bias); ``"rms"``: :class:`torch.nn.RMSNorm` (weight)."""
    if kind == "layer":
        return nn.LayerNorm(width, eps=eps)
    if kind == "rms":
        return nn.RMSNorm(width, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORMS}")


class FeedForward(nn.Module):
    """``Linear(E, F) -> activation -> dropout -> Linear(F, E)`` applied to each position of ``(B, L, E)``; with a
    gated activation (``swiglu``, ``geglu``): ``W_2(act(x W_gate) * x W_1)``."""

    def __init__(
        self, d_model: int, d_ff: int | None = None, dropout: float = 0.0, activation: str = "relu", bias: bool = True
    ) -> None:
        super().__init__()
        check_activation(activation)
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.w_gate = nn.Linear(d_model, d_ff, bias=bias) if activation in GATED else None
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.act = GATED[activation] if activation in GATED else make_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)

    def column_groups(self) -> list[tuple[nn.Linear, ...]]:
        """The gate and up projections (one input feeds both), for :func:`~multihead.modules.fastpath.prepare`."""
        return [] if self.w_gate is None else [(self.w_gate, self.w_1)]

    def forward(self, x: Tensor) -> Tensor:
        g = self.w_gate
        if not isinstance(self.w_1, nn.Linear):  # weights stored in another format: each product its module's own
            up = self.w_1(x)
            return self.w_2(self.act(up) if g is None else self.act(g(x)) * up)
        laid = None if g is None else fastpath.columns([g.weight, self.w_1.weight])
        if g is not None and laid is not None and not torch.is_grad_enabled() and not self.training:  # one product
            gate, up = (x @ laid).split(self.w_1.out_features, -1)
            if self.w_1.bias is not None and g.bias is not None:
                gate, up = gate + g.bias, up + self.w_1.bias
            h = self.act(gate) * up
            return self.w_2(h)
        by_rows = None if g is None else fastpath.rows([g.weight, self.w_1.weight])
        if g is not None and by_rows is not None and not torch.is_grad_enabled() and not self.training:
            bias = None if g.bias is None or self.w_1.bias is None else torch.cat([g.bias, self.w_1.bias])
            gate, up = F.linear(x, by_rows, bias).split(self.w_1.out_features, -1)
            return self.w_2(self.act(gate) * up)
        up = fastpath.linear(x, self.w_1.weight, self.w_1.bias, self.w_1)  # (B, L, E) -> (B, L, F)
        if self.w_gate is None:
            h = self.act(up)
        else:
            h = self.act(fastpath.linear(x, self.w_gate.weight, self.w_gate.bias, self.w_gate)) * up  # (B, L, F)
        return self.w_2(self.dropout(h) if self.training else h)  # (B, L, F) -> (B, L, E)
