"""The tutorial, live: every step of multi-head attention on a real model's layer, with the model's own numbers.

:func:`explain` runs one text through a model and takes, for one attention layer, what the tutorial writes down:

==========================================  ==================================================================
step                                        where the numbers come from
==========================================  ==================================================================
X, the layer's input ``(L, d_model)``       the input of the layer's query projection (after a pre-norm)
XW_Q, XW_K, XW_V, split ``(h, L, d_k)``     the layer's own weights applied to X; the kernel's q, k, v
                                            (``hook_q/k/v``: after rotary positions or a QK-norm, if any)
QK^T, / sqrt(d_k), the mask, softmax        recomputed from those q and k, checked against ``hook_pattern``
weights x V, concat, W^O                    recomputed, checked against the output projection's input and
                                            output
==========================================  ==================================================================

Around the attention step the page shows the rest of the block, from the model's own modules (forward hooks): the
tokens' embedding rows and what is added before layer 0; every head of the layer; the MLP's input, hidden layer and
output; the residual stream before and after the block (on a pre-norm block, checked to be the input plus the two
contributions); and, for a causal LM, the logits of the next token, which the page turns into a sampling
distribution (temperature, top-k, top-p) exactly as :func:`multihead.models.generation.sampling_distribution` does.

Every recomputation is checked against the model (the page shows the largest difference); a layer whose attention
is not the tutorial's formula (ALiBi, soft-capping, gates, talking heads...) is refused with the reason, never shown
wrong. :func:`write_explain_page` writes one offline page (no CDN) that shows the steps with the numbers, recomputes
the softmax under a temperature slider, and spells out any score's dot product term by term; :mod:`.serve` serves
the same page where the reader types the text. The default head is
the best one that passes the determiner -> noun test of :mod:`.role_test` (on held-out sentences where the noun is
never the next word, so a next-token head cannot pass); where none passes, the one that sends the most attention
from each determiner to the word after it on this text (the tutorial's "head1": "The" -> "cat"), and the page says
that a next-token head may match it.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..._io import atomic_write_text
from ...modules.anatomy import Anatomy, Block, anatomy, child as _child
from ...modules.capture import capture
from ..maps import LMSubject, Subject, is_special
from .page import _json_for_script

DETERMINERS = ("the", "a", "an", "this", "that", "these", "those", "my", "his", "her", "its", "our", "their")
TOLERANCE = 1e-4  # the page's arithmetic must give the model's own weights and output to this
# each subject's determiner -> noun test, run once (a Subject compares by value, so it is keyed by identity)
_ROLE_TESTS = WeakIdKeyDictionary()


def _determiner_score(p: torch.Tensor, tokens: list[str], causal: bool) -> tuple[torch.Tensor, str]:
    """``(H,)`` scores of one layer's ``(H, L, L)`` weights: attention between each determiner and the word after
    it (from the determiner; in a causal model, which cannot look ahead, from the word back to its determiner) or,
    without determiners, each query's largest weight on another ordinary token; and what the score measures."""
    n = len(tokens)
    pairs = [
        (i + 1, i) if causal else (i, i + 1)
        for i, t in enumerate(tokens[:-1])
        if t.lower().lstrip("▁Ġ ") in DETERMINERS and not is_special(tokens[i + 1])
    ]
    if pairs:
        what = (
            "attention from each word back to its determiner"
            if causal
            else "attention from each determiner to the next word"
        )
        return torch.stack([p[:, i, j] for i, j in pairs], -1).mean(-1), what
    ordinary = [i for i, t in enumerate(tokens) if not is_special(t)] or list(range(n))
    sub = p[:, ordinary][:, :, ordinary].clone()
    eye = torch.eye(len(ordinary), dtype=torch.bool)
    sub[:, eye] = 0
    return sub.max(-1).values.mean(-1), "each word's largest weight on another word"


def _role_test(subject: Subject, layer: int | None):
    """The determiner -> noun test (:mod:`.role_test`) of ``subject``, restricted to ``layer`` if given; None where
    the test cannot read the model (a tokenizer that splits its words otherwise)."""
    import dataclasses

    from ..roles.evidence import determiner_noun_test

    if subject not in _ROLE_TESTS:  # the same for every text: a served page runs it once
        try:
            _ROLE_TESTS[subject] = determiner_noun_test(subject)
        except ValueError:
            _ROLE_TESTS[subject] = None
    test = _ROLE_TESTS[subject]
    if test is not None and layer is not None:
        test = dataclasses.replace(test, passed=test.best(layer))
    return test


