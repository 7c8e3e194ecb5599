"""Function-vector heads beside induction heads (Yin & Steinhardt 2025, "Which Attention Heads Matter for In-Context
Learning?"; the function-vector score of Todd et al. 2024), measured through the model's anatomy on any causal LM.

A few-shot prompt is ``demonstrations + query``; its **corrupted** twin has the same demonstrations with every label
moved to another demonstration (a derangement), so the pairs no longer show the task. Per head (site ``i``, head
``h``):

* **Function-vector score** -- the causal indirect effect of the head's mean output: its output at the prompt's
  last position averaged over the clean prompts of a task (``z`` before the output projection), patched into the
  corrupted prompt at the last position; the score is the rise in the probability of the right answer's first token,
  averaged over prompts, then over tasks.
* **Induction score** -- prefix matching on repeated random tokens
  (:func:`multihead.interpret.roles.induction.prefix_matching`).
* **Ablation** -- a head's output replaced, at every position, by its mean over the corrupted prompts of the task
  (what it writes when the prompt carries no task); few-shot accuracy (greedy first token) of the clean prompts with
  the top-``k`` heads of each kind ablated, beside ``k`` random heads and each kind with the other's top heads left
  out (the paper's exclusion).

Only the last position of the corrupted prompt is patched, so everything before it is computed once
(:meth:`prefill`) and every head of the model is patched in one decoding step, one head per row.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ...data.batching import collate
from ...modules.anatomy import anatomy


# the head sets ablated at each k: the top of each kind, each without the other's top heads (the paper's exclusion),
# and random heads
ABLATIONS = ("fv", "induction", "fv without induction", "induction without fv", "random")


@dataclass(frozen=True)
class Prompt:
    """One few-shot prompt as token ids: ``clean`` (demonstrations + query), ``corrupted`` (the labels deranged,
    the same length) and ``answer`` (the right answer's first token)."""

    clean: tuple[int, ...]
    corrupted: tuple[int, ...]
    answer: int


def derange(n: int, rng: random.Random) -> list[int]:
    """A permutation of ``range(n)`` moving every index (``n >= 2``)."""
    if n < 2:
        raise ValueError("labels can only be moved between at least two demonstrations")
    while True:
        p = list(range(n))
        rng.shuffle(p)
        if all(i != j for i, j in enumerate(p)):
            return p


TEMPLATE = "Q: {x}\nA: {y}\n\n"


def text_prompts(
    pairs: list[tuple[str, str]], encode: Callable[[str], list[int]], *, n: int, shots: int, seed: int
) -> list[Prompt]:
    """``n`` prompts of ``shots`` demonstrations in Todd et al.'s template (``Q: x / A: y``), the query's answer
    scored on its first token (after a space). The labels of the corrupted twin are deranged; where the two texts
    tokenize to different lengths the pair is drawn again."""
    if shots < 2 or shots + 1 > len(pairs):
        raise ValueError(f"choose between 2 and {len(pairs) - 1} demonstrations for a task of {len(pairs)} pairs")
    rng = random.Random(seed)
    out: list[Prompt] = []
    for _ in range(50 * n):
        if len(out) == n:
            break
        drawn = rng.sample(pairs, shots + 1)
        demos, (q, a) = drawn[:shots], drawn[shots]
        moved = derange(shots, rng)
        clean = "".join(TEMPLATE.format(x=x, y=y) for x, y in demos) + f"Q: {q}\nA:"
        bad = "".join(TEMPLATE.format(x=x, y=demos[moved[i]][1]) for i, (x, _) in enumerate(demos)) + f"Q: {q}\nA:"
        ids, bad_ids = encode(clean), encode(bad)
        if len(ids) == len(bad_ids):
            out.append(Prompt(tuple(ids), tuple(bad_ids), encode(" " + a)[0]))
    if len(out) < n:
        raise ValueError(f"only {len(out)} of {n} prompts kept the same length with their labels moved")
    return out


# ------------------------------------------------------------------------------------------------ hooks on heads
def _site_hooks(model, fn_for: Callable[[int], Callable | None]) -> list:
    a = anatomy(model)
    handles = []
    for i, s in enumerate(a.sites):
        fn = fn_for(i)
        if fn is not None:
            handles.append(s.module.hook_z.add_hook(fn))
    return handles


@torch.no_grad()
def mean_outputs(model, rows: list[tuple[int, ...]], *, last: bool, pad: int = 0) -> list[Tensor]:
    """Per site, every head's mean output ``z`` ``(H, D)``: at the last position of each row (``last``), or over
    every real position of every row."""
    a = anatomy(model)
    ids, real = collate([list(r) for r in rows], pad)  # right-padded: a causal model's real positions never see it
    n = real.sum(1)
    sums: dict[int, Tensor] = {}

    def record(i: int) -> Callable:
        def hook(z: Tensor, _h) -> None:
            z = z.detach().double()  # (B, H, L, D)
            if last:
                got = z[torch.arange(z.shape[0]), :, n - 1].sum(0)  # (H, D)
            else:
                got = (z * real[:, None, :, None]).sum((0, 2)) / real.sum()
            sums[i] = got + sums[i] if i in sums else got

        return hook

    handles = _site_hooks(model, record)
    try:
        a.logits(ids)
    finally:
        for h in handles:
            h.remove()
    return [(sums[i] / (len(rows) if last else 1)).float() for i in range(len(a.sites))]


# ----------------------------------------------------------------------------------------- function-vector score
@torch.no_grad()
def fv_scores(model, prompts: list[Prompt], progress=None) -> Tensor:
    """``(sites, H)``: each head's causal indirect effect on one task's prompts (module docstring)."""
    a = anatomy(model)
    means = mean_outputs(model, [p.clean for p in prompts], last=True)
    heads = max(s.num_heads for s in a.sites)
    cie = torch.zeros(len(a.sites), heads, dtype=torch.float64)
    offsets = [0]
    for s in a.sites:
        offsets.append(offsets[-1] + s.num_heads)

    def patch(i: int) -> Callable:
        def hook(z: Tensor, _h) -> Tensor:
            z = z.clone()
            h = torch.arange(a.sites[i].num_heads)
            z[offsets[i] + h, h, -1] = means[i][h].to(z.dtype)  # row offset + h: head h's clean mean, alone
            return z

        return hook

    rows = offsets[-1] + 1  # one row per head of the model, and a last row patched nowhere (the baseline)
    for p in prompts:
        ids = torch.tensor([p.corrupted])
        _, prefix = model.prefill(ids[:, :-1])
        prefix.reorder(torch.zeros(rows, dtype=torch.long))
        handles = _site_hooks(model, patch)
        try:
            probs = model.step(ids[:, -1].expand(rows), prefix).float().softmax(-1)[:, p.answer]
        finally:
            for h in handles:
                h.remove()
        for i, s in enumerate(a.sites):
            cie[i, : s.num_heads] += (probs[offsets[i] : offsets[i + 1]] - probs[-1]).double()
        if progress is not None:
            progress.update(1)
    return (cie / len(prompts)).float()


# ---------------------------------------------------------------------------------------------- induction score
@torch.no_grad()
def induction_scores(model, *, low: int, high: int, half: int = 24, batch: int = 8, seed: int = 0) -> Tensor:
    """``(sites, H)`` prefix-matching scores on seeded repeated random tokens from ``[low, high)``."""
    from ..roles.induction import prefix_matching, repeated_tokens

    a = anatomy(model)
    g = torch.Generator().manual_seed(seed)
    ids = repeated_tokens(batch, half, low=low, high=high, start=low, generator=g)
    got: dict[int, Tensor] = {}

    def record(i: int) -> Callable:
        def hook(p: Tensor, _h) -> None:
            got[i] = p.detach()

        return hook

    handles = [s.module.hook_pattern.add_hook(record(i)) for i, s in enumerate(a.sites)]
    try:
        a.logits(ids)
    finally:
        for h in handles:
            h.remove()
    return prefix_matching([got[i] for i in range(len(a.sites))], half)


# ------------------------------------------------------------------------------------------------------ ablation
@torch.no_grad()
def accuracy(model, prompts: list[Prompt], ablate: dict[tuple[int, int], Tensor] | None = None) -> float:
    """Greedy first-token accuracy on the clean prompts, with each ``(site, head)`` in ``ablate`` replaced at every
    position by the given mean output ``(D,)``."""
    a = anatomy(model)
    ids, real = collate([list(p.clean) for p in prompts])
    n = real.sum(1)
    by_site: dict[int, list[tuple[int, Tensor]]] = {}
    for (i, h), mean in (ablate or {}).items():
        by_site.setdefault(i, []).append((h, mean))

    def replace(i: int) -> Callable | None:
        if i not in by_site:
            return None

        def hook(z: Tensor, _h) -> Tensor:
            z = z.clone()
            for h, mean in by_site[i]:
                z[:, h] = mean.to(z.dtype)
            return z

        return hook

    handles = _site_hooks(model, replace)
    try:
        logits = a.logits(ids)
    finally:
        for h in handles:
            h.remove()
    picked = logits[torch.arange(len(prompts)), n - 1].argmax(-1)
    answers = torch.tensor([p.answer for p in prompts])
    return float((picked == answers).double().mean())


def top_heads(scores: Tensor, k: int, *, leave_out: set | None = None) -> list[tuple[int, int]]:
    """The ``k`` highest-scoring ``(site, head)`` pairs (NaN last), leaving out ``leave_out``."""
    flat = torch.nan_to_num(scores.double(), nan=-float("inf")).flatten()
    order = flat.argsort(descending=True).tolist()
    heads = scores.shape[1]
    out = [(j // heads, j % heads) for j in order if (j // heads, j % heads) not in (leave_out or set())]
    return out[:k]


def ablation_table(
    model,
    tasks: dict[str, tuple[list[Prompt], list[Prompt]]],
    fv: Tensor,
    ind: Tensor,
    ks: list[int],
    *,
    seed: int,
    progress=None,
) -> dict:
    """Few-shot accuracy per task (``tasks[name] = (scored prompts, held-out prompts)``) as it is and with the top
    ``k`` heads of each kind mean-ablated, for every ``k`` in ``ks``."""
    a = anatomy(model)
    real = [(i, h) for i, s in enumerate(a.sites) for h in range(s.num_heads)]
    rng = random.Random(seed)
    out: dict = {"clean": {}, "k": {}}
    means = {
        name: mean_outputs(model, [p.corrupted for p in scored], last=False) for name, (scored, _) in tasks.items()
    }
    for name, (_, held) in tasks.items():
        out["clean"][name] = accuracy(model, held)
    for k in ks:
        top_fv, top_ind = top_heads(fv, k), top_heads(ind, k)
        sets = {
            "fv": top_fv,
            "induction": top_ind,
            "fv without induction": top_heads(fv, k, leave_out=set(top_ind)),
            "induction without fv": top_heads(ind, k, leave_out=set(top_fv)),
            "random": rng.sample(real, min(k, len(real))),
        }
        row: dict = {"heads": {kind: [list(x) for x in hs] for kind, hs in sets.items()}}
        for kind, hs in sets.items():
            row[kind] = {
                name: accuracy(model, held, {(i, h): means[name][i][h] for i, h in hs})
                for name, (_, held) in tasks.items()
            }
            if progress is not None:
                progress.update(1)
        out["k"][str(k)] = row
    return out


def overlap(fv: Tensor, ind: Tensor, k: int) -> dict:
    """How many of the top-``k`` heads by one score are top-``k`` by the other, and the rank correlation over
    every head."""
    a, b = set(top_heads(fv, k)), set(top_heads(ind, k))
    keep = ~(fv.isnan() | ind.isnan())
    x, y = fv[keep].double(), ind[keep].double()
    rx, ry = x.argsort().argsort().double(), y.argsort().argsort().double()
    rho = float(torch.corrcoef(torch.stack([rx, ry]))[0, 1]) if len(x) > 2 else float("nan")
    return {"k": k, "shared": sorted(list(h) for h in a & b), "count": len(a & b), "spearman": rho}


__all__ = [
    "TEMPLATE",
    "Prompt",
    "ablation_table",
    "accuracy",
    "derange",
    "fv_scores",
    "fv_vs_induction",
    "induction_scores",
    "judge",
    "mean_outputs",
    "overlap",
    "text_prompts",
    "top_heads",
]


# ------------------------------------------------------------------------------------------------- the finding
def fv_vs_induction(
    model,
    tasks: dict[str, tuple[list[Prompt], list[Prompt]]],
    *,
    ks: list[int],
    vocab: tuple[int, int],
    seed: int = 0,
    progress=None,
) -> dict:
    """The function-vector finding on ``model``: per-task and mean function-vector scores (from each task's scored
    prompts), induction scores on random tokens from ``vocab`` ``[low, high)``, their overlap at each ``k``, and the
    few-shot accuracy of the held-out prompts with the top-``k`` heads of each kind ablated."""
    per_task = {name: fv_scores(model, scored, progress) for name, (scored, _) in tasks.items()}
    fv = torch.stack(list(per_task.values())).mean(0)
    half = max(2, min(24, (model.config.max_len - 1) // 2))  # the repeated tokens fit the model's positions
    ind = induction_scores(model, low=vocab[0], high=vocab[1], half=half, seed=seed)
    if progress is not None:
        progress.update(1)
    table = ablation_table(model, tasks, fv, ind, ks, seed=seed, progress=progress)
    clean = _mean(table["clean"].values())
    drops = {k: {kind: clean - _mean(row[kind].values()) for kind in ABLATIONS} for k, row in table["k"].items()}
    overlaps = {str(k): overlap(fv, ind, k) for k in ks}
    verdict, reproduced = judge(clean, drops, overlaps, len(tasks))
    return {
        "fv": fv.tolist(),
        "fv_per_task": {name: s.tolist() for name, s in per_task.items()},
        "induction": ind.tolist(),
        "overlap": overlaps,
        "ablation": table,
        "drops": {str(k): v for k, v in drops.items()},
        "verdict": verdict,
        "reproduced": reproduced,
    }


def judge(clean: float, drops: dict, overlaps: dict, tasks: int) -> tuple[str, bool]:
    """The verdict line and whether the paper's claim holds: at every ``k``, ablating the top function-vector heads
    costs more accuracy than the top induction heads, also with the other kind's top heads left out, and at most
    half of the top ``k`` are in both sets."""
    reproduced = all(
        d["fv"] > d["induction"]
        and d["fv without induction"] > d["induction without fv"]
        and overlaps[str(k)]["count"] <= int(k) // 2
        for k, d in drops.items()
    )
    first = next(iter(overlaps.values()))
    verdict = f"few-shot accuracy {clean:.2f} over {tasks} tasks; " + "; ".join(
        f"ablating the top {k} function-vector heads costs {d['fv']:.2f}, the top {k} induction heads "
        f"{d['induction']:.2f}, {k} random heads {d['random']:.2f}, each kind without the other's top heads "
        f"{d['fv without induction']:.2f} vs {d['induction without fv']:.2f}, {overlaps[str(k)]['count']} heads "
        "in both"
        for k, d in drops.items()
    )
    return verdict + f"; rank correlation of the two scores {first['spearman']:.2f}", bool(reproduced)


def _mean(values) -> float:
    v = list(values)
    return sum(v) / len(v)
