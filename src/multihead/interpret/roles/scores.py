"""Per-head statistics over a corpus sample, and role labels from stated rules.

For every head, averaged over all real query positions of all texts (row ``i`` of a text with ``n`` tokens):

* ``entropy`` -- ``-sum_j p_ij log p_ij`` in nats; ``entropy_norm`` divides by ``log n`` (1 = uniform);
* ``distance`` -- mean attention distance ``sum_j p_ij |i - j|`` in tokens;
* ``to_prev``, ``to_next``, ``to_self``, ``to_cls``, ``to_sep``, ``to_punct`` -- attention mass on the previous /
  next token, itself, [CLS], [SEP], punctuation;
* ``argmax_prev``, ``argmax_next``, ``argmax_self`` -- how often the row's top weight lies there.

Role rules, checked in this order (the first that holds names the head):

1. ``previous token`` / ``next token`` -- positional (Voita et al. 2019): the top weight is on that adjacent token
   for >= 90% of query positions;
2. ``self`` -- the top weight is on the query itself for >= 90% of positions;
3. ``delimiter sink`` (Clark et al. 2019): >= 50% of the mass goes to [CLS] and [SEP];
   ``first-token sink`` (Xiao et al. 2024, StreamingLLM): >= 50% of the mass goes to the first token (a causal LM's
   attention sink; ``to_first``), for models without [CLS]/[SEP];
4. ``punctuation`` -- >= 50% of the mass goes to punctuation tokens;
5. ``broad`` (Clark et al. 2019) -- mean normalised entropy >= 0.75 (close to uniform over the text);
6. ``mixed`` -- none of the above.
"""

from __future__ import annotations

from ..._io import Publish, atomic_write_json

import math
from pathlib import Path

import torch

from ...modules.capture import capture
from ..maps import AttentionMaps, Subject, is_punctuation

POSITIONAL = 0.9
SINK = 0.5
BROAD = 0.75
# "induction" is not read from text statistics: `multihead heads` on a causal LM sets it from the prefix-matching
# score on repeated random tokens (multihead.interpret.roles.induction), over whatever the text rules said.
ROLES = [
    "induction",
    "previous token",
    "next token",
    "self",
    "delimiter sink",
    "first-token sink",
    "punctuation",
    "broad",
    "mixed",
]
STATS = [
    "entropy",
    "entropy_norm",
    "distance",
    "to_prev",
    "to_next",
    "to_self",
    "to_cls",
    "to_sep",
    "to_first",
    "to_punct",
    "argmax_prev",
    "argmax_next",
    "argmax_self",
]


def _empty(heads: list[int]) -> list[list[dict]]:
    return [[{k: 0.0 for k in STATS} | {"_rows": 0, "_rows_prev": 0, "_rows_next": 0} for _ in range(h)] for h in heads]


def _add(sums: list[list[dict]], layer: int, per: dict, n: int) -> None:
    """Add one text's per-head sums (each ``(H,)``) over its ``n`` query rows to ``sums[layer]``."""
    for h, s in enumerate(sums[layer]):
        for k, v in per.items():
            s[k] += float(v[h])
        s["_rows"] += n
        s["_rows_prev"] += n - 1
        s["_rows_next"] += n - 1


def _means(sums: list[list[dict]]) -> list[list[dict]]:
    out = []
    for layer in sums:
        row = []
        for s in layer:
            d = {}
            for k in STATS:
                denom = s["_rows_prev"] if k == "argmax_prev" else s["_rows_next"] if k == "argmax_next" else s["_rows"]
                d[k] = s[k] / max(1, denom)
            row.append(d)
        out.append(row)
    return out


def _token_sets(tokens: list[str]) -> dict[str, torch.Tensor]:
    return {
        "cls": torch.tensor([t == "[CLS]" for t in tokens]),
        "sep": torch.tensor([t == "[SEP]" for t in tokens]),
        "first": torch.arange(len(tokens)) == 0,
        "punct": torch.tensor([is_punctuation(t) for t in tokens]),
    }


