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

Every recomputation is checked against the model (the page shows the largest difference); a layer whose attention
is not the tutorial's formula (ALiBi, soft-capping, gates, talking heads...) is refused with the reason, never shown
wrong. :func:`write_explain_page` writes one offline page (no CDN) that shows the steps with the numbers, recomputes
the softmax under a temperature slider, and spells out any score's dot product term by term. The default head is
the best one that passes the determiner -> noun test of :mod:`.role_test` (on held-out sentences where the noun is
never the next word, so a next-token head cannot pass); where none passes, the one that sends the most attention
from each determiner to the word after it on this text (the tutorial's "head1": "The" -> "cat"), and the page says
that a next-token head may match it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from .._io import atomic_write_text
from ..modules.capture import attention_modules, capture
from .maps import LMSubject, Subject, is_special
from .page import _json_for_script

DETERMINERS = ("the", "a", "an", "this", "that", "these", "those", "my", "his", "her", "its", "our", "their")
TOLERANCE = 1e-4  # the page's arithmetic must give the model's own weights and output to this


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
    from .role_test import determiner_noun_test

    try:
        test = determiner_noun_test(subject)
    except ValueError:
        return None
    if layer is not None:
        test.passed = test.best(layer)
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
    mods = attention_modules(model)
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
    try:  # with gradients on: the unfused path, whose projections are the modules hooked above
        with torch.enable_grad(), capture(model, ("pattern", "q", "k", "v")) as cache:
            model(ids, keep)
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
    module says; :func:`explain` then checks every recomputed step against the model)."""
    from ..modules.attention import MultiHeadAttention

    if type(mod).__name__ == "AttachedAttention":  # an HF layer: its numbers decide (explain's checks)
        if _projections(mod) is None:
            return "a fused query/key/value projection (the page needs the three matrices)"
        if mod.z_feeds_output is False:
            return "a layer that transforms the heads' outputs before its output projection (a norm, or differential attention)"
        return None
    if type(mod) is not MultiHeadAttention:
        return f"a variant ({type(mod).__name__})"
    if getattr(mod, "_alibi", None) is not None:
        return "ALiBi position biases"
    if getattr(mod, "w_gate", None) is not None:
        return "gated heads"
    if getattr(mod, "sink_logits", None) is not None:
        return "learned attention sinks"
    if getattr(mod, "pattern", None) is not None:
        return "a sparse pattern"
    return None


# ---------------------------------------------------------------------------------------------------- the page
STEPS = [  # (id, our title, the tutorial's own words)
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
    ("head", "7. Weights × V: this head's output", "一、权重加权 V 得到输出；三、3. 每个 head 独立计算注意力"),
    ("concat", "8. Concatenate the heads", "三、4. 将 h 个 Head 的输出拼接为 (L, d_model)"),
    ("wo", "9. The output projection W^O", "三、5. 最后一层线性映射得到最终输出：MHA(X) = Concat(head_i)·W^O"),
]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #222; max-width: 1200px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 2px; }
.zh { color: #8a5a00; font-size: 13px; margin: 0 0 6px; } .note { color: #555; font-size: 13px; max-width: 900px; }
.shape { font-family: ui-monospace, monospace; font-size: 13px; background: #f3f3f3; padding: 1px 5px; }
table.m { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 11px; margin: 4px 0; }
table.m td, table.m th { border: 1px solid #ddd; padding: 2px 4px; text-align: right; min-width: 34px; }
table.m th { background: #fafafa; font-weight: normal; color: #444; } table.m td.off { color: #bbb; background: #f7f7f7; }
table.m td.pick { outline: 2px solid #d62728; } #scores td { cursor: pointer; }
.wide { overflow-x: auto; max-width: 100%; } canvas.strip { image-rendering: pixelated; border: 1px solid #ccc; }
#readout { font-family: ui-monospace, monospace; font-size: 12px; min-height: 16px; color: #333; }
#dot { font-family: ui-monospace, monospace; font-size: 12px; } #dot table td { min-width: 60px; }
.controls { display: flex; gap: 14px; align-items: center; flex-wrap: wrap; margin: 6px 0; font-size: 14px; }
.ok { color: #1a7f37; } .cap { font-size: 12px; color: #555; }
"""

SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls; return e; };
const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2));
const n = D.tokens.length, dk = D.d_k, group = D.heads / D.kv_heads;
let head = D.head, temperature = 1;
function color(v, lo, hi) {  // diverging for signed values, white -> blue for weights
  if (lo >= 0) { const t = hi > 0 ? v / hi : 0; const c = Math.round(255 - 180 * t); return `rgb(${c},${c + 20 > 255 ? 255 : c + 20},255)`; }
  const m = Math.max(-lo, hi) || 1, t = Math.max(-1, Math.min(1, v / m));
  return t >= 0 ? `rgb(255,${Math.round(255 - 150 * t)},${Math.round(255 - 150 * t)})`
                : `rgb(${Math.round(255 + 150 * t)},${Math.round(255 + 150 * t)},255)`;
}
function table(id, M, rows, cols, opts = {}) {  // a matrix as a table: every cell's exact value in data-v
  const t = $(id); t.replaceChildren();
  const head = el('tr'); head.appendChild(el('th', ''));
  cols.forEach((c) => head.appendChild(el('th', c))); t.appendChild(head);
  let lo = Infinity, hi = -Infinity;
  M.forEach((r, i) => r.forEach((v, j) => { if (!opts.off || !opts.off(i, j)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }));
  if (opts.weights) lo = 0;
  M.forEach((r, i) => {
    const tr = el('tr'); tr.appendChild(el('th', rows[i]));
    r.forEach((v, j) => {
      const off = opts.off && opts.off(i, j);
      const td = el('td', off ? '−∞' : fmt(v), off ? 'off' : '');
      td.dataset.v = String(v); td.dataset.i = i; td.dataset.j = j;
      if (!off) td.style.background = color(v, lo, hi);
      td.title = off ? 'masked' : `${rows[i]} / ${cols[j]}: ${v}`;
      tr.appendChild(td);
    });
    t.appendChild(tr);
  });
}
function strip(id, M, label, highlight) {  // a wide matrix as pixels: one row per token, hover reads a value
  const c = $(id), w = M[0].length, px = Math.max(1, Math.min(3, Math.floor(1100 / w)));
  c.width = w * px; c.height = n * 14; const g = c.getContext('2d');
  let m = 0; M.forEach((r) => r.forEach((v) => { m = Math.max(m, Math.abs(v)); }));
  M.forEach((r, i) => r.forEach((v, j) => { g.fillStyle = color(v, -m, m); g.fillRect(j * px, i * 14, px, 14); }));
  if (highlight) { g.strokeStyle = '#d62728'; g.lineWidth = 2; g.strokeRect(highlight[0] * px, 1, (highlight[1] - highlight[0]) * px, n * 14 - 2); }
  c.onmousemove = (e) => { const r = c.getBoundingClientRect(); const j = Math.floor((e.clientX - r.left) / px),
    i = Math.floor((e.clientY - r.top) / 14); if (i >= 0 && i < n && j >= 0 && j < w)
    $('readout').textContent = `${label}[${D.tokens[i]}][${j}] = ${M[i][j]}`; };
}
const dims = (k) => Array.from({ length: k }, (_, i) => String(i));
function kv(h) { return Math.floor(h / group); }
function scores(h) { const q = D.Q[h], k = D.K[kv(h)];
  return q.map((qi) => k.map((kj) => qi.reduce((s, x, d) => s + x * kj[d], 0))); }
function softmaxRows(S) { return S.map((r, i) => { const keep = r.map((_, j) => D.mask[i][j]);
  const m = Math.max(...r.filter((_, j) => keep[j])); const e = r.map((v, j) => (keep[j] ? Math.exp(v - m) : 0));
  const s = e.reduce((a, b) => a + b, 0); return e.map((x) => x / s); }); }
function render() {
  const S = scores(head), scaled = S.map((r) => r.map((v) => v * D.scale));
  const W = softmaxRows(scaled.map((r) => r.map((v) => v / temperature)));
  const V = D.V[kv(head)], Z = W.map((w) => V[0].map((_, d) => w.reduce((s, x, j) => s + x * V[j][d], 0)));
  const masked = (i, j) => !D.mask[i][j];
  $('which').textContent = `layer ${D.layer} of ${D.layers}, head ${head} of ${D.heads}` +
    (D.kv_heads < D.heads ? ` (keys and values: shared head ${kv(head)} of ${D.kv_heads})` : '');
  table('q', D.Q[head], D.tokens, dims(dk)); table('k', D.K[kv(head)], D.tokens, dims(dk));
  table('v', V, D.tokens, dims(dk));
  if (D.rotated) { table('qlin', D.Q_lin[head], D.tokens, dims(dk)); }
  table('scores', S, D.tokens, D.tokens);
  table('scaled', scaled, D.tokens, D.tokens, { off: masked });
  table('mask', D.mask.map((r) => r.map((v) => (v ? 1 : 0))), D.tokens, D.tokens, { off: masked, weights: true });
  table('weights', W, D.tokens, D.tokens, { off: masked, weights: true });
  table('z', Z, D.tokens, dims(dk));
  strip('concat', D.concat, 'concat', [head * dk, (head + 1) * dk]);
  $('tvalue').textContent = temperature.toFixed(2);
  $('tnote').textContent = temperature === 1 ? 'T = 1: the model\'s own weights' :
    `T = ${temperature.toFixed(2)}: softmax(scores / √d_k / T); ${temperature < 1 ? 'sharper' : 'flatter'} than the model's`;
  document.querySelectorAll('#scores td').forEach((td) => { td.onclick = () => dot(+td.dataset.i, +td.dataset.j); });
}
function dot(i, j) {  // one score, term by term
  const q = D.Q[head][i], k = D.K[kv(head)][j], box = $('dot'); box.replaceChildren();
  document.querySelectorAll('#scores td.pick').forEach((x) => x.classList.remove('pick'));
  document.querySelector(`#scores td[data-i="${i}"][data-j="${j}"]`).classList.add('pick');
  const sum = q.reduce((s, x, d) => s + x * k[d], 0);
  box.appendChild(el('p', `score(${D.tokens[i]} → ${D.tokens[j]}) = q · k = Σ_d q[d] × k[d] over d_k = ${dk} terms` +
    ` = ${sum.toFixed(6)}; scaled: × 1/√${dk} = ${(sum * D.scale).toFixed(6)}`));
  const t = el('table', undefined, 'm'); t.id = 'terms';  // one column per dimension d
  [['d', (d) => String(d)], [`q[d] (${D.tokens[i]})`, (d) => q[d].toFixed(3)], [`k[d] (${D.tokens[j]})`, (d) => k[d].toFixed(3)],
   ['q[d] × k[d]', (d) => (q[d] * k[d]).toFixed(3)]].forEach(([name, f], r) => {
    const tr = el('tr'); tr.appendChild(el('th', name));
    q.forEach((_, d) => { const td = el('td', f(d)); if (r === 3) { td.dataset.v = String(q[d] * k[d]);
      td.style.background = color(q[d] * k[d], -1, 1); } tr.appendChild(td); });
    t.appendChild(tr); });
  const wrap = el('div', undefined, 'wide'); wrap.appendChild(t); box.appendChild(wrap);
}
$('title').textContent = `${D.model}: multi-head attention, step by step`;
$('text').textContent = `“${D.text}” → ${n} tokens: ` + D.tokens.join(' · ');
$('why').textContent = D.why;
if (D.role_test) {  // the sentences the head was tested on, and its two scores
  const t = D.role_test, box = $('roletest');
  box.hidden = false;
  box.appendChild(el('summary', `The test: ${t.links} determiners in ${t.sentences.length} sentences where the noun is ` +
    `never the next word; this head: noun ${(100 * t.noun).toFixed(0)}%, adjacent word ${(100 * t.adjacent).toFixed(0)}% (passes if ${t.rule})`));
  const list = el('ol');
  t.sentences.forEach((x) => list.appendChild(el('li', x)));
  box.appendChild(list);
}
$('sizes').textContent = `d_model = ${D.d_model}, h = ${D.heads} heads, d_k = d_model / h = ${dk}, L = ${n} tokens`;
$('shape-x').textContent = `X: (L, d_model) = (${n}, ${D.d_model})`;
$('shape-qkv').textContent = `X (${n}×${D.d_model}) · W_Q (${D.d_model}×${D.heads * dk}) → (${n}×${D.heads * dk}) → reshape (h, L, d_k) = (${D.heads}, ${n}, ${dk})` +
  (D.kv_heads < D.heads ? `; K and V: (${D.kv_heads}, ${n}, ${dk}), one per group of ${group} query heads (GQA)` : '');
$('rot').hidden = !D.rotated;
$('shape-concat').textContent = `(h, L, d_k) = (${D.heads}, ${n}, ${dk}) → transpose, reshape → (L, h·d_k) = (${n}, ${D.heads * dk}); this head's slice outlined`;
$('shape-wo').textContent = `Concat (${n}×${D.heads * dk}) · W_O (${D.heads * dk}×${D.d_model}) → (${n}×${D.d_model})`;
$('checks').textContent = `checked against the model: weights within ${D.checks.weights.toExponential(1)}, ` +
  `concatenation within ${D.checks.concat.toExponential(1)}, output within ${D.checks.output.toExponential(1)}`;
$('masknote').textContent = D.causal ? 'causal: each token attends to itself and the tokens before it (the tutorial\'s ' +
  'subsequent mask); masked scores become −∞, so their weights are 0' : 'every token may attend to every token ' +
  '(one sentence, no padding): nothing is masked here';
const sel = $('head');
for (let h = 0; h < D.heads; h++) { const o = el('option', `head ${h}`); o.value = h; if (h === head) o.selected = true; sel.appendChild(o); }
sel.onchange = () => { head = +sel.value; $('dot').replaceChildren(); render(); };
const slider = $('temperature');
slider.oninput = () => { temperature = Math.exp(+slider.value); if (Math.abs(+slider.value) < 1e-9) temperature = 1; render(); };
strip('x', D.X, 'X'); strip('out', D.output, 'MHA(X)');
render(); dot(1 < n ? 1 : 0, 2 < n ? 2 : 0);
document.body.dataset.ready = '1';
"""


def _section(step: str, body: str) -> str:
    sid, title, zh = next(s for s in STEPS if s[0] == step)
    return f'<section id="step-{sid}"><h2>{title}</h2><p class="zh">{zh}</p>{body}</section>\n'


def write_explain_page(data: dict, path: str | Path) -> Path:
    """One offline page of :func:`explain`'s steps (data in a JSON block, every token inserted as text). The weights
    are left out: the page computes them from q and k, which is what it shows."""
    page = {k: v for k, v in data.items() if k != "weights"}
    body = (
        '<h1 id="title"></h1><p class="note" id="text"></p>'
        '<p class="note"><span class="shape" id="sizes"></span> · <span id="which"></span> · <span id="why"></span></p>'
        '<details id="roletest" class="note" hidden></details>'
        '<div class="controls"><label>head <select id="head"></select></label>'
        '<label>temperature T <input id="temperature" type="range" min="-2.3" max="2.3" step="0.01" value="0"></label>'
        '<span id="tvalue"></span> <span class="cap" id="tnote"></span></div>'
        '<p class="ok cap" id="checks"></p>'
        '<p class="cap">Colours: red positive, blue negative (each table on its own scale); weights white (0) to blue '
        '(the table\'s largest). Hover a cell for its exact value.</p><p id="readout"></p>'
        + _section(
            "x",
            '<p class="note">Each token enters the layer as a vector of d_model numbers (its embedding plus what the '
            'layers below wrote). Hover the strip to read a value.</p><p><span class="shape" id="shape-x"></span></p>'
            '<div class="wide"><canvas class="strip" id="x"></canvas></div>',
        )
        + _section(
            "qkv",
            '<p class="note">Three learned matrices turn every token into a query, a key and a value; the d_model '
            "columns are then cut into h heads of d_k, so each head works in its own subspace.</p>"
            '<p><span class="shape" id="shape-qkv"></span></p>'
            '<div id="rot" hidden><p class="note">This model rotates queries and keys by position (rotary '
            "embeddings) after the projection: XW_Q below, then the rotated Q that the scores use.</p>"
            '<div class="wide"><table class="m" id="qlin"></table></div></div>'
            '<p class="cap">Q (this head)</p><div class="wide"><table class="m" id="q"></table></div>'
            '<p class="cap">K</p><div class="wide"><table class="m" id="k"></table></div>'
            '<p class="cap">V</p><div class="wide"><table class="m" id="v"></table></div>',
        )
        + _section(
            "scores",
            '<p class="note">Row: the query token; column: the key token. Each score is the dot product of a query and '
            "a key: how well they match. Click a cell to see its sum term by term.</p>"
            '<div class="wide"><table class="m" id="scores"></table></div><div id="dot"></div>',
        )
        + _section(
            "scaled",
            '<p class="note">Dividing by √d_k keeps the scores in a range where softmax is not saturated (the sum of '
            "d_k products grows with d_k).</p>"
            '<div class="wide"><table class="m" id="scaled"></table></div>',
        )
        + _section(
            "mask",
            '<p class="note" id="masknote"></p><div class="wide"><table class="m" id="mask"></table></div>',
        )
        + _section(
            "softmax",
            '<p class="note">Each row becomes weights that are positive and sum to 1: softmax(scores / √d_k / T). '
            "Move the temperature: below 1 the largest score takes over, above 1 the weights spread out.</p>"
            '<div class="wide"><table class="m" id="weights"></table></div>',
        )
        + _section(
            "head",
            '<p class="note">Each token\'s output in this head is the weighted average of the value vectors: '
            "head_i = softmax(QKᵀ/√d_k)·V, (L, d_k).</p>"
            '<div class="wide"><table class="m" id="z"></table></div>',
        )
        + _section(
            "concat",
            '<p class="note">All h heads computed the same way, side by side: their outputs are placed next to each '
            'other.</p><p><span class="shape" id="shape-concat"></span></p>'
            '<div class="wide"><canvas class="strip" id="concat"></canvas></div>',
        )
        + _section(
            "wo",
            '<p class="note">One more learned matrix mixes the heads back into d_model numbers per token: the output '
            'of multi-head attention, added to the residual stream.</p><p><span class="shape" id="shape-wo"></span></p>'
            '<div class="wide"><canvas class="strip" id="out"></canvas></div>',
        )
    )
    html = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>multi-head attention, step by step</title><style>{STYLE}</style></head>\n<body>\n{body}\n"
        f'<script type="application/json" id="data">{_json_for_script(page)}</script>\n'
        f"<script>{SCRIPT}</script>\n</body></html>\n"
    )
    path = Path(path)
    atomic_write_text(path, html)
    return path


__all__ = ["DETERMINERS", "STEPS", "explain", "write_explain_page"]
