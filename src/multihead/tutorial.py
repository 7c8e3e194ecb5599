"""The seed tutorial's code, kept verbatim in spirit: the baseline our modules are measured and tested against.

``TutorialMultiHeadAttention`` is section 4.1's hand-written MHA (explicit softmax(QK^T/sqrt(d))V, ``-1e9`` fill,
returns per-head weights). It is deliberately *not* used by the library's models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TutorialMultiHeadAttention(nn.Module):
    def __init__(self, d_model: int = 512, num_heads: int = 8):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.d_k = d_model // num_heads
        self.h = num_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, L, D = x.size()
        q = self.w_q(x).view(B, L, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)
        k = self.w_k(x).view(B, L, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)
        v = self.w_v(x).view(B, L, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)
        scores = torch.matmul(q, k.transpose(-2, -1)) / (self.d_k**0.5)  # (B, h, L, L)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        weights = F.softmax(scores, dim=-1)
        context = torch.matmul(weights, v)  # (B, h, L, d_k)
        context = context.transpose(1, 2).contiguous().view(B, L, D)  # (B, L, D)
        return self.w_o(context), weights
