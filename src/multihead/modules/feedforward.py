"""Position-wise feed-forward network."""
from __future__ import annotations

from torch import Tensor, nn

ACTIVATIONS = {  # ReLU in place: no extra (B, L, F) buffer
    "relu": lambda: nn.ReLU(inplace=True),
    "gelu": nn.GELU,  # exact (erf), BERT's "gelu"
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # HF "gelu_new" / "gelu_pytorch_tanh"
}


def make_activation(name: str) -> nn.Module:
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}") from None


class FeedForward(nn.Module):
    """``Linear(E, F) -> activation -> dropout -> Linear(F, E)`` applied to each position of ``(B, L, E)``."""

    def __init__(self, d_model: int, d_ff: int | None = None, dropout: float = 0.0, activation: str = "relu",
                 bias: bool = True) -> None:
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.act = make_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.w_1(x))  # (B, L, E) -> (B, L, F)
        return self.w_2(self.dropout(h) if self.training else h)  # (B, L, F) -> (B, L, E)