def head_stats(corpus: list[AttentionMaps]) -> list[list[dict]]:
    """``stats[layer][head]`` -> dict of :data:`STATS` averaged over every real query position of ``corpus``."""
    if not corpus:
        raise ValueError("head statistics need at least one text")
    sums = _empty(corpus[0].heads)
    for maps in corpus:
        n = len(maps.tokens)
        if n < 2:
            continue
        idx = torch.arange(n)
        dist = (idx[:, None] - idx[None, :]).abs().float()  # (L, L)
        sets = _token_sets(maps.tokens)
        for l, w in enumerate(maps.layers):  # (H, L, L)
            p = w.float().clamp_min(0)
            ent = -(p * p.clamp_min(1e-12).log()).sum(-1)  # (H, L)
            top = p.argmax(-1)  # (H, L)
            prev = torch.diagonal(p, offset=-1, dim1=1, dim2=2)  # (H, L-1): row i -> key i-1
            nxt = torch.diagonal(p, offset=1, dim1=1, dim2=2)  # (H, L-1): row i -> key i+1
            _add(
                sums,
                l,
                {
                    "entropy": ent.sum(-1),
                    "entropy_norm": ent.sum(-1) / math.log(n),
                    "distance": (p * dist).sum(-1).sum(-1),
                    "to_prev": prev.sum(-1),
                    "to_next": nxt.sum(-1),
                    "to_self": torch.diagonal(p, dim1=1, dim2=2).sum(-1),
                    "to_cls": p[..., sets["cls"]].sum((-1, -2)),
                    "to_sep": p[..., sets["sep"]].sum((-1, -2)),
                    "to_first": p[..., 0].sum(-1),
                    "to_punct": p[..., sets["punct"]].sum((-1, -2)),
                    "argmax_prev": (top[:, 1:] == idx[1:] - 1).float().sum(-1),
                    "argmax_next": (top[:, :-1] == idx[:-1] + 1).float().sum(-1),
                    "argmax_self": (top == idx).float().sum(-1),
                },
                n,
            )
    return _means(sums)


STATS_OPTIONS = {"topk": 1, "offsets": (-1, 0, 1)}  # what head_stats_from_stats reads (sets: per batch, below)


def stats_options(token_rows: list[list[str]], length: int) -> dict:
    """``capture(..., stats=...)`` options for a batch whose row ``r`` holds ``token_rows[r]`` (then padding): the
    key sets [CLS], [SEP] and punctuation as ``(B, length)`` bool, top-1 and the offsets -1, 0, +1."""
    sets = {k: torch.zeros(len(token_rows), length, dtype=torch.bool) for k in ("cls", "sep", "first", "punct")}
    for r, tokens in enumerate(token_rows):
        for k, v in _token_sets(tokens).items():
            sets[k][r, : len(tokens)] = v
    return {**STATS_OPTIONS, "sets": sets}


def head_stats_from_stats(records) -> list[list[dict]]:
    """:func:`head_stats` from exact statistics (:func:`multihead.attention.stats.attention_stats`, options from
    :func:`stats_options`) instead of maps: ``records`` yields ``(n, [AttentionStats per layer], row)`` for a text of
    ``n`` real tokens at batch row ``row``. Runs on inputs whose maps would not fit."""
    sums = None
    for n, layers, r in records:
        if sums is None:
            sums = _empty([st.entropy.shape[1] for st in layers])
        if n < 2:
            continue
        idx = torch.arange(n)
        for l, st in enumerate(layers):
            ent = st.entropy[r, :, :n].float()  # (H, n)
            top = st.topk_index[r, :, :n, 0]  # (H, n)
            m = {k: v[r, :, :n].float() for k, v in st.mass.items()}
            _add(
                sums,
                l,
                {
                    "entropy": ent.sum(-1),
                    "entropy_norm": ent.sum(-1) / math.log(n),
                    "distance": st.distance[r, :, :n].float().sum(-1),
                    "to_prev": m["offset-1"].sum(-1),
                    "to_next": m["offset+1"][:, : n - 1].sum(-1),
                    "to_self": m["offset+0"].sum(-1),
                    "to_cls": m["cls"].sum(-1),
                    "to_sep": m["sep"].sum(-1),
                    "to_first": m["first"].sum(-1),
                    "to_punct": m["punct"].sum(-1),
                    "argmax_prev": (top[:, 1:] == idx[1:] - 1).float().sum(-1),
                    "argmax_next": (top[:, :-1] == idx[:-1] + 1).float().sum(-1),
                    "argmax_self": (top == idx).float().sum(-1),
                },
                n,
            )
    if sums is None:
        raise ValueError("head statistics need at least one text")
    return _means(sums)


