"""Two circuits of the literature, looked for in any causal LM with the interventions of
:mod:`multihead.interpret.causal.patching` (``multihead circuit induction|ioi MODEL``):

* **Induction circuit** (Elhage et al. 2021; Olsson et al. 2022): on ``s r_1 .. r_n r_1 .. r_n`` (random tokens
  repeated once), *previous-token heads* (whose weight sits on the key just before the query) feed *induction
  heads* (prefix-matching score >= :data:`~multihead.interpret.roles.induction.INDUCTION`) through the induction heads'
  keys (K-composition). Measured by :func:`~multihead.interpret.causal.patching.path_patching` from the previous-token heads
  (their ``z`` resampled from another random sequence) into the induction heads' ``q``, ``k`` or ``v`` input, on
  the mean log-probability of the repeated half's predictable tokens; beside it, the senders and the induction
  heads resampled outright and the first half's log-probability (no copying possible).
* **Indirect object identification** (Wang et al. 2022): "When Mary and John went to the store, John gave a drink
  to" -> " Mary". Metric: ``logit(IO) - logit(S)`` at the last position; corrupted prompts replace the repeated
  subject (S2) by a third name (so the model cannot know which name repeated). Every head is patched clean ->
  corrupted (exact activation patching, and attribution patching beside it); direct logit attribution says which
  heads write the answer themselves (*name movers*, and *negative name movers* writing against it); path
  patching from every earlier head into the name movers' queries finds the heads that steer them (the paper's
  *S-inhibition* heads), and from every earlier head into those heads' values the heads they read at S2 (the
  paper's *duplicate-token* and *induction* heads); the attention of each kind at the positions the paper names
  is reported beside it.

:func:`induction_circuit` takes any CausalLM; :func:`ioi` a :class:`multihead.lm.PretrainedLM` (or anything with
``model`` and ``encode(text, special=)``). Both return plain dicts that :func:`plot_induction` / :func:`plot_ioi`
draw.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import Tensor

from . import patching as P
from ..roles.induction import INDUCTION, prefix_matching, repeated_tokens
from ...modules.capture import capture
from ...plotting import SIGNED, plain, pyplot, save

PREVIOUS = 0.4  # a previous-token head puts at least this mean weight on the key just before the query

NAMES = [
    "Mary",
    "John",
    "Emma",
    "Paul",
    "Sarah",
    "Anna",
    "Tom",
    "James",
    "Alice",
    "David",
    "Kate",
    "Bob",
    "Lisa",
    "Mark",
    "Laura",
    "Peter",
    "Jane",
    "Mike",
    "Amy",
    "Chris",
]
TEMPLATES = [
    "When {A} and {B} went to the store, {S} gave a drink to",
    "After {A} and {B} went to the park, {S} gave a ball to",
    "While {A} and {B} were working at the office, {S} handed a letter to",
    "Then, {A} and {B} had a long argument, and afterwards {S} said to",
    "When {A} and {B} got a snack at the cafe, {S} decided to give it to",
    "Friends {A} and {B} found a bone at the garden. {S} gave it to",
]


def _heads(mask: Tensor) -> list[tuple[int, int]]:
    return [(int(l), int(h)) for l, h in mask.nonzero().tolist()]


def _as_dict(heads: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for l, h in heads:
        out.setdefault(l, []).append(h)
    return out


# ---------------------------------------------------------------------------------------------------- induction
def _logprob(ids: Tensor, part: slice) -> Callable[[Tensor], Tensor]:
    """Mean log-probability of the tokens ``ids[:, part]`` (predicted from the position before each), per row."""
    target = ids[:, part]
    shift = slice(part.start - 1, part.stop - 1)

    def metric(logits: Tensor) -> Tensor:
        lp = logits[:, shift].float().log_softmax(-1)
        return lp.gather(-1, target.expand(lp.shape[0], -1)[..., None])[..., 0].mean(-1)

    return metric


@torch.no_grad()
def induction_circuit(
    model,
    *,
    start: int,
    low: int = 0,
    high: int | None = None,
    half: int = 32,
    sequences: int = 4,
    threshold: float = INDUCTION,
    previous: float = PREVIOUS,
    senders: list[tuple[int, int]] | None = None,
    receivers: list[tuple[int, int]] | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """The K-composition check of the induction circuit (see the module docstring) of a CausalLM on ``sequences``
    seeded sequences: ``start``, then ``half`` tokens drawn from ``[low, high)`` (default: the whole vocabulary),
    repeated once. Receivers are the heads with a prefix-matching score >= ``threshold``, senders the heads before
    the first receiver with a previous-token score >= ``previous`` (or the heads given). Returns the scores, the
    senders and receivers with their scores, the per-sequence log-probabilities and their means, and each sender's
    own path effect through the keys."""
    from tqdm import tqdm

    model = model.eval()
    high = model.config.vocab_size if high is None else high
    g = torch.Generator().manual_seed(seed)
    ids = repeated_tokens(2 * sequences, half, low=low, high=high, start=start, generator=g)
    with capture(model, ("pattern",)) as cache:
        model(ids[:sequences])
    patterns = cache.patterns()
    prefix = prefix_matching(patterns, half)
    prev = torch.stack([p.diagonal(-1, -2, -1)[..., 1:].mean((0, -1)) for p in patterns])  # (layers, H)
    receivers = _heads(prefix >= threshold) if receivers is None else [(int(l), int(h)) for l, h in receivers]
    if not receivers:
        raise ValueError(
            f"no head of this model has a prefix-matching score >= {threshold} (best "
            f"{float(prefix.max()):.2f}): it has no induction heads to look into"
        )
    first = min(l for l, _ in receivers)
    if senders is None:
        senders = [(l, h) for l, h in _heads(prev >= previous) if l < first]
    senders = [(int(l), int(h)) for l, h in senders]
    if not senders:
        raise ValueError(
            f"no head before layer {first} (the first induction head) puts >= {previous} of its weight "
            "on the previous token"
        )
    send, recv = _as_dict(senders), _as_dict(receivers)
    rows, per_sender = [], []
    for i in tqdm(range(sequences), desc="induction circuit", disable=not progress):
        original, new = ids[i : i + 1], ids[sequences + i : sequences + i + 1]  # new: another random sequence
        metric = _logprob(original, slice(half + 2, 2 * half + 1))
        row = {}
        for path in ("q", "k", "v"):
            r = P.path_patching(model, original, new, metric, senders=send, receivers=recv, through=path)
            row["original"], row[path] = r["original"], r["patched"]
        for name, heads in (("senders_resampled", send), ("induction_resampled", recv)):
            with P.ablated(model, heads, "resample", reference=new):
                row[name] = float(metric(model(original))[0])
        row["first_half"] = float(_logprob(original, slice(2, half + 1))(model(original))[0])
        rows.append(row)
        per_sender.append(
            P.path_patching_each(model, original, new, metric, receivers=recv, through="k", senders=senders)["effect"]
        )
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    each = torch.stack(per_sender).mean(0)
    return {
        "half": half,
        "sequences": sequences,
        "seed": seed,
        "rule": {
            "receivers": f"prefix-matching score >= {threshold}",
            "senders": f"previous-token score >= {previous}, before layer {first}",
            "metric": "mean log-probability of the repeated half's tokens r_2..r_n",
        },
        "prefix_matching": prefix.tolist(),
        "previous_token": prev.tolist(),
        "senders": [[l, h, float(prev[l, h])] for l, h in senders],
        "receivers": [[l, h, float(prefix[l, h])] for l, h in receivers],
        "rows": rows,
        "mean": mean,
        "sender_through_k": [[l, h, float(each[l, h])] for l, h in senders],
    }


def format_induction(r: dict) -> str:
    m = r["mean"]
    gain = m["original"] - m["first_half"]
    lines = [
        "previous-token heads (senders): " + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in r["senders"]),
        "induction heads (receivers):     " + ", ".join(f"L{l}H{h} {s:.2f}" for l, h, s in r["receivers"]),
        f"mean log-probability of the repeated half over {r['sequences']} sequences of 2 x {r['half']} tokens:",
        f"  original {m['original']:.2f}; first half (nothing to copy) {m['first_half']:.2f}: copying gain "
        f"{gain:.2f} nats",
    ]
    for key, what in (
        ("q", "senders -> induction heads' queries"),
        ("k", "senders -> induction heads' keys"),
        ("v", "senders -> induction heads' values"),
        ("senders_resampled", "senders resampled"),
        ("induction_resampled", "induction heads resampled"),
    ):
        lines.append(
            f"  {what:<38} {m[key]:7.2f}  ({m[key] - m['original']:+.2f}, "
            f"{(m['original'] - m[key]) / gain:.0%} of the gain)"
        )
    top = sorted(r["sender_through_k"], key=lambda t: t[2])[:5]
    lines.append("  each sender alone through the keys: " + ", ".join(f"L{l}H{h} {v:+.2f}" for l, h, v in top))
    return "\n".join(lines)


def plot_induction(r: dict, path, title: str) -> None:
    """The log-probabilities of the path-patching runs (bars), and each sender's own path effect through the keys;
    ``path`` without suffix (PNG and SVG are written)."""
    plt = pyplot()
    m = r["mean"]
    keys = ["original", "q", "k", "v", "senders_resampled", "induction_resampled", "first_half"]
    labels = [
        "original",
        "path via\nqueries",
        "path via\nkeys",
        "path via\nvalues",
        "previous-token\nheads resampled",
        "induction heads\nresampled",
        "first half\n(no copying)",
    ]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    colors = ["#4c72b0", "#8c8c8c", "#c44e52", "#8c8c8c", "#dd8452", "#dd8452", "#55a868"]
    a.bar(range(len(keys)), [m[k] for k in keys], color=colors)
    a.set_xticks(range(len(keys)), labels, fontsize=8)
    a.set_ylabel("mean log-probability of repeated tokens (nats)")
    a.set_title("previous-token heads -> induction heads, path patched")
    a.axhline(0, color="black", lw=0.5)
    send = sorted(r["sender_through_k"], key=lambda t: t[2])
    b.barh([f"L{l}H{h}" for l, h, _ in send], [v for _, _, v in send], color="#c44e52")
    b.invert_yaxis()
    b.set_xlabel("change in log-probability (nats)")
    b.set_title("each previous-token head alone, via keys")
    fig.suptitle(plain(title))
    fig.tight_layout()
    save(fig, path)


# ---------------------------------------------------------------------------------------------------- IOI
def ioi_prompts(lm, n: int = 16, *, seed: int = 0, names=NAMES, templates=TEMPLATES) -> list[dict]:
    """``n`` IOI pairs ``{clean, corrupt, answer, wrong, template}`` from ``templates`` and the ``names`` that are one
    token (after a space) for ``lm``'s tokenizer: clean ``A``/``B``/``S=B``, corrupted ``S=C``; answer " A",
    wrong " B". Templates are used in turn, names drawn without repeats within a prompt (seeded)."""
    single = [x for x in names if len(lm.encode(" " + x, special=False)) == 1]
    if len(single) < 3:
        raise ValueError(f"fewer than 3 of the names are one token for this tokenizer ({single}); pass names= that are")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b, c = rng.sample(single, 3)
        t = templates[i % len(templates)]
        out.append(
            {
                "clean": t.format(A=a, B=b, S=b),
                "corrupt": t.format(A=a, B=b, S=c),
                "answer": " " + a,
                "wrong": " " + b,
                "template": t,
            }
        )
    return out


def _positions(ids: list[int], io: int, s: int) -> dict:
    """Token positions of IO, S1, S2 and END in one prompt."""
    s_at = [i for i, t in enumerate(ids) if t == s]
    io_at = [i for i, t in enumerate(ids) if t == io]
    if len(s_at) != 2 or len(io_at) != 1:
        raise ValueError(
            f"an IOI prompt holds the subject twice and the indirect object once; found {len(s_at)} and "
            f"{len(io_at)} (a name split into several tokens, or in the template)"
        )
    return {"IO": io_at[0], "S1": s_at[0], "S2": s_at[1], "END": len(ids) - 1}


def _top(scores: Tensor, k: int, sign: float = 1.0) -> list[tuple[int, int]]:
    flat = (scores * sign).nan_to_num(float("-inf")).flatten()
    idx = flat.argsort(descending=True)[:k]
    width = scores.shape[1]
    return [(int(i) // width, int(i) % width) for i in idx if flat[i] > 0]


@torch.no_grad()
def ioi(
    lm,
    *,
    pairs: int = 16,
    seed: int = 0,
    movers: int = 3,
    inhibitors: int = 4,
    batch_size: int = 32,
    progress: bool = False,
) -> dict:
    """The IOI circuit of ``lm`` (see the module docstring), averaged over ``pairs`` prompts. Returns the logit
    differences, every head's exact and attribution-patching effect, its direct logit attribution, the attention
    scores at the paper's positions, the heads of each class found here and the path-patching effects that found
    them."""
    from tqdm import tqdm

    model = lm.model.eval()
    prompts = ioi_prompts(lm, pairs, seed=seed)
    enc = []
    for p in prompts:
        clean, corrupt = lm.encode(p["clean"]), lm.encode(p["corrupt"])
        io, s = lm.encode(p["answer"], special=False)[0], lm.encode(p["wrong"], special=False)[0]
        enc.append((torch.tensor([clean]), torch.tensor([corrupt]), io, s, _positions(clean, io, s)))
    patched = P.patch_pairs(
        model,
        [(clean, corrupt, P.logit_diff(io, s)) for clean, corrupt, io, s, _ in enc],
        batch_size=batch_size,
        progress=progress,
        desc="IOI stage 1 of 3: every head patched",
    )
    diffs = [(v["clean"], v["corrupt"]) for v in patched["per_pair"]]
    dla, attn = [], []
    for clean, _, io, s, pos in enc:
        dla.append(P.direct_logit_attribution(model, clean, io, s)["heads"])
        with capture(model, ("pattern",)) as cache:
            model(clean)
        pats = torch.stack([p[0] for p in cache.patterns()])  # (layers, H, L, L)
        attn.append(
            {
                "END->IO": pats[..., pos["END"], pos["IO"]],
                "END->S2": pats[..., pos["END"], pos["S2"]],
                "S2->S1": pats[..., pos["S2"], pos["S1"]],
                "S2->S1+1": pats[..., pos["S2"], pos["S1"] + 1],
            }
        )
    exact_m, approx_m, dla_m = patched["effect"], patched["attribution"], torch.stack(dla).mean(0)
    attn_m = {k: torch.stack([a[k] for a in attn]).mean(0) for k in attn[0]}
    clean_diff = sum(d[0] for d in diffs) / len(diffs)
    name_movers = _top(dla_m, movers)
    negative = _top(dla_m, max(1, movers - 1), sign=-1.0)
    # who steers the name movers (through their queries), and who those heads read (through their values)
    path_q = []
    for clean, corrupt, io, s, _ in tqdm(
        enc, desc="IOI stage 2 of 3: path patching into the name movers", disable=not progress
    ):
        path_q.append(
            P.path_patching_each(
                model,
                clean,
                corrupt,
                P.logit_diff(io, s),
                receivers=_as_dict(name_movers),
                through="q",
                batch_size=batch_size,
            )["effect"]
        )
    path_q_m = torch.stack(path_q).mean(0)
    s_inhibition = _top(path_q_m, inhibitors, sign=-1.0)  # senders whose corruption lowers the logit difference most
    path_v_m = None
    readers: list[tuple[int, int]] = []
    if s_inhibition:
        path_v = []
        for clean, corrupt, io, s, _ in tqdm(
            enc, desc="IOI stage 3 of 3: path patching into the S-inhibition heads", disable=not progress
        ):
            path_v.append(
                P.path_patching_each(
                    model,
                    clean,
                    corrupt,
                    P.logit_diff(io, s),
                    receivers=_as_dict(s_inhibition),
                    through="v",
                    batch_size=batch_size,
                )["effect"]
            )
        path_v_m = torch.stack(path_v).mean(0)
        readers = _top(path_v_m, inhibitors, sign=-1.0)
    flat = torch.stack([exact_m.flatten(), approx_m.flatten()])
    keep = ~flat.isnan().any(0)

    def named(heads):
        return [
            {
                "layer": l,
                "head": h,
                "exact": float(exact_m[l, h]),
                "attribution": float(approx_m[l, h]),
                "direct": float(dla_m[l, h]),
                **{k: float(v[l, h]) for k, v in attn_m.items()},
                "path_q": float(path_q_m[l, h]) if not path_q_m[l, h].isnan() else None,
                "path_v": float(path_v_m[l, h]) if path_v_m is not None and not path_v_m[l, h].isnan() else None,
            }
            for l, h in heads
        ]

    disagree = (exact_m - approx_m).abs().nan_to_num(0).flatten().argsort(descending=True)[:5]
    width = exact_m.shape[1]
    return {
        "pairs": prompts,
        "seed": seed,
        "logit_diff": {"clean": clean_diff, "corrupt": sum(d[1] for d in diffs) / len(diffs)},
        "effect": exact_m.tolist(),
        "attribution": approx_m.tolist(),
        "direct": dla_m.tolist(),
        "attention": {k: v.tolist() for k, v in attn_m.items()},
        "path_into_name_movers_q": path_q_m.tolist(),
        "path_into_s_inhibition_v": None if path_v_m is None else path_v_m.tolist(),
        "correlation": float(torch.corrcoef(flat[:, keep])[0, 1]),
        "disagreements": [
            [int(i) // width, int(i) % width, float(exact_m.flatten()[i]), float(approx_m.flatten()[i])]
            for i in disagree
        ],
        "name_movers": named(name_movers),
        "negative_name_movers": named(negative),
        "s_inhibition": named(s_inhibition),
        "read_by_s_inhibition": named(readers),
        "rule": {
            "effect": "logit diff (IO - S) of the corrupted run with the head's clean z, minus the corrupted run's",
            "name movers": f"the {movers} heads of highest direct logit attribution",
            "negative name movers": "the heads of lowest (negative) direct logit attribution",
            "s_inhibition": f"the {inhibitors} earlier heads whose corrupted z, path patched into the name "
            "movers' queries, lowers the logit difference most",
            "read_by_s_inhibition": "the same, into the S-inhibition heads' values",
        },
    }


def format_ioi(r: dict) -> str:
    ld = r["logit_diff"]
    lines = [
        f"IOI over {len(r['pairs'])} prompts: logit difference IO - S {ld['clean']:.2f} clean, {ld['corrupt']:.2f} "
        "corrupted (S2 replaced by a third name)",
        f"attribution vs exact patching over every head: correlation {r['correlation']:.2f}; largest "
        "disagreements " + ", ".join(f"L{l}H{h} {e:+.2f} exact vs {a:+.2f}" for l, h, e, a in r["disagreements"][:3]),
    ]
    for key, what, cols in (
        ("name_movers", "name movers", ("direct", "exact", "END->IO", "END->S2")),
        ("negative_name_movers", "negative name movers", ("direct", "exact", "END->IO", "END->S2")),
        ("s_inhibition", "S-inhibition (path into name movers' queries)", ("path_q", "exact", "direct", "END->S2")),
        (
            "read_by_s_inhibition",
            "read by S-inhibition (path into their values)",
            ("path_v", "exact", "S2->S1", "S2->S1+1"),
        ),
    ):
        lines.append(f"{what}:")
        for h in r[key]:
            lines.append(
                f"  L{h['layer']}H{h['head']}  "
                + "  ".join(f"{c} {h[c]:+.2f}" if h[c] is not None else f"{c} -" for c in cols)
            )
    return "\n".join(lines)


def plot_ioi(r: dict, path, title: str) -> None:
    """Exact patching, attribution patching, direct logit attribution and the path effect into the name movers'
    queries, layers x heads, one diverging colour scale each."""
    plt = pyplot()
    panels = [
        ("effect", "activation patching (exact)"),
        ("attribution", "attribution patching"),
        ("direct", "direct logit attribution"),
        ("path_into_name_movers_q", "path patching into name movers' q"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(16, 6))
    for ax, (key, what) in zip(axes, panels):
        grid = torch.tensor(r[key])
        lim = float(grid.nan_to_num(0).abs().max()) or 1.0
        im = ax.imshow(grid, cmap=SIGNED, vmin=-lim, vmax=lim, aspect="auto")  # red helps, blue hurts
        ax.set_title(what, fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, fraction=0.046, label="change in logit(IO) - logit(S)")
    fig.suptitle(plain(title))
    fig.tight_layout()
    save(fig, path)


__all__ = [
    "NAMES",
    "TEMPLATES",
    "format_induction",
    "format_ioi",
    "induction_circuit",
    "ioi",
    "ioi_prompts",
    "plot_induction",
    "plot_ioi",
]
