"""``multihead bench train``: our classifier vs the same model built from ``nn.TransformerEncoderLayer``.

Both: embedding (vocab 10,000) -> sinusoidal positions -> 2 post-LN blocks (d_model 256, 4 heads, FFN 1024, dropout
0.1, ReLU) -> mean over real tokens -> linear (2 classes). Batch 32 x length 128. ``train`` = forward, backward and
an AdamW step; ``inference`` = eval + no_grad forward. ``padded`` cases draw lengths in [16, 128] per sequence, as
real text does (PyTorch's encoder then takes its nested-tensor fast path in inference).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from .harness import machine_info, make_step, run_case, write_json

SUITE = "multihead.bench.train"
D_MODEL, HEADS, LAYERS, D_FF, VOCAB, BATCH, LENGTH = 256, 4, 2, 1024, 10000, 32, 128
IMPLS = ["torch_encoder", "multihead"]
MODES = ["train", "inference"]


class TorchEncoderClassifier(nn.Module):
    """The same classifier from PyTorch's own encoder layers."""

    def __init__(self):
        super().__init__()
        from ..modules.positional import SinusoidalPositionalEncoding

        self.embed = nn.Embedding(VOCAB, D_MODEL, padding_idx=0)
        self.pe = SinusoidalPositionalEncoding(D_MODEL, 512, 0.1)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=True)
        self.fc = nn.Linear(D_MODEL, 2)

    def forward(self, ids, keep):
        x = self.encoder(self.pe(self.embed(ids)), src_key_padding_mask=~keep)  # (B, L, E)
        w = keep.unsqueeze(-1).to(x.dtype)
        return self.fc((x * w).sum(1) / w.sum(1).clamp_min(1))


def _model(impl: str) -> nn.Module:
    if impl == "torch_encoder":
        return TorchEncoderClassifier()
    if impl == "multihead":
        from ..models.classifier import TransformerClassifier

        return TransformerClassifier(VOCAB, D_MODEL, HEADS, LAYERS, 2, d_ff=D_FF, dropout=0.1)
    raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLS}")


def flops(case: dict) -> float:
    tokens = case["tokens"]
    per_token = LAYERS * (8 * D_MODEL**2 + 4 * D_MODEL * D_FF + 4 * LENGTH * D_MODEL)
    return tokens * per_token * (3 if case["mode"] == "train" else 1)


def _batch(padded: bool):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=g)
    lengths = torch.randint(16, LENGTH + 1, (BATCH,), generator=g) if padded else torch.full((BATCH,), LENGTH)
    lengths[0] = LENGTH
    keep = torch.arange(LENGTH)[None, :] < lengths[:, None]
    return ids.masked_fill(~keep, 0), keep


def build(case: dict):
    model = _model(case["impl"])
    ids, keep = _batch(case["padded"])
    y = torch.randint(0, 2, (BATCH,))
    return make_step(
        model,
        lambda: model(ids, keep),
        train=case["mode"] == "train",
        loss=lambda logits: nn.functional.cross_entropy(logits, y),
        lr=1e-4,
    )


def run(*, threads=None, out: Path | None = None, min_time: float = 2.0, progress=True) -> dict:
    from tqdm import tqdm

    cases = []
    for padded in (False, True):
        _, keep = _batch(padded)
        for mode in MODES:
            for impl in IMPLS:
                cases.append({"impl": impl, "mode": mode, "padded": padded, "tokens": int(keep.sum())})
    results = [
        run_case(SUITE, c, threads=threads, min_time=min_time)
        for c in tqdm(cases, desc="bench train", disable=not progress)
    ]
    base = {(r["mode"], r["padded"]): r for r in results if r["impl"] == "torch_encoder" and "error" not in r}
    for r in results:
        ref = base.get((r["mode"], r["padded"]))
        if ref and "error" not in r:
            r["speedup_vs_torch_encoder"] = ref["seconds_min"] / r["seconds_min"]
            r["tokens_per_second"] = r["tokens"] / r["seconds_min"]
    payload = {
        "suite": "train",
        "config": {
            "d_model": D_MODEL,
            "heads": HEADS,
            "layers": LAYERS,
            "d_ff": D_FF,
            "batch": BATCH,
            "length": LENGTH,
            "vocab": VOCAB,
        },
        "machine": machine_info(threads),
        "results": results,
    }
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    lines = [
        f"torch {payload['machine']['torch']}, {payload['machine']['threads']} threads; batch {BATCH} x {LENGTH}, "
        f"d_model {D_MODEL}, {HEADS} heads, {LAYERS} layers",
        f"{'mode':<10}{'padded':<8}{'impl':<15}{'min ms':>9}{'tokens/s':>11}{'speed-up':>10}{'peak MiB':>10}",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['mode']:<10}{str(r['padded']):<8}{r['impl']:<15} {r['error']}")
            continue
        lines.append(
            f"{r['mode']:<10}{str(r['padded']):<8}{r['impl']:<15}{1e3 * r['seconds_min']:>9.1f}"
            f"{r['tokens_per_second']:>11.0f}{r['speedup_vs_torch_encoder']:>9.2f}x{r['peak_mb'] or 0:>10.0f}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"train-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench train`` (the suite protocol in :mod:`multihead.bench`)."""
    return run(threads=args.threads, out=out, min_time=args.min_time)