def _test_summary(test, layer: int, head: int) -> dict:
    """What the page shows of the test: the sentences, the rule and the shown head's two scores."""
    return {"sentences": test.sentences, "rule": test.rule, "links": test.links, **test.score(layer, head)}


def explain(subject: Subject, text: str, *, layer: int | None = None, head: int | None = None) -> dict:
    """The tutorial's steps for ``text`` in ``subject``'s attention layer ``layer``, head ``head`` (default: the
    determiner -> noun head, see the module docstring). Returns plain lists (what the page embeds) and the checks."""
    model = subject.model.eval()
    ids, keep = subject.encode([text])
    n = int(keep[0].sum())
    if n == 0:
        raise ValueError("the text gives no tokens; pass some text")
    tokens, _ = subject.display(ids[0, :n].tolist())
    body = anatomy(model)
    mods = [(s.name, s.module) for s in body.sites]
    if layer is not None and not 0 <= layer < len(mods):
        raise ValueError(f"--layer {layer}: {subject.name} has attention layers 0 to {len(mods) - 1}")
    seen: dict[str, torch.Tensor] = {}
    handles = []

    def projection_input(i: int):
        def record(module, args) -> None:
            seen[f"x{i}"] = args[0].detach()

        return record

    def output(i: int):
        def record(module, args, out) -> None:
            seen[f"z{i}"], seen[f"o{i}"] = args[0].detach(), out.detach()

        return record

    parts = [_projections(m) if _variant(m) is None else None for _, m in mods]
    for i, proj in enumerate(parts):
        if proj is not None:
            handles.append(proj[0].register_forward_pre_hook(projection_input(i)))
            handles.append(proj[3].register_forward_hook(output(i)))
    handles += _record_block(body, [body.site_block(i) for i in range(len(mods))], seen)
    try:  # with gradients on: the unfused path, whose projections are the modules hooked above
        with torch.enable_grad(), capture(model, ("pattern", "q", "k", "v")) as cache:
            result = model(ids, keep)
    finally:
        for h in handles:
            h.remove()
    patterns = [cache.pattern(i)[0, :, :n, :n].double() for i in range(len(mods))]
    causal = isinstance(subject, LMSubject) or bool(getattr(getattr(model, "config", None), "causal", False))
    test = None
    if layer is None or head is None:
        test = _role_test(subject, layer)
        if test is not None and test.passed is not None:
            layer, head = test.passed
            why = test.describe(layer, head)
        else:
            scores = [_determiner_score(p, tokens, causal) for p in patterns]
            candidates = [(l, h) for l in range(len(mods)) for h in range(patterns[l].shape[0])]
            if layer is not None:
                candidates = [c for c in candidates if c[0] == layer]
            layer, head = max(candidates, key=lambda c: float(scores[c[0]][0][c[1]]))
            why = (
                f"no head {'of this layer ' if test is not None and len(candidates) < len(mods) else ''}passed the "
                "determiner -> noun test on sentences that separate it from a next-token head; chosen for the most "
                f"{scores[layer][1]} on this text ({float(scores[layer][0][head]):.2f}), which a next-token head "
                "may match"
            )
    else:
        why = "chosen on the command line"
    name, mod = mods[layer]
    h_count, g_count, d = mod.num_heads, mod.num_kv_heads, mod.head_dim
    if not 0 <= head < h_count:
        raise ValueError(f"--head {head}: layer {layer} of {subject.name} has heads 0 to {h_count - 1}")
    variant = _variant(mod)
    if variant:
        raise ValueError(f"layer {layer} ({name}) uses {variant}; explain shows the tutorial's plain softmax attention")
    w_q, w_k, w_v, w_o = parts[layer]

    def rows(t: torch.Tensor) -> torch.Tensor:  # (1, L, X) or (N, X) -> (n, X), float64
        return (t[0] if t.dim() == 3 else t)[:n].double()

    x, z_in, out = rows(seen[f"x{layer}"]), rows(seen[f"z{layer}"]), rows(seen[f"o{layer}"])
    wq, wk, wv = (lin.weight.detach().double() for lin in (w_q, w_k, w_v))

    def project(lin, w) -> torch.Tensor:  # X W^T + b, split into heads: (heads, n, d)
        y = x @ w.T + (lin.bias.detach().double() if lin.bias is not None else 0)
        return y.view(n, -1, d).transpose(0, 1)

    q_lin, k_lin, v_lin = project(w_q, wq), project(w_k, wk), project(w_v, wv)
    q, k, v = (cache.get_layer(w, layer)[0, :, :n].double() for w in ("q", "k", "v"))
    mask = torch.ones(n, n, dtype=torch.bool)
    if causal:
        mask = torch.tril(mask)
    scale = getattr(mod, "scale", None) or 1.0 / math.sqrt(d)  # an HF layer's own scaling, where it has one
    group = h_count // g_count
    scores = torch.einsum("hid,hjd->hij", q, k.repeat_interleave(group, 0)) * scale
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    z = torch.einsum("hij,hjd->hid", weights, v.repeat_interleave(group, 0))
    concat = z.transpose(0, 1).reshape(n, h_count * d)
    mha = concat @ w_o.weight.detach().double().T + (w_o.bias.detach().double() if w_o.bias is not None else 0)
    checks = {
        "weights": float((weights - patterns[layer]).abs().max()),
        "concat": float((concat - z_in).abs().max()),
        "output": float((mha - out).abs().max()),
        "projection": float((v_lin - v).abs().max()),  # values are never rotated or normalised
    }
    bad = {k_: v_ for k_, v_ in checks.items() if v_ > TOLERANCE}
    if bad:
        raise ValueError(
            f"layer {layer} of {subject.name} does not compute the tutorial's formula here (largest differences: "
            + ", ".join(f"{k_} {v_:.1e}" for k_, v_ in bad.items())
            + "); explain shows plain softmax attention"
        )
    transformed = float((q_lin - q).abs().max()) > TOLERANCE or float((k_lin - k).abs().max()) > TOLERANCE

    def numbers(t: torch.Tensor) -> list:  # six decimals: the page's arithmetic stays within 1e-5 of the model's
        return torch.round(t, decimals=6).tolist()

    block = _block_numbers(seen, layer, n, mha, transformed)
    stream = block["pre"] if block["pre"] is not None else x.tolist()
    sinks = attention_sinks(torch.tensor(stream, dtype=torch.float64), weights, v.repeat_interleave(group, 0), causal)

    return {
        "model": subject.name,
        "text": text,
        "tokens": tokens,
        "layer": layer,
        "layers": len(mods),
        "module": name,
        "head": head,
        "why": why,
        "role_test": None if test is None else _test_summary(test, layer, head),
        "heads": h_count,
        "kv_heads": g_count,
        "d_model": x.shape[1],
        "d_k": d,
        "scale": scale,
        "causal": causal,
        "rotated": transformed,  # rotary positions (or a QK-norm) turn XW_Q into the q the kernel uses
        "X": numbers(x),
        "Q_lin": numbers(q_lin),
        "K_lin": numbers(k_lin),
        "Q": numbers(q),
        "K": numbers(k),
        "V": numbers(v),
        "mask": mask.tolist(),
        "weights": weights.tolist(),  # the model's own, recomputed (checks["weights"] says how close)
        "concat": numbers(concat),
        "output": numbers(mha),
        "checks": checks,
        "block": block,
        "sinks": sinks,
        "overview": _overview(patterns, seen, n),
        "next": _next_token(subject, result, n),
    }


