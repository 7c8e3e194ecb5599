"""Fingerprints of every bundled model's outputs, to show that a change to the readers changes no number.

    .venv/bin/python bench/source_fingerprints.py > before.json   # on the old code
    .venv/bin/python bench/source_fingerprints.py > after.json    # on the new code; then diff the two

Each model reads fixed inputs (a sentence, a seeded image, a seeded log-mel) and the sha256 of its fp32 output bytes
is printed with a few of the values, so that "bit-identical" is a comparison of hashes, not of rounded numbers.
"""

from __future__ import annotations

import hashlib
import json

import torch


def digest(t: torch.Tensor) -> dict:
    t = t.detach().float().contiguous().cpu()
    return {
        "shape": list(t.shape),
        "sha256": hashlib.sha256(t.numpy().tobytes()).hexdigest(),
        "first": [round(v, 6) for v in t.reshape(-1)[:4].tolist()],
    }


@torch.no_grad()
def main() -> None:
    torch.set_num_threads(2)
    from multihead import dinov2, lm, pretrained, whisper  # the per-family entry points, kept for compatibility

    out = {}
    enc = pretrained.load("minilm")
    ids, mask = enc.encode(["The cat sat on the mat.", "Heads look at other tokens."])
    out["minilm"] = digest(enc.model(ids, mask))
    smol = lm.load("smollm2")
    out["smollm2"] = digest(smol.model(torch.tensor([smol.encode("The cat sat on the mat. The cat")])))
    g = torch.Generator().manual_seed(0)
    d = dinov2.load()
    out["dinov2"] = digest(d.model.features(torch.randn(1, 3, 224, 224, generator=g)))
    w = whisper.load()
    feats = torch.randn(1, w.model.config.n_mels, 3000, generator=g)
    out["whisper"] = digest(w.model(feats, torch.tensor([w.prompt])))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
