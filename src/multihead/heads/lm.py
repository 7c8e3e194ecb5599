"""Head importance and pruning for causal LMs (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", on
a decoder): importance is the gradient of the next-token loss on held-out text with respect to a head mask, heads
are pruned by whole key/value groups (a GQA group shares one key/value head: removing its query heads together
removes that key/value head too, which is what makes the pruned model faster), and the result is judged by
perplexity on other held-out text and by decode speed.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.lm_text import held_out_rows
from ..models.protocol import LanguageModel


def _loss(model, ids: Tensor, head_mask: Tensor | None = None) -> Tensor:
    logits = model(ids, head_mask=head_mask)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


@torch.no_grad()
def perplexity(model, ids: Tensor, head_mask: Tensor | None = None, batch_size: int = 4) -> float:
    total, count = 0.0, 0
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        total += float(_loss(model, chunk, head_mask)) * chunk.shape[0]
        count += chunk.shape[0]
    return math.exp(total / count)


def layout(model: LanguageModel) -> tuple[int, int, int]:
    """``(layers, query heads, key/value heads)`` of a causal LM (:meth:`LanguageModel.head_layout`)."""
    return model.head_layout()


def pruned_copy(model: LanguageModel, heads: dict[int, list[int]]) -> LanguageModel:
    """A copy of ``model`` with ``heads`` (``{layer: [query heads]}``, whole GQA groups) removed from its weights;
    ``model`` is unchanged (:meth:`LanguageModel.pruned`)."""
    return model.pruned(heads)


def importance(model, ids: Tensor, batch_size: int = 2, progress: bool = False) -> Tensor:
    """``(layers, H)`` Michel et al.'s importance: ``|d loss / d mask_h|`` summed over batches, each layer's row
    normalised to unit L2 norm (their section 4.1)."""
    from tqdm import tqdm

    layers, heads, _ = layout(model)
    mask = torch.ones(layers, heads, requires_grad=True)
    was = model.training
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for start in tqdm(range(0, len(ids), batch_size), desc="importance", disable=not progress, leave=False):
            _loss(model, ids[start : start + batch_size], mask).backward()
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
        model.train(was)
    score = mask.grad.abs()
    return score / score.norm(dim=1, keepdim=True).clamp_min(1e-12)


def group_scores(scores: Tensor, num_kv_heads: int) -> Tensor:
    """``(layers, G)``: the summed importance of each key/value group's query heads."""
    layers, h = scores.shape
    return scores.view(layers, num_kv_heads, h // num_kv_heads).sum(-1)


def groups_to_prune(scores: Tensor, num_kv_heads: int, fraction: float) -> dict[int, list[int]]:
    """``{layer: [query heads]}``: the lowest-scoring whole groups, ``fraction`` of all query heads."""
    layers, h = scores.shape
    group = h // num_kv_heads
    g = group_scores(scores, num_kv_heads).flatten()
    n = round(fraction * layers * num_kv_heads)
    chosen = g.argsort()[:n].tolist()
    out: dict[int, list[int]] = {}
    for flat in sorted(chosen):
        layer, kv = divmod(flat, num_kv_heads)
        out.setdefault(layer, []).extend(range(kv * group, (kv + 1) * group))
    return out


def mask_of(heads: dict[int, list[int]], layers: int, h: int) -> Tensor:
    mask = torch.ones(layers, h)
    for layer, hs in heads.items():
        mask[layer, hs] = 0
    return mask


@torch.no_grad()
def decode_speed(model, prompt: Tensor, new_tokens: int = 64, repeats: int = 2) -> float:
    """Greedy decoding tokens per second (KV cache), the best of ``repeats`` runs."""
    from ..models.generation import generate

    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        generate(model, prompt, None, max_new_tokens=new_tokens)  # one loop for every model: prefill, then steps
        best = max(best, prompt.shape[0] * new_tokens / (time.perf_counter() - start))
    return best


__all__ = [
    "decode_speed",
    "group_scores",
    "groups_to_prune",
    "held_out_rows",
    "importance",
    "layout",
    "mask_of",
    "perplexity",
    "pruned_copy",
]


def importance_report(
    lm, out, *, source: str, n: int = 16, fractions=(), overwrite: bool = False, save: bool = False
) -> dict:
    """Michel et al.'s importance by perplexity on held-out IMDB text, written to ``out``
    (``importance-michel.json``, ``importance.png``); with ``fractions``, whole GQA groups masked and then removed
    at each fraction: perplexity (on other held-out text) and decode speed before and after, beside randomly chosen
    groups masked. ``save`` (attached HF models): each pruned model also written as an HF folder transformers loads,
    ``out/pruned-<fraction>`` (:func:`multihead.hf.heads.save_pruned`). Returns the JSON's content."""
    from pathlib import Path

    from .._io import Publish, atomic_write_json
    from ..plotting import head_grid

    length = min(256, lm.model.config.max_len)
    rows = held_out_rows(lm, rows=2 * n, length=length)  # read and encoded once: half to score, half to judge
    score_rows, judge_rows = rows[:n], rows[n:]
    scores = importance(lm.model, score_rows, progress=True)
    layers, h = scores.shape
    _, _, kv = layout(lm.model)
    result = {
        "model": source,
        "method": "michel (|d loss / d head mask|, layer-normalised)",
        "scored_on": f"{n} x {length} tokens of IMDB test reviews",
        "judged_on": f"another {n} x {length} tokens",
        "importance": scores.tolist(),
        "perplexity": perplexity(lm.model, judge_rows),
    }
    keep = []  # the pruned models to save, with their fractions
    why = lm.model.why_not_save_pruned() if save and fractions else None
    if why is not None:  # refused before any work
        raise ValueError(why)
    if fractions:
        prompt = score_rows[:1, : min(64, length // 2)]
        new = min(64, lm.model.config.max_len - prompt.shape[1])  # within the model's positions
        result["decode_tokens_per_s"] = {"unpruned": round(decode_speed(lm.model, prompt, new), 1)}
        result["fractions"] = {}
        gen = torch.Generator().manual_seed(0)
        for frac in fractions:
            chosen = groups_to_prune(scores, kv, frac)
            rnd = groups_to_prune(torch.rand(layers, h, generator=gen), kv, frac)
            pruned = pruned_copy(lm.model, chosen)
            result["fractions"][str(frac)] = {
                "heads_pruned": sum(len(v) for v in chosen.values()),
                "of": layers * h,
                "perplexity_pruned": perplexity(pruned, judge_rows),
                "perplexity_masked": perplexity(lm.model, judge_rows, mask_of(chosen, layers, h)),
                "perplexity_random_groups_masked": perplexity(lm.model, judge_rows, mask_of(rnd, layers, h)),
                "decode_tokens_per_s": round(decode_speed(pruned, prompt, new), 1),
                "pruned_heads": {str(k): v for k, v in chosen.items()},
            }
            if save:
                keep.append((frac, pruned))
    with Publish(Path(out), "importance", overwrite=overwrite, sources=(source,)) as folder:
        for frac, pruned in keep:
            saved = pruned.save_pruned(folder / f"pruned-{frac}", tokenizer_from=getattr(lm, "path", None))
            result["fractions"][str(frac)]["saved"] = {"folder": f"pruned-{frac}", **saved}
        atomic_write_json(folder / "importance-michel.json", result)
        head_grid(scores, folder / "importance", f"{source}: head importance (Michel et al.), per layer")
    return result