THUMB = 24  # the overview's squares: each head's weights averaged down to at most THUMB x THUMB


def _overview(patterns: list[torch.Tensor], seen: dict, n: int) -> dict:
    """The whole model at a glance: every head of every layer as a small square (its weights averaged down to at
    most :data:`THUMB` cells a side, each square scaled to its own largest cell, as bytes 0-255) and each token's
    residual stream length entering every layer and leaving the last (``(layers + 1, L)``; None where the model's
    blocks were not found)."""
    import base64

    import torch.nn.functional as F

    side = min(n, THUMB)
    squares = []
    for p in patterns:
        small = F.adaptive_avg_pool2d(p.float()[None], side)[0]  # (H, side, side)
        small = small / small.flatten(1).amax(-1).clamp_min(1e-12)[:, None, None]
        u8 = (small * 255).round().clamp(0, 255).to(torch.uint8).contiguous()
        squares.append({"u8": base64.b64encode(u8.numpy().tobytes()).decode("ascii"), "shape": list(u8.shape)})
    layers = len(patterns)
    keys = [f"pre{i}" for i in range(layers)] + [f"post{layers - 1}"]
    norms = None
    if all(k in seen for k in keys):
        stack = [(seen[k][0] if seen[k].dim() == 3 else seen[k])[:n].double() for k in keys]
        norms = packed(torch.stack([torch.linalg.vector_norm(t, dim=-1) for t in stack]))
    return {"side": side, "squares": squares, "norms": norms}


