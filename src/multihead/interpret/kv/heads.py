"""Which heads need the whole KV cache: retrieval heads found on needles, echo and induction heads found without
data, and the split a head-aware cache uses (:func:`multihead.modules.kv.head_aware_policy`).

* **Retrieval score** (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality"): on
  needle-in-a-haystack prompts (:mod:`multihead.data.needles`) the model reads the answer teacher-forced; at each
  answer token that the model itself ranks first, a head *copies* when its strongest key is inside the needle and
  holds that same token. A head's score is the share of answer tokens it copied (averaged over the needles); Wu et
  al. call heads with a score of at least 0.1 retrieval heads. Only the answer rows of each map are kept.
* **Echo and induction scores** (RazorAttention, Tang et al. 2024), on repeated random tokens with no data: the
  weight a second occurrence puts on its first occurrence (echo) and on the token after it (induction, the
  prefix-matching score of :mod:`multihead.interpret.roles.induction`).
* **The split**: the key/value heads ranked by a score, the top ``fraction`` keep every key, the rest keep sinks
  and a window. By default the score is data-free (``max(echo, induction)`` over the heads that share a key/value
  head): one short forward pass, no solved task needed (a small model that fails long needles never lets a head
  score), and RazorAttention reports it on par with selection that needs training. ``score="retrieval"`` ranks by
  Wu et al.'s score instead.
* **Fitted gates** (DuoAttention, Xiao et al. 2024, ``score="fitted"``): each key/value head gets a gate
  ``a`` in [0, 1] that mixes its full attention with sinks + window attention, ``a z_full + (1 - a) z_window``;
  the gates are fitted by distillation with the model frozen: the mixed model's next-token distribution on the
  needle prompts' question and answer rows is pulled towards the full model's, with an L1 push of every gate
  towards 0. A head whose gate stays high is one the answer cannot do without; the split keeps those.

Every function works on any LM multihead reads, native or attached (:func:`multihead.hf.attach`): they only use the
attention modules' ``hook_pattern``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from ...modules.capture import attention_modules
from ..roles.induction import repeated_tokens

SCORES = ("data-free", "retrieval", "fitted")  # what the split of key/value heads ranks them by
RETRIEVAL = 0.1  # Wu et al.'s threshold
INDUCTION = 0.4  # the prefix-matching threshold of `multihead heads` (multihead.interpret.roles.induction.INDUCTION)
ECHO = 0.4


def kv_heads_per_layer(model) -> list[int]:
    """Key/value heads per layer (the query heads' groups), for native and attached models."""
    out = []
    for _, mod in attention_modules(model):
        g = getattr(mod, "num_kv_heads", None) or getattr(mod, "num_heads", None)
        out.append(int(g))
    return out


def _num_heads(model) -> list[int]:
    return [int(mod.num_heads) for _, mod in attention_modules(model)]


@torch.no_grad()
def pattern_rows(model, ids: Tensor, rows: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The model's output on ``ids`` and the attention weights of query ``rows`` only, per layer ``(B, H, R, L)``:
    each layer's map is computed explicitly (the module's own formula, through its ``hook_pattern``) and cut to those
    rows at once, so memory stays one layer's map at a time."""
    kept: list[Tensor] = []
    handles = []
    for _, mod in attention_modules(model):
        handles.append(mod.hook_pattern.add_hook(lambda p, hook: kept.append(p[:, :, rows].float().clone())))
    try:
        out = model(ids)
    finally:
        for h in handles:
            h.remove()
    return out, kept


def retrieval_scores(model, needles, *, progress: bool = False) -> dict:
    """Wu et al.'s retrieval score ``(layers, H)`` on ``needles`` (:class:`multihead.data.needles.Needle`), the
    share of answer tokens the model ranked first (``solved``), and per needle whether it did for all of them."""
    from tqdm import tqdm

    heads = _num_heads(model)
    layers, h_max = len(heads), max(heads)
    total = torch.zeros(layers, h_max)
    solved, per_needle = 0, []
    was = model.training
    model.eval()
    for n in tqdm(needles, desc="needles", leave=False, disable=not progress):
        full = torch.tensor([n.ids + n.answer[:-1]])  # the answer teacher-forced
        p = len(n.ids)
        rows = torch.arange(p - 1, p - 1 + len(n.answer))  # row i predicts answer[i]
        out, patterns = pattern_rows(model, full, rows)
        logits = getattr(out, "logits", out)  # an attached HF model returns its output object
        target = torch.tensor(n.answer)
        right = logits[0, rows].argmax(-1) == target  # (R,): the model itself ranks the answer token first
        solved += int(right.sum())
        per_needle.append(bool(right.all()))
        hits = torch.zeros(layers, h_max)
        ids = full[0]
        for layer, w in enumerate(patterns):
            top = w[0].argmax(-1)  # (H, R): each head's strongest key per answer row
            inside = (top >= n.needle_start) & (top < n.needle_end)
            copies = inside & (ids[top] == target[None, :]) & right[None, :]
            hits[layer, : w.shape[1]] = copies.float().sum(-1)
        total += hits / len(n.answer)
    model.train(was)
    answers = sum(len(n.answer) for n in needles)
    return {
        "retrieval": total / len(needles),
        "solved": solved / answers,
        "needles_solved": per_needle,
    }


@torch.no_grad()
def echo_and_induction(model, *, half: int = 128, batch: int = 4, low: int = 1000, start: int = 0, seed: int = 0):
    """``(layers, H)`` echo and induction (prefix-matching) scores on seeded repeated random tokens: from the second
    occurrence of each token, the weight on its first occurrence and on the token that followed it."""
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(seed)
    ids = repeated_tokens(batch, half, low=min(low, vocab // 10), high=vocab, start=start, generator=g)
    q = torch.arange(1 + half, 1 + 2 * half - 1)  # second occurrences (the last has nothing after its first)
    _, patterns = pattern_rows(model, ids, q)
    first = q - half  # the first occurrence of the same token
    rows, padded = torch.arange(len(q)), _padded(patterns)
    echo = torch.stack([p[:, :, rows, first].mean((0, 2)) for p in padded])
    induction = torch.stack([p[:, :, rows, first + 1].mean((0, 2)) for p in padded])
    return {"echo": echo, "induction": induction, "half": half}


def _padded(patterns: list[Tensor]) -> list[Tensor]:
    """Per-layer maps padded with NaN heads to the widest layer (pruned layers have fewer heads)."""
    h = max(p.shape[1] for p in patterns)
    return [torch.cat([p, p.new_full((p.shape[0], h - p.shape[1], *p.shape[2:]), math.nan)], 1) for p in patterns]


def _window_mask(n: int, sinks: int, window: int, device) -> Tensor:
    """``(n, n)`` bool: a query sees the first ``sinks`` keys and the last ``window`` up to itself."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) & ((j < sinks) | (j > i - window))


def fit_gates(
    model,
    needles,
    *,
    sinks: int = 4,
    window: int = 64,
    steps: int = 24,
    lr: float = 0.05,
    penalty: float = 0.02,
    tail: int = 32,
    progress: bool = False,
) -> dict:
    """DuoAttention's gates ``(layers, G)`` fitted on ``needles`` (prompts of :mod:`multihead.data.needles`, the
    answer teacher-forced): ``steps`` Adam steps (one needle each, in turn) on the gates alone, the model frozen.
    The loss is the KL divergence from the full model's next-token distribution to the mixed model's on the last
    ``tail`` positions of each prompt and its answer, plus ``penalty`` x the mean gate. Returns the gates, the loss
    of every step and the seconds it took."""
    import time

    from tqdm import tqdm

    from ...attention.registry import attention

    if not needles:
        raise ValueError("fitting the gates needs needle prompts (--needles 1 or more)")
    mods = attention_modules(model)
    kv = kv_heads_per_layer(model)
    gates = torch.ones(len(mods), max(kv), requires_grad=True)
    opt = torch.optim.Adam([gates], lr=lr)
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for prm, _ in frozen:
        prm.requires_grad_(False)
    was = model.training
    model.eval()
    seen: dict[int, dict] = {}

    def keep(layer: int, name: str):
        def fn(t, hook):
            seen.setdefault(layer, {})[name] = t

        return fn

    def mix(layer: int, mask_of):
        def fn(z, hook):
            q, k, v = (seen[layer][n] for n in ("q", "k", "v"))
            streamed, _ = attention(q, k, v, mask=mask_of(q.shape[2]))
            a = gates[layer, : kv[layer]].clamp(0, 1).repeat_interleave(q.shape[1] // kv[layer])
            return a[None, :, None, None] * z + (1 - a[None, :, None, None]) * streamed

        return fn

    masks: dict[int, Tensor] = {}

    def mask_of(n: int) -> Tensor:
        if n not in masks:
            masks[n] = _window_mask(n, sinks, window, gates.device)
        return masks[n]

    losses = []
    t0 = time.perf_counter()
    try:
        for step in tqdm(range(steps), desc="fitting gates", leave=False, disable=not progress):
            n = needles[step % len(needles)]
            ids = torch.tensor([n.ids + n.answer[:-1]])
            rows = slice(ids.shape[1] - tail - len(n.answer) + 1, ids.shape[1])
            with torch.no_grad():
                out = model(ids)
                teacher = torch.log_softmax(getattr(out, "logits", out)[0, rows].float(), -1)
            handles = []
            for layer, (_, mod) in enumerate(mods):
                handles += [getattr(mod, f"hook_{x}").add_hook(keep(layer, x)) for x in ("q", "k", "v")]
                handles.append(mod.hook_z.add_hook(mix(layer, mask_of)))
            try:
                out = model(ids)
            finally:
                for h in handles:
                    h.remove()
                seen.clear()
            student = torch.log_softmax(getattr(out, "logits", out)[0, rows].float(), -1)
            kl = torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="batchmean")
            live = torch.cat([gates[i, :g] for i, g in enumerate(kv)])
            loss = kl + penalty * live.clamp(0, 1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                gates.clamp_(0, 1)
            losses.append(round(float(kl.detach()), 5))
    finally:
        for prm, flag in frozen:
            prm.requires_grad_(flag)
        model.train(was)
    g = gates.detach()
    return {
        "gates": [[round(float(g[i, h]), 4) for h in range(n_kv)] for i, n_kv in enumerate(kv)],
        "losses": losses,
        "seconds": round(time.perf_counter() - t0, 1),
        "settings": {"sinks": sinks, "window": window, "steps": steps, "lr": lr, "penalty": penalty, "tail": tail},
    }


def kv_head_scores(scores: Tensor, num_kv_heads: list[int]) -> list[list[float]]:
    """Per layer, each key/value head's score: the largest of the query heads that share it."""
    out = []
    for layer, g in enumerate(num_kv_heads):
        row = scores[layer]
        h = int(torch.isfinite(row).sum())
        r = max(h // g, 1)
        out.append([float(row[i * r : (i + 1) * r].max()) for i in range(g)])
    return out


def split(kv_scores: list[list[float]], fraction: float) -> list[list[int]]:
    """The key/value heads that keep every key, per layer: the top ``fraction`` of all key/value heads by score
    (at least one)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"the share of key/value heads that keep every key must be in (0, 1], got {fraction}")
    flat = [(s, layer, h) for layer, row in enumerate(kv_scores) for h, s in enumerate(row)]
    n = max(1, round(fraction * len(flat)))
    chosen = sorted(flat, key=lambda t: -t[0])[:n]
    out: list[list[int]] = [[] for _ in kv_scores]
    for _, layer, h in chosen:
        out[layer].append(h)
    return [sorted(x) for x in out]


def classify(
    model,
    needles,
    *,
    fraction: float = 0.25,
    score: str = "data-free",
    start: int = 0,
    progress: bool = False,
    fit: dict | None = None,
) -> dict:
    """Every head's retrieval, echo and induction scores and the split of key/value heads for a head-aware cache.
    ``needles``: prompts from :func:`multihead.data.needles.make_needles` (may be empty with ``score="data-free"``:
    no retrieval score then). ``fit``: :func:`fit_gates`'s options (``score="fitted"``)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if score != "data-free" and not needles:
        raise ValueError(f"the {score} split needs needles: give at least one")
    kv = kv_heads_per_layer(model)
    heads = _num_heads(model)
    half = max(2, min(128, (int(model.config.max_len) - 1) // 2))  # two copies within the model's positions
    ei = echo_and_induction(model, half=half, start=start)
    data_free = torch.maximum(ei["echo"], ei["induction"])
    ret = retrieval_scores(model, needles, progress=progress) if needles else None
    fitted = fit_gates(model, needles, progress=progress, **(fit or {})) if score == "fitted" else None
    if fitted is not None:
        per_kv = fitted["gates"]
    else:
        per_kv = kv_head_scores(data_free if score == "data-free" else ret["retrieval"], kv)  # type: ignore[index]
    full_heads = split(per_kv, fraction)
    table = []
    for layer, h_n in enumerate(heads):
        for h in range(h_n):
            r = None if ret is None else round(float(ret["retrieval"][layer, h]), 4)
            e, i = float(ei["echo"][layer, h]), float(ei["induction"][layer, h])
            g = h // max(h_n // kv[layer], 1)
            roles = [
                name
                for name, hit in (("retrieval", r is not None and r >= RETRIEVAL), ("induction", i >= INDUCTION))
                if hit
            ] + (["echo"] if e >= ECHO else [])
            table.append(
                {
                    "layer": layer,
                    "head": h,
                    "kv_head": g,
                    "retrieval": r,
                    "echo": round(e, 4),
                    "induction": round(i, 4),
                    "roles": roles,
                    "gate": None if fitted is None else fitted["gates"][layer][g],
                    "full_cache": g in full_heads[layer],
                }
            )
    retrieval_heads = [f"L{t['layer']}H{t['head']}" for t in table if "retrieval" in t["roles"]]
    induction_heads = [f"L{t['layer']}H{t['head']}" for t in table if "induction" in t["roles"]]
    kept = {(t["layer"], t["head"]) for t in table if t["full_cache"]}
    return {
        "heads": table,
        "num_heads": heads,
        "num_kv_heads": kv,
        "split": {"score": score, "fraction": fraction, "full_heads": full_heads},
        "gates": fitted,
        "retrieval_heads": retrieval_heads,
        "induction_heads": induction_heads,
        "both": sorted(set(retrieval_heads) & set(induction_heads), key=_order),
        "retrieval_in_full_groups": sum(
            1 for t in table if "retrieval" in t["roles"] and (t["layer"], t["head"]) in kept
        ),
        "needles": None
        if ret is None
        else {
            "count": len(needles),
            "length": len(needles[0].ids),
            "depths": [round(n.depth, 3) for n in needles],
            "answer_tokens_ranked_first": round(ret["solved"], 4),
            "solved": ret["needles_solved"],
        },
        "thresholds": {"retrieval": RETRIEVAL, "induction": INDUCTION, "echo": ECHO},
    }


def _order(name: str) -> tuple[int, int]:
    layer, head = name[1:].split("H")
    return int(layer), int(head)


def grid(result: dict, key: str) -> Tensor:
    """``(layers, H)`` of ``key`` from a :func:`classify` result (NaN where a layer has fewer heads)."""
    layers, h = len(result["num_heads"]), max(result["num_heads"])
    out = torch.full((layers, h), math.nan)
    for t in result["heads"]:
        v = t[key]
        out[t["layer"], t["head"]] = math.nan if v is None else float(v)
    return out


def format_table(result: dict, model: str) -> str:
    """The classes in a few lines: retrieval heads with their scores, induction heads, the overlap, the split."""
    lines = [f"KV heads of {model}"]
    needles = result["needles"]
    if needles:
        lines.append(
            f"  needles: {needles['count']} prompts of {needles['length']} tokens; the model ranked the answer "
            f"first for {needles['answer_tokens_ranked_first']:.0%} of its tokens"
        )
        top = sorted(
            (t for t in result["heads"] if "retrieval" in t["roles"]), key=lambda t: -t["retrieval"]
        )  # strongest first
        total = sum(result["num_heads"])
        lines.append(
            f"  retrieval heads (score >= {RETRIEVAL}): {len(top)} of {total} ({len(top) / total:.1%}): "
            + (", ".join(f"L{t['layer']}H{t['head']} {t['retrieval']:.2f}" for t in top) or "none")
        )
    lines.append(
        f"  induction heads (prefix matching >= {INDUCTION}): {len(result['induction_heads'])}: "
        + (", ".join(result["induction_heads"]) or "none")
    )
    if needles:
        lines.append(f"  both: {len(result['both'])}: {', '.join(result['both']) or 'none'}")
    s = result["split"]
    n_full = sum(len(x) for x in s["full_heads"])
    n_kv = sum(result["num_kv_heads"])
    lines.append(
        f"  head-aware split ({s['score']} score, top {s['fraction']:.0%}): {n_full} of {n_kv} key/value heads keep "
        "every key, the rest sinks + a window"
        + (
            f"; {result['retrieval_in_full_groups']} of {len(result['retrieval_heads'])} retrieval heads sit in "
            "those groups"
            if needles
            else ""
        )
    )
    fit = result.get("gates")
    if fit:
        lines.append(
            f"  gates fitted by distillation in {fit['seconds']:.0f} s ({fit['settings']['steps']} steps; KL "
            f"{fit['losses'][0]:.4f} at the first step, {fit['losses'][-1]:.4f} at the last)"
        )
    return "\n".join(lines)


def plot(result: dict, stem: str | Path, model: str) -> list[Path]:
    """Three layer x head grids: the retrieval score (retrieval heads ringed), max(echo, induction) (induction
    heads ringed) and the split (1 = the head's key/value group keeps every key)."""
    from ...plotting import head_grids

    panels = []
    if result["needles"]:
        panels.append(("retrieval score (Wu et al.); ringed: >= 0.1", grid(result, "retrieval"), "retrieval"))
    both = torch.maximum(grid(result, "echo"), grid(result, "induction"))
    panels.append(("max(echo, induction), no data; ringed: induction", both, "induction"))
    if result.get("gates"):
        panels.append(("DuoAttention gate, fitted by distillation (1 = full attention)", grid(result, "gate"), None))
    kept = grid(result, "full_cache")
    panels.append((f"head-aware split: 1 = keeps every key ({result['split']['score']})", kept, None))
    rings = {
        key: [(t["layer"], t["head"]) for t in result["heads"] if key in t["roles"]]
        for key in ("retrieval", "induction")
    }
    return head_grids(
        [(title, scores, rings.get(key, []) if key else []) for title, scores, key in panels],
        stem,
        f"Which heads need the whole KV cache: {model}",
    )


def needles_for(lm, *, length: int, count: int, seed: int = 0, data: str = "imdb", depths=None, keys: int = 1):
    """``count`` needle prompts of ``length`` tokens for a loaded LM (``lm.encode``; the start token where its
    tokenizer adds one), the haystack from the fixed test split of ``data``; ``keys`` needles in each prompt
    (:func:`~multihead.data.needles.make_needles`)."""
    from ... import data as D
    from ...data.needles import make_needles

    limit = int(lm.model.config.max_len)
    if length > limit:
        raise ValueError(
            f"needles of {length} tokens are past the {limit} positions {lm.name} has: ask for --needle-len "
            f"{limit} or less"
        )
    texts = D.split(D.load(data), seed=0).test.texts
    start = lm.encode("")[:1]
    return make_needles(
        lambda t: lm.encode(t, special=False), texts, length=length, count=count, seed=seed, start=start, keys=keys
    )


def report(
    lm,
    out: str | Path | None,
    *,
    needles: int = 6,
    length: int = 2048,
    fraction: float = 0.25,
    score: str = "data-free",
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = False,
) -> dict:
    """:func:`classify` a loaded LM's heads on ``needles`` prompts of ``length`` tokens (0: data-free only) and,
    with ``out``, write ``kv-heads.json`` (the ``full_heads`` that ``multihead kv --heads`` reads) and
    ``kv-heads.png``/``.svg``."""
    import time

    from ..._io import Publish, atomic_write_json

    t0 = time.perf_counter()
    prompts = needles_for(lm, length=length, count=needles, seed=seed) if needles else []
    start = lm.bos_id if getattr(lm, "bos_id", None) is not None else 0
    result = classify(lm.model, prompts, fraction=fraction, score=score, start=start, progress=progress)
    result["model"] = lm.name
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if out is not None:
        with Publish(Path(out), "heads", overwrite=overwrite, sources=(str(lm.path),)) as folder:
            atomic_write_json(folder / "kv-heads.json", result)
            plot(result, folder / "kv-heads", lm.name)
    return result


def ranking(result: dict) -> list[list[float]]:
    """Each key/value head's score in a :func:`classify` result, by the score its split used: the fitted gates,
    the retrieval score or ``max(echo, induction)`` (the largest over the query heads that share it), so that a
    split at any other share can be drawn from it (:func:`split`)."""
    try:
        if result.get("gates"):
            return [[float(x) for x in row] for row in result["gates"]["gates"]]
        if result["split"]["score"] == "retrieval":
            scores = grid(result, "retrieval")
        else:
            scores = torch.maximum(grid(result, "echo"), grid(result, "induction"))
        return kv_head_scores(scores, result["num_kv_heads"])
    except (KeyError, TypeError, ValueError, IndexError):
        raise ValueError(
            "this kv-heads.json holds no per-head scores to rank by: write it with `multihead heads MODEL --kv`"
        ) from None


def read_split(path: str | Path) -> list[list[int]]:
    """The ``full_heads`` of a ``kv-heads.json`` written by :func:`report` (or a folder holding one), checked."""
    from ..._io import read_json_file

    p = Path(path)
    p = p / "kv-heads.json" if p.is_dir() else p
    if not p.is_file():
        raise ValueError(f"{p} does not exist: write it with `multihead heads MODEL --kv --out DIR`")
    data = read_json_file(p)  # its size checked before it is read
    try:
        heads = data["split"]["full_heads"]
    except (KeyError, TypeError):
        raise ValueError(
            f"{p} is not a kv-heads.json (no split.full_heads): write one with `multihead heads MODEL --kv`"
        ) from None
    from ...modules.kv import split_heads

    try:  # the one check of a split's shape, the policy's own
        return split_heads(heads)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None


def check_split(full_heads: list[list[int]], num_kv_heads: list[int], model: str) -> None:
    """Refuse a split made for another model (other layer count, or key/value heads it does not have), before any
    work is done."""
    if len(full_heads) != len(num_kv_heads) or any(h >= g for row, g in zip(full_heads, num_kv_heads) for h in row):
        raise ValueError(
            f"the head-aware split names {len(full_heads)} layers of key/value heads {full_heads[:3]}...; {model} has "
            f"{len(num_kv_heads)} layers of {sorted(set(num_kv_heads))} key/value heads: classify its heads with "
            f"`multihead heads {model} --kv`"
        )


__all__ = [
    "check_split",
    "classify",
    "kv_heads_per_layer",
    "needles_for",
    "read_split",
    "report",
    "echo_and_induction",
    "format_table",
    "kv_head_scores",
    "pattern_rows",
    "plot",
    "retrieval_scores",
    "split",
]