def role(s: dict) -> str:
    """The role of one head from its statistics; rules in the module docstring."""
    if s["argmax_prev"] >= POSITIONAL:
        return "previous token"
    if s["argmax_next"] >= POSITIONAL:
        return "next token"
    if s["argmax_self"] >= POSITIONAL:
        return "self"
    if s["to_cls"] + s["to_sep"] >= SINK:
        return "delimiter sink"
    if s.get("to_first", 0.0) >= SINK:
        return "first-token sink"
    if s["to_punct"] >= SINK:
        return "punctuation"
    if s["entropy_norm"] >= BROAD:
        return "broad"
    return "mixed"


def analyse(corpus: list[AttentionMaps]) -> dict:
    return summarise(head_stats(corpus), corpus[0].model, len(corpus), sum(len(m.tokens) for m in corpus))


def summarise(stats: list[list[dict]], model: str, texts: int, tokens: int, source: str = "maps") -> dict:
    """Roles and counts from per-head statistics (from maps or from :func:`head_stats_from_stats`)."""
    heads = [
        {"layer": l, "head": h, "role": role(s), **{k: round(v, 4) for k, v in s.items()}}
        for l, layer in enumerate(stats)
        for h, s in enumerate(layer)
    ]
    counts = {r: sum(1 for x in heads if x["role"] == r) for r in ROLES}
    return {
        "model": model,
        "texts": texts,
        "tokens": tokens,
        "computed_from": source,
        "rules": {"positional": POSITIONAL, "sink": SINK, "broad": BROAD},
        "counts": counts,
        "heads": heads,
    }


COLUMNS = [  # (header, key, width, meaning)
    ("entropy", "entropy", 8, "entropy of a query's weights (nats)"),
    ("norm", "entropy_norm", 6, "entropy / its maximum (1: uniform)"),
    ("dist", "distance", 8, "mean distance to the keys attended (tokens)"),
    ("prev", "to_prev", 6, "weight on the previous token"),
    ("next", "to_next", 6, "on the next token"),
    ("self", "to_self", 6, "on itself"),
    ("cls", "to_cls", 6, "on [CLS]"),
    ("sep", "to_sep", 6, "on [SEP]"),
    ("first", "to_first", 6, "on the first token"),
    ("punct", "to_punct", 6, "on punctuation"),
    ("top=prev", "argmax_prev", 9, "share of queries whose strongest key is the previous token"),
    ("top=next", "argmax_next", 9, "the same for the next token"),
]
MAX_ROWS = 60  # more heads than this: each role's heads listed, the full table in heads.json


def format_table(result: dict) -> str:
    """The roles as text: one row per head (columns that are 0 for every head, such as [CLS] and [SEP] in a model
    without them, left out; their meanings on the first line), or, for more than :data:`MAX_ROWS` heads, each role
    with its heads."""
    heads = result["heads"]
    cols = [c for c in COLUMNS if any(abs(x.get(c[1], 0.0)) > 0 for x in heads)]
    first = f"{result['model']}: {result['texts']} texts, {result['tokens']} tokens; roles: " + ", ".join(
        f"{r} {c}" for r, c in result["counts"].items() if c
    )
    if len(heads) > MAX_ROWS:
        lines = [first + f" ({len(heads)} heads: each role's heads below; every measure of every head in heads.json)"]
        for role in ROLES:
            found = [f"L{x['layer']}H{x['head']}" for x in heads if x["role"] == role]
            if found:
                shown = ", ".join(found[:24]) + (f" ... and {len(found) - 24} more" if len(found) > 24 else "")
                lines.append(f"  {role:<17} {len(found):>3}: {shown}")
        return "\n".join(lines)
    lines = [
        first + "; columns: " + "; ".join(f"{h}: {m}" for h, _, _, m in cols),
        f"{'layer':>5} {'head':>4}  {'role':<17}" + "".join(f"{h:>{w}}" for h, _, w, _ in cols),
    ]
    for x in heads:
        lines.append(
            f"{x['layer']:>5} {x['head']:>4}  {x['role']:<17}"
            + "".join(f"{x.get(k, 0.0):>{w}.2f}" for _, k, w, _ in cols)
        )
    return "\n".join(lines)