SINK_RATIO = 10.0  # a token whose residual stream is this many times longer than the median token's is a sink


def attention_sinks(stream: torch.Tensor, weights: torch.Tensor, values: torch.Tensor, causal: bool) -> dict | None:
    """The attention sinks of one layer (None where it has none): tokens whose residual stream entering the layer
    (``stream``, ``(L, d_model)``) is more than :data:`SINK_RATIO` times longer than the median token's, with what
    the layer's heads do with them. ``weights``: ``(H, L, L)``; ``values``: ``(H, L, d_k)``, one per query head.

    For each head: the share of attention the other tokens give the sinks (averaged over those queries), against the
    share an even spread over the keys each query may see would give; and the length of the sinks' value vectors
    against the median token's. A head that puts most of its weight on a token whose value is short writes little:
    the sink is where a head parks attention it has no use for (Xiao et al., 2023), and the page says so only where
    these numbers show it."""
    n = stream.shape[0]
    norms = torch.linalg.vector_norm(stream.double(), dim=-1)
    median = float(norms.median())
    tokens = [i for i in range(n) if float(norms[i]) > SINK_RATIO * median]
    queries = [i for i in range(n) if i not in tokens]
    if not tokens or not queries:
        return None
    w = weights.double()
    share = w[:, queries][:, :, tokens].sum(-1).mean(-1)  # (H,)
    seen = torch.tensor([[j <= i or not causal for j in range(n)] for i in queries], dtype=torch.float64)
    even = float((seen[:, tokens].sum(-1) / seen.sum(-1)).mean())
    lengths = torch.linalg.vector_norm(values.double(), dim=-1)  # (H, L)
    value = lengths[:, tokens].mean(-1) / lengths[:, queries].median(-1).values.clamp_min(1e-12)  # (H,)
    return {
        "tokens": tokens,
        "norms": [float(norms[i]) for i in tokens],
        "median": median,
        "ratio": SINK_RATIO,
        "share": share.tolist(),
        "even": even,
        "value": value.tolist(),
        "heads": int((share > 0.5).sum()),
    }


# ---------------------------------------------------------------------------------------------------- the block
DOWN_NAMES = ("w_2", "down_proj", "c_proj", "fc2", "dense_4h_to_h")  # its last projection (its input: the hidden)


def _record_block(body: Anatomy, blocks: list[Block], seen: dict) -> list:
    """Hooks that record, in ``seen``, the token embeddings (``embed``), every block's input (``pre{i}``) and output
    (``post{i}``), and its feed-forward module's input (``mlp_in{i}``), hidden activation (``hidden{i}``, the last
    projection's input) and output (``mlp_out{i}``), where the model's anatomy has them."""

    def first(x):
        return (x[0] if isinstance(x, (tuple, list)) else x).detach()

    def before(key: str):
        def record(module, args, kwargs) -> None:
            seen[key] = first(args) if args else kwargs["hidden_states"].detach()

        return record

    def after(key: str):
        def record(module, args, out) -> None:
            seen[key] = first(out)

        return record

    handles = []
    if body.embed is not None:
        handles.append(body.embed.register_forward_hook(after("embed")))
    for i, block in enumerate(blocks):
        handles.append(block.module.register_forward_pre_hook(before(f"pre{i}"), with_kwargs=True))
        handles.append(block.module.register_forward_hook(after(f"post{i}")))
        mlp = block.mlp
        if mlp is None:
            continue
        handles.append(mlp.register_forward_pre_hook(before(f"mlp_in{i}"), with_kwargs=True))
        handles.append(mlp.register_forward_hook(after(f"mlp_out{i}")))
        down = _child(mlp, DOWN_NAMES)
        if down is not None:
            handles.append(down.register_forward_pre_hook(before(f"hidden{i}"), with_kwargs=True))
    return handles


