"""Evaluation of a classifier on token ids: class probabilities in input order, and accuracy / macro-F1 / loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import data as D
from .metrics import scores


@torch.no_grad()
def predict_ids(
    model: nn.Module, ids: list[list[int]], device, batch_size: int = 128, head_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Class probabilities ``(N, C)`` in input order (``head_mask`` ``(layers, H)``: heads scaled/masked)."""
    model.eval()
    probs = [None] * len(ids)
    for chunk, x, mask in D.length_sorted(ids, batch_size):
        hm = (
            None
            if head_mask is None
            else [m.to(device) for m in head_mask]
            if isinstance(head_mask, list)
            else head_mask.to(device)
        )  # (layers, H), or per-layer (H_l,) after physical pruning
        p = torch.softmax(model(x.to(device), mask.to(device), head_mask=hm).float(), dim=-1).cpu()
        for row, i in enumerate(chunk):
            probs[i] = p[row]
    return torch.stack(probs)


def evaluate_ids(
    model, ids, labels: list[int], num_classes: int, device, head_mask: torch.Tensor | None = None
) -> dict:
    probs = predict_ids(model, ids, device, head_mask=head_mask)
    y = torch.tensor(labels)
    loss = F.nll_loss(torch.log(probs.clamp_min(1e-12)), y).item()
    out = scores(labels, probs.argmax(-1).tolist(), num_classes)
    out["loss"] = loss
    return out


__all__ = ["evaluate_ids", "predict_ids"]