def plot_roles(result: dict, stem: Path) -> list[Path]:
    """Layers x heads: role colours with the role written in, beside mean normalised entropy and distance."""
    from ...plotting import pyplot

    plt = pyplot()
    from matplotlib.colors import ListedColormap

    from ...plotting import plain, save as _save

    layers = 1 + max(x["layer"] for x in result["heads"])
    cols = 1 + max(x["head"] for x in result["heads"])
    grid = torch.full((layers, cols), float("nan"))
    ent = torch.full((layers, cols), float("nan"))
    dist = torch.full((layers, cols), float("nan"))
    for x in result["heads"]:
        grid[x["layer"], x["head"]] = ROLES.index(x["role"])
        ent[x["layer"], x["head"]] = x["entropy_norm"]
        dist[x["layer"], x["head"]] = x["distance"]
    colours = ["#1f77b4", "#17becf", "#9467bd", "#d62728", "#ff7f0e", "#2ca02c", "#c7c7c7"]
    fig, axes = plt.subplots(
        1, 3, figsize=(3 * max(4, 0.6 * cols) + 2, 0.7 * layers + 2.5), gridspec_kw={"width_ratios": [1.4, 1, 1]}
    )
    axes[0].imshow(grid.numpy(), cmap=ListedColormap(colours), vmin=-0.5, vmax=len(ROLES) - 0.5, aspect="auto")
    label_size = 9 if cols <= 12 else 7  # readable in the saved picture at its own size (cells are ~0.8 in wide)
    for x in result["heads"]:
        short = {"previous token": "prev", "next token": "next", "delimiter sink": "sink", "punctuation": "punct"}
        axes[0].text(
            x["head"], x["layer"], short.get(x["role"], x["role"]), ha="center", va="center", fontsize=label_size
        )
    axes[0].set_title("role (rules in multihead.interpret.roles.scores)", fontsize=10)
    for ax, data, title, cmap in (
        (axes[1], ent, "mean normalised entropy", "viridis"),
        (axes[2], dist, "mean attention distance (tokens)", "magma"),
    ):
        im = ax.imshow(data.numpy(), cmap=cmap, aspect="auto")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        ax.set_title(title, fontsize=10)
    for ax in axes:
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(cols))
        ax.set_yticks(range(layers))
    fig.suptitle(f"{plain(result['model'])}: {result['texts']} texts, {result['tokens']} tokens", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # half an inch for the title above the panels
    return _save(fig, stem)


def write(result: dict, out: Path, *, overwrite: bool = False) -> list[Path]:
    """``heads.json`` and ``heads.{png,svg}`` in ``out``, built aside and swapped in whole."""
    target = Path(out)
    with Publish(target, "heads", overwrite=overwrite) as folder:
        atomic_write_json(folder / "heads.json", result)
        files = [folder / "heads.json", *plot_roles(result, folder / "heads")]
    return [target / f.name for f in files]


def subject_head_stats(subject: Subject, texts: list[str], batch_size: int = 32) -> tuple[list[list[dict]], int]:
    """Per-head statistics (:func:`multihead.interpret.roles.scores.head_stats`'s) of ``texts`` computed from exact
    statistics captured on the model's own attention path (``capture(..., ("stats",))``): no ``L x L`` map is built,
    so it runs on inputs whose maps would not fit. Returns the statistics and the number of real tokens."""
    subject.model.eval()
    records, tokens = [], 0
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            ids, keep = subject.encode(chunk)
            rows = [subject.display(ids[r, : int(keep[r].sum())].tolist())[0] for r in range(len(chunk))]
            with capture(subject.model, ("stats",), stats=stats_options(rows, ids.shape[1])) as cache:
                subject.model(ids, keep)
            layers = [cache.stats(i) for i in range(len(cache.attention_modules))]
            records += [(len(r), layers, i) for i, r in enumerate(rows)]
            tokens += sum(len(r) for r in rows)
    return head_stats_from_stats(records), tokens


__all__ = [
    "ROLES",
    "STATS",
    "analyse",
    "format_table",
    "head_stats",
    "plot_roles",
    "role",
    "subject_head_stats",
    "write",
]