def _block_numbers(seen: dict, layer: int, n: int, attn_out: torch.Tensor, rotated: bool) -> dict:
    """What the page shows around the attention step: the embeddings and what reaches layer 0, the residual stream
    of ``layer`` (its input, the attention's and the MLP's contributions, its output) and the MLP inside, with the
    checks of how they add up."""

    def rows(key: str) -> torch.Tensor | None:
        t = seen.get(key)
        return None if t is None else (t[0] if t.dim() == 3 else t)[:n].double()

    def numbers(t: torch.Tensor | None) -> list | None:  # four decimals: these are pictures, not arithmetic
        return None if t is None else torch.round(t, decimals=4).tolist()

    embed, first_input = rows("embed"), rows("pre0")
    pre, post = rows(f"pre{layer}"), rows(f"post{layer}")
    mlp_in, hidden, mlp_out = rows(f"mlp_in{layer}"), rows(f"hidden{layer}"), rows(f"mlp_out{layer}")
    added = None
    if embed is not None and first_input is not None and embed.shape == first_input.shape:
        added = first_input - embed
    if added is None:
        positions = "unknown"
    elif float(added.abs().max()) <= TOLERANCE:
        positions = "rotary" if rotated else "none"  # nothing is added to the token's vector before layer 0
    else:
        positions = "added"
    residual = "unknown"
    checks: dict[str, float] = {}
    if pre is not None and post is not None and mlp_out is not None and pre.shape == post.shape:
        # relative to the stream's size: a float32 sum of three terms of ~100 is exact to ~1e-5 of them
        checks["residual"] = float((pre + attn_out + mlp_out - post).abs().max() / post.abs().max().clamp_min(1.0))
        residual = "sum" if checks["residual"] <= 1e-5 else "other"
    return {
        "embed": numbers(embed),
        "added": numbers(added) if positions == "added" else None,
        "positions": positions,
        "pre": numbers(pre),
        "attn_out": numbers(attn_out),
        "mlp_in": numbers(mlp_in),
        "hidden": numbers(hidden),
        "mlp_out": numbers(mlp_out),
        "post": numbers(post),
        "residual": residual,
        "norms": {  # each token's length at each stage, the page's bar chart
            k: torch.linalg.vector_norm(t, dim=-1).tolist()
            for k, t in (("pre", pre), ("attn_out", attn_out), ("mlp_out", mlp_out), ("post", post))
            if t is not None
        },
        "checks": checks,
    }


def _next_token(subject: Subject, result, n: int, top: int = 200) -> dict | None:
    """The model's logits for the token after the text (a causal LM's last position), as float32 bytes in base64
    (the page samples from every one of them) with the ``top`` most likely tokens' texts; None for a model without
    a vocabulary output (an encoder)."""
    import base64

    logits = getattr(result, "logits", result)
    lm = getattr(subject, "lm", None)
    if lm is None or not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        return None
    last = logits[0, n - 1].detach().float().contiguous()
    order = last.topk(min(top, last.numel())).indices.tolist()
    return {
        "vocab": last.numel(),
        "logits": base64.b64encode(last.numpy().astype("<f4").tobytes()).decode("ascii"),
        "top": order,
        "texts": lm.token_texts(order),
    }


def _projections(mod):
    """``(w_q, w_k, w_v, w_o)`` of an attention layer as modules with ``weight`` ``(out, in)`` and ``bias`` (None:
    the layer has no separate ones, e.g. a fused q/k/v matrix)."""
    parts = tuple(getattr(mod, w, None) for w in ("w_q", "w_k", "w_v"))
    try:
        out = mod.w_o
    except ValueError:
        return None
    if any(not isinstance(p, nn.Linear) for p in (*parts, out)):
        return None
    return (*parts, out)


