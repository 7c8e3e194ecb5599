"""Accuracy against KV budget: every cache policy of :mod:`multihead.modules.kv` at several budgets, on
needle-in-a-haystack retrieval at long context and on perplexity of long held-out text, with the bytes each kept
cache holds and the decoding speed beside every point.

How each point is measured (the setting of SnapKV's and DuoAttention's decoding evaluations):

* the prompt is read once with every key (a *recorded* prefill, :meth:`KVCache.compress`), then cut to what the
  policy keeps at that budget -- one prefill serves every policy and budget, and equals a prefill under the policy;
* **needles**: the answer is decoded greedily from the compressed cache; a needle counts when every answer token
  is right (exact match), and the share of right tokens is kept too;
* **perplexity**: ``context`` tokens of held-out IMDB text are read, compressed, then ``tokens`` more are read one
  at a time through the compressed cache (which evicts as it goes), their next-token losses averaged; the time of
  those steps gives the decode tokens/s.

The bytes are the kept keys and values after the prompt (:meth:`KVCache.kv_nbytes`), and their share of the full
cache's.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ...modules.kv import KV_POLICIES, make_policy

# every registered policy that applies to a recorded prompt (head-aware and its kind need --heads)
POLICIES = tuple(n for n, cls in KV_POLICIES.items() if not cls.why_not("recorded"))
BUDGETS = (64, 128, 256, 512, 1024)
LENGTHS = (2048, 4096, 8192)


def settings(policies, budgets, full_heads) -> list[tuple[str, int | None]]:
    """Every (policy, budget) to measure: ``full`` once, the others at each budget."""
    out: list[tuple[str, int | None]] = []
    for name in policies:
        if name not in KV_POLICIES:
            raise ValueError(f"unknown KV policy {name!r}; choose from {', '.join(KV_POLICIES)}")
        if name not in POLICIES:
            raise ValueError(f"{KV_POLICIES[name].why_not('recorded')} (choose from {', '.join(POLICIES)})")
        if KV_POLICIES[name].needs_split and full_heads is None:
            raise ValueError(
                f"the {name} policy needs the retrieval heads: run `multihead heads MODEL --kv --out DIR` "
                f"and pass --heads DIR/kv-heads.json (or leave {name} out of --policies)"
            )
        if not KV_POLICIES[name].budgeted:
            out.append((name, None))
        else:
            out += [(name, b) for b in budgets]
    return out


def _policy(name: str, budget: int | None, full_heads):
    return make_policy(name, budget, **({"full_heads": full_heads} if KV_POLICIES[name].needs_split else {}))


@torch.no_grad()
def needle_points(model, needles, points, full_heads, *, progress: bool = False) -> dict:
    """``{(policy, budget): {"exact": k, "tokens": share, "kv_bytes": [...], "share": [...]}}`` over ``needles``."""
    from tqdm import tqdm

    out: dict = {p: {"exact": 0, "right": 0, "answer_tokens": 0, "kv_bytes": [], "share": []} for p in points}
    for n in tqdm(needles, desc=f"needles of {len(needles[0].ids)} tokens", leave=False, disable=not progress):
        recorded = model.new_cache(record=True)
        last = model(torch.tensor([n.ids]), cache=recorded)[:, -1]  # (1, V)
        full_bytes = recorded.kv_nbytes()
        for point in points:
            cache = recorded.compress(_policy(*point, full_heads))
            kept = cache.kv_nbytes()  # after the prompt, before the answer adds its keys
            got = _greedy(model, last, cache, len(n.answer))
            right = sum(int(a == b) for a, b in zip(got, n.answer))
            r = out[point]
            r["exact"] += int(right == len(n.answer))
            r["right"] += right
            r["answer_tokens"] += len(n.answer)
            r["kv_bytes"].append(kept)
            r["share"].append(kept / full_bytes)
    return out


def _greedy(model, logits, cache, steps: int) -> list[int]:
    tokens = []
    for i in range(steps):
        nxt = logits.argmax(-1)  # (1,)
        tokens.append(int(nxt))
        if i < steps - 1:
            logits = model.step(nxt, cache)
    return tokens


@torch.no_grad()
def perplexity_points(model, ids, context: int, points, full_heads, *, progress: bool = False) -> dict:
    """Per point: perplexity of ``ids[:, context:]`` read one token at a time after the first ``context`` tokens,
    decode tokens/s, the kept bytes after the context and at the end."""
    from tqdm import tqdm

    recorded = model.new_cache(record=True)
    first = model(ids[:, :context], cache=recorded)[:, -1]
    full_bytes = recorded.kv_nbytes()
    out = {}
    for point in tqdm(points, desc="perplexity", leave=False, disable=not progress):
        cache = recorded.compress(_policy(*point, full_heads))
        after_prompt = cache.kv_nbytes()
        logits, losses = first, []
        t0 = time.perf_counter()
        for t in range(context, ids.shape[1]):
            losses.append(float(F.cross_entropy(logits.float(), ids[:, t])))
            if t < ids.shape[1] - 1:
                logits = model.step(ids[:, t], cache)
        seconds = time.perf_counter() - t0
        out[point] = {
            "perplexity": math.exp(sum(losses) / len(losses)),
            "decode_tokens_per_s": (len(losses) - 1) / seconds,
            "kv_bytes": after_prompt,
            "share": after_prompt / full_bytes,
            "kv_bytes_at_end": cache.kv_nbytes(),
        }
    return out


def measure(
    lm,
    *,
    full_heads=None,
    policies=POLICIES,
    budgets=BUDGETS,
    lengths=LENGTHS,
    needles: int = 4,
    context: int = 2048,
    tokens: int = 256,
    seed: int = 1,
    progress: bool = False,
) -> dict:
    """Every policy at every budget on ``needles`` prompts per length and on perplexity (see the module docstring)."""
    from ...data.lm_text import held_out_rows
    from .heads import needles_for

    model = lm.model
    model.check_policy()  # native and attached models alike (an attached one through HF's cache API)
    limit = int(model.config.max_len)
    if context + tokens > limit:
        raise ValueError(f"--context {context} plus --tokens {tokens} is past the {limit} positions {lm.name} has")
    far = [n for n in lengths if n > limit]
    if far:
        raise ValueError(
            f"needles of {far} tokens are past the {limit} positions {lm.name} has: ask for --lengths {limit} or less"
        )
    points = settings(policies, budgets, full_heads)
    if full_heads is not None:
        from .heads import check_split

        from .heads import kv_heads_per_layer

        check_split(full_heads, kv_heads_per_layer(model), lm.name)
    t0 = time.perf_counter()
    result: dict = {"model": lm.name, "threads": torch.get_num_threads(), "needles": {}, "points": []}
    for length in lengths:
        n = min(length, limit - 16)  # at the model's last positions: room left for the answer
        prompts = needles_for(lm, length=n, count=needles, seed=seed)
        result["needles"][str(length)] = {"prompt_tokens": n, "count": needles}
        got = needle_points(model, prompts, points, full_heads, progress=progress)
        for (name, budget), r in got.items():
            result["points"].append(
                {
                    "policy": name,
                    "budget": budget,
                    "length": length,
                    "needles_exact": r["exact"],
                    "needles": needles,
                    "token_accuracy": round(r["right"] / r["answer_tokens"], 4),
                    "kv_bytes": round(sum(r["kv_bytes"]) / len(r["kv_bytes"])),
                    "share": round(sum(r["share"]) / len(r["share"]), 4),
                }
            )
    ids = held_out_rows(lm, rows=1, length=context + tokens, skip=0)
    ppl = perplexity_points(model, ids, context, points, full_heads, progress=progress)
    result["perplexity"] = {
        "context": context,
        "tokens": tokens,
        "points": [
            {"policy": name, "budget": budget, **{k: round(v, 4) for k, v in r.items()}}
            for (name, budget), r in ppl.items()
        ],
    }
    result["budgets"], result["policies"], result["lengths"] = list(budgets), list(policies), list(lengths)
    result["full_heads"] = full_heads
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


@torch.no_grad()
def needle_check(lm, *, length: int = 1024, budget: int = 128, fraction: float = 0.25, seed: int = 2) -> dict:
    """One needle of ``length`` tokens answered from three caches of the same prompt: the full one, a uniform window
    of ``budget`` keys per head, and the head-aware mix (the data-free split's heads whole, the others ``budget``
    keys): what the demo shows. Returns each cache's answer, whether it is right and its kept share of the bytes."""
    from .heads import echo_and_induction, kv_head_scores, kv_heads_per_layer, needles_for, split

    model = lm.model
    model.check_policy()
    start = lm.bos_id if getattr(lm, "bos_id", None) is not None else 0
    ei = echo_and_induction(model, half=32, batch=4, start=start)
    kv = kv_heads_per_layer(model)
    full_heads = split(kv_head_scores(torch.maximum(ei["echo"], ei["induction"]), kv), fraction)
    (needle,) = needles_for(lm, length=length, count=1, seed=seed, depths=[0.3])
    recorded = model.new_cache(record=True)
    last = model(torch.tensor([needle.ids]), cache=recorded)[:, -1]
    whole = recorded.kv_nbytes()
    out = {"length": length, "budget": budget, "number": needle.number, "full_heads": full_heads, "caches": {}}
    for name in ("full", "window", "head-aware"):
        cache = recorded.compress(_policy(name, None if name == "full" else budget, full_heads))
        share = cache.kv_nbytes() / whole  # after the prompt, before the answer adds its keys
        got = _greedy(model, last, cache, len(needle.answer))
        out["caches"][name] = {
            "answer": lm.decode(got).strip(),
            "right": got == needle.answer,
            "share": round(share, 4),
        }
    return out


