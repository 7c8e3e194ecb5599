"""Head importance by ablation, and the pruning curve it implies, for models whose task has no labels here:
DINOv2-small (agreement with the unpruned model's features) and Whisper tiny.en (loss and word error rate on spoken
sentences).

Importance of a head = how much the score drops when that head alone is zeroed (zero ablation, which equals
``head_mask`` 0; :func:`multihead.interpret.causal.patching.ablated`), one forward pass per head. The pruning curve masks the
least important heads first, a growing fraction of all of them, and measures the score again. Attention modules are
numbered in the model's order (Whisper: the 4 encoder layers, then each decoder layer's self- and cross-attention).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...modules.capture import attention_modules
from .patching import ablated

FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.5)


def ablation_importance(model, score: Callable[[], float], *, progress: bool = False, desc: str = "heads") -> Tensor:
    """``(modules, H)``: ``score()`` unablated minus ``score()`` with each head zeroed alone."""
    from tqdm import tqdm

    mods = attention_modules(model)
    base = score()
    width = max(m.num_heads for _, m in mods)
    out = torch.full((len(mods), width), float("nan"))
    jobs = [(i, h) for i, (_, m) in enumerate(mods) for h in range(m.num_heads)]
    for i, h in tqdm(jobs, desc=desc, disable=not progress):
        with ablated(model, {i: [h]}):
            out[i, h] = base - score()
    return out


def pruning_curve(model, importance: Tensor, score: Callable[[], float], fractions=FRACTIONS) -> list[dict]:
    """The score with the least important ``fraction`` of all heads zeroed, for each fraction."""
    order = importance.nan_to_num(float("inf")).flatten().argsort()
    width = importance.shape[1]
    total = int((~importance.isnan()).sum())
    rows = []
    for f in fractions:
        k = int(round(f * total))
        heads: dict[int, list[int]] = {}
        for i in order[:k].tolist():
            heads.setdefault(i // width, []).append(i % width)
        with ablated(model, heads):
            rows.append({"fraction": f, "heads_masked": k, "score": score()})
    return rows


@torch.no_grad()
def dinov2_scores(d, *, size: int = 224):
    """``score()`` for DINOv2: mean cosine similarity of every token's last hidden state to the unablated model's,
    over scikit-image's four photographs (1.0 = unchanged)."""
    from ..media.dino import PHOTOS, photo

    xs = [d.preprocess(photo(name), size=size) for name in PHOTOS]
    refs = [d.model.features(x) for x in xs]

    @torch.no_grad()
    def score() -> float:
        sims = [torch.nn.functional.cosine_similarity(d.model.features(x), r, dim=-1).mean() for x, r in zip(xs, refs)]
        return float(torch.stack(sims).mean())

    return score


def whisper_scores(w, n: int = 10):
    """``(loss_score(), wer())`` for Whisper on ``n`` test sentences spoken whole by espeak-ng: minus the mean
    token negative log-likelihood of the reference transcripts (teacher-forced; higher is better), and the word error
    rate of greedy transcripts."""
    from ..media.speech import sentences, speak, word_errors

    items = []
    for text in sentences(n):
        audio = speak(text)
        tokens = w.prompt + w.tokenizer.encode(" " + text, add_special_tokens=False).ids + [w.eot]
        items.append((text, audio, w.features(audio), torch.tensor([tokens])))

    @torch.no_grad()
    def loss_score() -> float:
        total, count = 0.0, 0
        for _, _, feats, seq in items:
            logits = w.model(feats, seq[:, :-1])[:, len(w.prompt) - 1 :]
            target = seq[:, len(w.prompt) :]
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum"))
            count += target.numel()
        return -total / count

    def wer() -> float:
        edits = [word_errors(text, w.transcribe(audio)["text"]) for text, audio, _, _ in items]
        return sum(e for e, _ in edits) / max(1, sum(r for _, r in edits))

    return loss_score, wer


__all__ = ["FRACTIONS", "ablation_importance", "dinov2_scores", "pruning_curve", "whisper_scores"]


def media_importance(
    source: str, kind: str | None = None, out=None, *, n: int | None = None, overwrite: bool = False
) -> dict:
    """Each head's importance by zero ablation and the pruning curve (least important heads masked first), written
    to ``out`` (``importance-ablation.json``, ``importance.png``, ``pruning.png``): DINOv2 by agreement with its
    unpruned features on the four photographs; Whisper by the reference transcripts' loss, the curve by word error
    rate, on spoken sentences. What ``source`` is comes from the source registry (``kind``, ``"dinov2"`` or
    ``"whisper"``, is still accepted and must agree). Returns the JSON's content."""
    from pathlib import Path

    from ..._io import Publish, atomic_write_json
    from ...loading import load as load_source  # the one loader: it knows what a source is
    from ...plotting import curve, head_grid

    loaded = load_source(source)
    found = {"vision": "dinov2", "speech": "whisper"}.get(loaded.kind)
    if found is None or (kind is not None and kind != found):
        raise ValueError(f"{source} is not a DINOv2 or Whisper model; importance by ablation takes dinov2 or whisper")
    kind = found
    if out is None:
        raise ValueError("pass out=: the folder for importance-ablation.json and the pictures")
    if kind == "dinov2":
        d = loaded.detail
        model, score = d.model, dinov2_scores(d)
        curve_score = score
        what = "drop in feature agreement (cosine) when the head is zeroed"
        curve_what = "feature agreement with the unpruned model (cosine)"
    else:
        w = loaded.detail
        model = w.model
        score, curve_score = whisper_scores(w, n=n or 10)
        what = "rise in the reference transcripts' loss (nats/token) when the head is zeroed"
        curve_what = "word error rate of greedy transcripts"
    importance = ablation_importance(model, score, progress=True, desc=f"{kind}: each head zeroed")
    points = pruning_curve(model, importance, curve_score)
    result = {
        "model": str(source),
        "rule": what,
        "importance": importance.tolist(),
        "pruning": points,
        "curve_metric": curve_what,
    }
    with Publish(Path(out), "importance", overwrite=overwrite, sources=(source,)) as folder:
        atomic_write_json(folder / "importance-ablation.json", result)
        head_grid(importance, folder / "importance", f"{source}: {what}")
        curve(
            [100 * r["fraction"] for r in points],
            [r["score"] for r in points],
            folder / "pruning",
            xlabel="heads masked, least important first (%)",
            ylabel=curve_what,
            title=f"{source}: pruning by ablation importance",
        )
    return result