def _variant(mod) -> str | None:
    """What makes a layer's attention differ from the tutorial's formula (None: it is the formula, as far as the
    layer says; :func:`explain` then checks every recomputed step against the model). Asked of what the layer
    exposes, whichever source described it: its parts (a gate, sinks, ALiBi, a sparse pattern), a module class other
    than the plain one, separate q/k/v/o projections, and whether the output projection reads the heads as they
    are."""
    from ...modules.attention import MultiHeadAttention

    for attr, why in (
        ("_alibi", "ALiBi position biases"),
        ("w_gate", "gated heads"),
        ("sink_logits", "learned attention sinks"),
        ("pattern", "a sparse pattern"),
    ):
        if getattr(mod, attr, None) is not None:
            return why
    if isinstance(mod, nn.Module) and type(mod) is not MultiHeadAttention:
        return f"a variant ({type(mod).__name__})"
    if _projections(mod) is None:
        return "a fused query/key/value projection (the page needs the three matrices)"
    if getattr(mod, "z_feeds_output", True) is False:
        return "a layer that transforms the heads' outputs before its output projection (a norm, or differential attention)"
    return None


# ---------------------------------------------------------------------------------------------------- the page
STEPS = [  # (id, our title, the tutorial's own words); each step's body is assets/explain/steps/{id}.html
    ("embed", "0. Tokens become vectors: embeddings and positions", "八、x = self.embed(x); x = self.pe(x)"),
    ("x", "1. The input X", "三、1. 输入 X ∈ R^{L×d_model}"),
    (
        "qkv",
        "2. Q = XW_Q, K = XW_K, V = XW_V, split into heads",
        "三、2. 线性映射得到 Q, K, V 并 reshape 为 (h, L, d_k)",
    ),
    ("scores", "3. Scores QKᵀ", "一、QKᵀ 计算相似性"),
    ("scaled", "4. Scaled by 1/√d_k", "一、除以 √d_k 控制数值范围"),
    ("mask", "5. The mask", "四、mask (masked_fill)"),
    ("softmax", "6. Softmax: the attention weights", "一、softmax 得到注意力权重"),
    ("heads", "7. Every head of this layer", "二、多视角观察：不同 head 可以捕捉不同类型的语义关系"),
    ("head", "8. Weights × V: this head's output", "一、权重加权 V 得到输出；三、3. 每个 head 独立计算注意力"),
    ("concat", "9. Concatenate the heads", "三、4. 将 h 个 Head 的输出拼接为 (L, d_model)"),
    ("wo", "10. The output projection W^O", "三、5. 最后一层线性映射得到最终输出：MHA(X) = Concat(head_i)·W^O"),
    ("mlp", "11. The MLP, token by token", "六、MHA 的输出为 FFN 输入"),
    ("residual", "12. The residual stream", "六、x → MHA(x,x,x) → 残差 + LayerNorm → FFN → 残差 + LayerNorm"),
    ("next", "13. The next token: logits and sampling", "八、return self.fc(out)"),
]
OPTIONAL = ("embed", "mlp", "residual", "next")  # shown where the model has them (the page says so)
MAX_CHARS = 2000  # the served page's text box


def zh_characters() -> set[str]:
    """The CJK characters of the page's headings: what the bundled font (``assets/zh-headings.woff``) must hold."""
    return {c for _, _, zh in STEPS for c in zh if ord(c) >= 0x3000}


def _assets():
    from importlib.resources import files

    return files("multihead.interpret.pages").joinpath("assets")


@functools.cache
def _page_parts():
    """The template (jinja2, autoescaped) and the files it inlines, read once per process (a served page renders
    often)."""
    import base64

    from jinja2 import Environment, FunctionLoader, StrictUndefined, select_autoescape
    from markupsafe import Markup

    root = _assets()
    env = Environment(
        loader=FunctionLoader(lambda name: root.joinpath("explain", name).read_text(encoding="utf-8")),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
    )
    return env.get_template("page.html"), {
        "steps": [{"id": i, "title": t, "zh": zh, "optional": i in OPTIONAL} for i, t, zh in STEPS],
        "max_chars": MAX_CHARS,
        "zh_font": base64.b64encode(root.joinpath("zh-headings.woff").read_bytes()).decode("ascii"),
        "css": Markup(root.joinpath("explain", "page.css").read_text(encoding="utf-8")),
        "js": Markup(root.joinpath("explain", "page.js").read_text(encoding="utf-8")),
    }