def format_table(result: dict) -> str:
    """One line per policy and budget: needles solved per length with the kept share, then perplexity and speed."""
    ppl = {(p["policy"], p["budget"]): p for p in result["perplexity"]["points"]}
    lengths = result["lengths"]
    head = f"{'policy':<11}{'budget':>7}" + "".join(f"{f'{l} tok':>16}" for l in lengths)
    head += f"{'perplexity':>12}{'kept':>7}{'tok/s':>7}"
    lines = [
        f"KV policies on {result['model']}: needles exact (kept share of the full cache's bytes); perplexity of "
        f"{result['perplexity']['tokens']} tokens after {result['perplexity']['context']}",
        head,
    ]
    by = {(p["policy"], p["budget"], p["length"]): p for p in result["points"]}
    for (name, budget), p in ppl.items():
        row = f"{name:<11}{'all' if budget is None else budget:>7}"
        for l in lengths:
            n = by[name, budget, l]
            row += f"{n['needles_exact']:>6}/{n['needles']} ({n['share']:>5.1%})"
        row += f"{p['perplexity']:>12.2f}{p['share']:>7.1%}{p['decode_tokens_per_s']:>7.1f}"
        lines.append(row)
    return "\n".join(lines)


def plot(result: dict, stem: str | Path) -> list[Path]:
    """Needle accuracy per length and perplexity against the kept share of the full cache (log x), one line per
    policy (the full cache a star at 100%)."""
    from ...plotting import plain, pyplot, save

    plt = pyplot()
    lengths = result["lengths"]
    fig, axes = plt.subplots(1, len(lengths) + 1, figsize=(4.2 * (len(lengths) + 1), 3.8))
    policies = result["policies"]
    colors = {p: f"C{i}" for i, p in enumerate(policies)}
    for ax, length in zip(axes, lengths):
        for name in policies:
            pts = sorted(
                (p["share"], p["token_accuracy"], p["needles_exact"] / p["needles"])
                for p in result["points"]
                if p["policy"] == name and p["length"] == length
            )
            if not pts:
                continue
            xs, tok, exact = zip(*pts)
            style = "*" if name == "full" else "o-"
            ax.plot(xs, exact, style, color=colors[name], label=name, markersize=9 if name == "full" else 5)
            ax.plot(xs, tok, ":", color=colors[name], alpha=0.6)
        prompt = result["needles"][str(length)]["prompt_tokens"]
        ax.set_title(plain(f"needles of {prompt} tokens (solid: exact, dotted: tokens)"), fontsize=8)
        ax.set_xscale("log")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("kept share of the full cache's bytes")
        ax.set_ylabel("share right")
        ax.grid(alpha=0.3)
    ax = axes[-1]
    for name in policies:
        pts = sorted((p["share"], p["perplexity"]) for p in result["perplexity"]["points"] if p["policy"] == name)
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, "*" if name == "full" else "o-", color=colors[name], label=name)
    per = result["perplexity"]
    ax.set_title(plain(f"perplexity of {per['tokens']} tokens after {per['context']} (lower is better)"), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("kept share of the full cache's bytes")
    ax.set_ylabel("perplexity")
    ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(plain(f"KV cache policies on {result['model']}: accuracy against memory"), fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


def report(lm, out: str | Path, *, overwrite: bool = False, **options) -> dict:
    """:func:`measure`, then ``kv.json`` and ``kv.png``/``.svg`` in ``out`` (built aside, swapped in whole)."""
    from ..._io import Publish, atomic_write_json

    result = measure(lm, **options)
    with Publish(Path(out), "kv", overwrite=overwrite, sources=(str(lm.path),)) as folder:
        atomic_write_json(folder / "kv.json", result)
        plot(result, folder / "kv")
    return result


__all__ = ["BUDGETS", "LENGTHS", "POLICIES", "format_table", "measure", "plot", "report", "settings"]