# What the page draws as pictures (one row per token, hover reads a value): sent apart from the rest, inline in a
# written page and fetched when its step scrolls into view on a served one. "block.attn_out" is not drawn (its norms
# are) and "weights" the page computes from q and k: neither is sent.
STRIPS = (
    "X",
    "concat",
    "output",
    "block.embed",
    "block.added",
    "block.pre",
    "block.mlp_in",
    "block.hidden",
    "block.mlp_out",
    "block.post",
)
PAGE_MATRICES = ("Q", "K", "V", "Q_lin", "K_lin")  # the numbers the page's arithmetic starts from
_NOT_SENT = ("weights", "mask", "block.attn_out")  # computed on the page (the mask: from "causal")


def packed(rows) -> dict | None:
    """A matrix (or a stack of them) as the page reads it: float32 bytes in base64 with the shape, a quarter of the
    JSON text of the same numbers and exact to float32 (the model's own precision)."""
    import base64

    if rows is None:
        return None
    t = torch.as_tensor(rows, dtype=torch.float32).contiguous()
    return {"f32": base64.b64encode(t.numpy().astype("<f4").tobytes()).decode("ascii"), "shape": list(t.shape)}


def unpacked(p: dict | None) -> torch.Tensor | None:
    """The tensor of a :func:`packed` matrix."""
    import base64

    if p is None:
        return None
    return torch.frombuffer(bytearray(base64.b64decode(p["f32"])), dtype=torch.float32).reshape(p["shape"])


def _get(data: dict, key: str):
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def page_data(data: dict) -> tuple[dict, dict]:
    """:func:`explain`'s answer as the page reads it: ``(core, strips)``. ``core`` holds what the first screen needs
    (the tokens, every head's q, k and v packed, the norms, the checks, the next token); ``strips`` the pictures of
    :data:`STRIPS`, packed, by name (None where the model has no such step). Nothing the page recomputes is sent."""
    core = {k: v for k, v in data.items() if k not in (*PAGE_MATRICES, *_NOT_SENT, "block", *STRIPS)}
    for key in PAGE_MATRICES:
        if key in ("Q_lin", "K_lin") and not data.get("rotated"):
            continue  # the page shows XW_Q apart from Q only where rotary positions (or a QK-norm) separate them
        core[key] = packed(data.get(key))
    block = data.get("block") or {}
    core["block"] = {k: v for k, v in block.items() if f"block.{k}" not in (*STRIPS, *_NOT_SENT)}
    core["block"]["has"] = {k: block.get(k) is not None for k in ("embed", "added", "hidden", "mlp_out", "pre", "post")}
    core["block"]["d_ff"] = len(block["hidden"][0]) if block.get("hidden") else None
    return core, {key: packed(_get(data, key)) for key in STRIPS}


def render_explain_page(data: dict, *, serve: bool = False, strips: str = "inline") -> str:
    """The explain page as HTML (the numbers in a JSON block every token of which is inserted as text by the
    script). ``serve``: with the text box that asks the local server (:mod:`.serve`). ``strips``: ``"inline"``
    (the pictures in the page: one file that works offline) or an answer id whose pictures the page fetches from
    the server as their steps scroll into view."""
    from markupsafe import Markup

    template, parts = _page_parts()
    core, pictures = page_data(data)
    if strips == "inline":
        core["strips"] = pictures
    else:
        core["answer"] = strips
    return template.render(**parts, serve=serve, data=Markup(_json_for_script(core)))


def write_explain_page(data: dict, path: str | Path) -> Path:
    """One offline page of :func:`explain`'s steps (no CDN, no server: everything it needs is in the file)."""
    path = Path(path)
    atomic_write_text(path, render_explain_page(data))
    return path


__all__ = [
    "DETERMINERS",
    "STEPS",
    "SINK_RATIO",
    "STRIPS",
    "attention_sinks",
    "explain",
    "packed",
    "page_data",
    "render_explain_page",
    "unpacked",
    "write_explain_page",
    "zh_characters",
]
