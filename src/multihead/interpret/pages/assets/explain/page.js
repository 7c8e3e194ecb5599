'use strict';
// The explain page: every step of one transformer block, drawn from the numbers in the #data block (or, served,
// from the model's answer to the text typed in). Every token is inserted as text, never as markup.
const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
};
const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2));
const dims = (k) => Array.from({ length: k }, (_, i) => String(i));

let D = null, n = 0, dk = 0, group = 1, head = 0, temperature = 1;

function color(v, lo, hi) {  // diverging for signed values, white -> blue for weights
  if (lo >= 0) {
    const t = hi > 0 ? v / hi : 0, c = Math.round(255 - 180 * t);
    return `rgb(${c},${c + 20 > 255 ? 255 : c + 20},255)`;
  }
  const m = Math.max(-lo, hi) || 1, t = Math.max(-1, Math.min(1, v / m));
  return t >= 0 ? `rgb(255,${Math.round(255 - 150 * t)},${Math.round(255 - 150 * t)})`
    : `rgb(${Math.round(255 + 150 * t)},${Math.round(255 + 150 * t)},255)`;
}

function table(id, M, rows, cols, opts = {}) {  // a matrix as a table: every cell's exact value in data-v
  const t = $(id);
  t.replaceChildren();
  const top = el('tr');
  top.appendChild(el('th', ''));
  cols.forEach((c) => top.appendChild(el('th', c)));
  t.appendChild(top);
  let lo = Infinity, hi = -Infinity;
  M.forEach((r, i) => r.forEach((v, j) => {
    if (!opts.off || !opts.off(i, j)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }));
  if (opts.weights) lo = 0;
  const top_ = opts.perColumn ? cols.map((_, j) => Math.max(...M.map((r) => r[j]))) : null;
  M.forEach((r, i) => {
    const tr = el('tr');
    tr.appendChild(el('th', rows[i]));
    r.forEach((v, j) => {
      const off = opts.off && opts.off(i, j);
      const td = el('td', off ? '−∞' : fmt(v), off ? 'off' : '');
      td.dataset.v = String(v); td.dataset.i = i; td.dataset.j = j;
      if (!off) td.style.background = top_ ? color(v, 0, top_[j]) : color(v, lo, hi);
      td.title = off ? 'masked' : `${rows[i]} / ${cols[j]}: ${v}`;
      tr.appendChild(td);
    });
    t.appendChild(tr);
  });
}

const LABEL = 80, ROW = 14;  // a strip's token column (px) and row height
function scaleOf(M) {  // the 99th percentile of |v|: one huge coordinate (an attention sink's) must not wash out the rest
  const a = [];
  M.forEach((r) => r.forEach((v) => a.push(Math.abs(v))));
  a.sort((x, y) => x - y);
  return { m: a[Math.min(a.length - 1, Math.floor(0.99 * a.length))] || 1, max: a[a.length - 1] || 0 };
}
function strip(id, M, label, highlight) {  // a wide matrix as pixels: one labelled row per token, hover reads a value
  const c = $(id);
  if (!M) { c.width = 0; c.height = 0; return; }
  const w = M[0].length, px = Math.max(1, Math.min(3, Math.floor(1000 / w)));
  c.width = LABEL + w * px; c.height = n * ROW;
  const g = c.getContext('2d'), { m, max } = scaleOf(M);
  g.font = '11px ui-monospace, monospace'; g.textAlign = 'right'; g.textBaseline = 'middle'; g.fillStyle = '#444';
  D.tokens.forEach((t, i) => g.fillText(t.length > 10 ? t.slice(0, 9) + '…' : t, LABEL - 6, i * ROW + ROW / 2));
  M.forEach((r, i) => r.forEach((v, j) => { g.fillStyle = color(v, -m, m); g.fillRect(LABEL + j * px, i * ROW, px, ROW); }));
  if (highlight) {
    g.strokeStyle = '#d62728'; g.lineWidth = 2;
    g.strokeRect(LABEL + highlight[0] * px, 1, (highlight[1] - highlight[0]) * px, n * ROW - 2);
  }
  c.dataset.scale = String(m);
  c.title = `${label}: ${n} tokens × ${w} numbers; red positive, blue negative, full colour at ±${m.toFixed(2)} ` +
    `(99% of the values lie within; the largest is ${max.toFixed(2)})`;
  c.onmousemove = (e) => {
    const r = c.getBoundingClientRect(), j = Math.floor((e.clientX - r.left - LABEL) / px), i = Math.floor((e.clientY - r.top) / ROW);
    if (i >= 0 && i < n && j >= 0 && j < w) $('readout').textContent = `${label}[${D.tokens[i]}][${j}] = ${M[i][j]}`;
  };
}

// ------------------------------------------------------------------------------------------- attention
const kv = (h) => Math.floor(h / group);
function scores(h) {
  const q = D.Q[h], k = D.K[kv(h)];
  return q.map((qi) => k.map((kj) => qi.reduce((s, x, d) => s + x * kj[d], 0)));
}
function softmaxRows(S) {
  return S.map((r, i) => {
    const keep = r.map((_, j) => D.mask[i][j]);
    const m = Math.max(...r.filter((_, j) => keep[j]));
    const e = r.map((v, j) => (keep[j] ? Math.exp(v - m) : 0));
    const s = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / s);
  });
}
const weightsOf = (h, t) => softmaxRows(scores(h).map((r) => r.map((v) => v * D.scale / t)));

function render() {
  const S = scores(head), scaled = S.map((r) => r.map((v) => v * D.scale));
  const W = softmaxRows(scaled.map((r) => r.map((v) => v / temperature)));
  const V = D.V[kv(head)], Z = W.map((w) => V[0].map((_, d) => w.reduce((s, x, j) => s + x * V[j][d], 0)));
  const masked = (i, j) => !D.mask[i][j];
  $('which').textContent = `layer ${D.layer} of ${D.layers}, head ${head} of ${D.heads}` +
    (D.kv_heads < D.heads ? ` (keys and values: shared head ${kv(head)} of ${D.kv_heads})` : '');
  table('q', D.Q[head], D.tokens, dims(dk)); table('k', D.K[kv(head)], D.tokens, dims(dk));
  table('v', V, D.tokens, dims(dk));
  if (D.rotated) table('qlin', D.Q_lin[head], D.tokens, dims(dk));
  table('scores', S, D.tokens, D.tokens);
  table('scaled', scaled, D.tokens, D.tokens, { off: masked });
  table('mask', D.mask.map((r) => r.map((v) => (v ? 1 : 0))), D.tokens, D.tokens, { off: masked, weights: true });
  table('weights', W, D.tokens, D.tokens, { off: masked, weights: true });
  table('z', Z, D.tokens, dims(dk));
  strip('concat', D.concat, 'concat', [head * dk, (head + 1) * dk]);
  $('tvalue').textContent = temperature.toFixed(2);
  $('tnote').textContent = temperature === 1 ? 'T = 1: the model\'s own weights'
    : `T = ${temperature.toFixed(2)}: softmax(scores / √d_k / T); ${temperature < 1 ? 'sharper' : 'flatter'} than the model's`;
  document.querySelectorAll('#scores td').forEach((td) => { td.onclick = () => dot(+td.dataset.i, +td.dataset.j); });
  document.querySelectorAll('#grid figure').forEach((f) => f.classList.toggle('pick', +f.dataset.head === head));
}

function dot(i, j) {  // one score, term by term
  const q = D.Q[head][i], k = D.K[kv(head)][j], box = $('dot');
  box.replaceChildren();
  document.querySelectorAll('#scores td.pick').forEach((x) => x.classList.remove('pick'));
  document.querySelector(`#scores td[data-i="${i}"][data-j="${j}"]`).classList.add('pick');
  const sum = q.reduce((s, x, d) => s + x * k[d], 0);
  box.appendChild(el('p', `score(${D.tokens[i]} → ${D.tokens[j]}) = q · k = Σ_d q[d] × k[d] over d_k = ${dk} terms` +
    ` = ${sum.toFixed(6)}; scaled: × 1/√${dk} = ${(sum * D.scale).toFixed(6)}`));
  const t = el('table', undefined, 'm');
  t.id = 'terms';  // one column per dimension d
  [['d', (d) => String(d)], [`q[d] (${D.tokens[i]})`, (d) => q[d].toFixed(3)],
    [`k[d] (${D.tokens[j]})`, (d) => k[d].toFixed(3)], ['q[d] × k[d]', (d) => (q[d] * k[d]).toFixed(3)]]
    .forEach(([name, f], r) => {
      const tr = el('tr');
      tr.appendChild(el('th', name));
      q.forEach((_, d) => {
        const td = el('td', f(d));
        if (r === 3) { td.dataset.v = String(q[d] * k[d]); td.style.background = color(q[d] * k[d], -1, 1); }
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
  const wrap = el('div', undefined, 'wide');
  wrap.appendChild(t);
  box.appendChild(wrap);
}

function grid() {  // every head of the layer: its weights at T = 1, one small square each
  const box = $('grid'), px = Math.max(2, Math.min(12, Math.floor(120 / n)));
  box.replaceChildren();
  for (let h = 0; h < D.heads; h++) {
    const W = weightsOf(h, 1), f = el('figure'), c = el('canvas');
    f.dataset.head = h;
    c.width = n * px; c.height = n * px;
    const g = c.getContext('2d');
    W.forEach((r, i) => r.forEach((v, j) => { g.fillStyle = color(v, 0, 1); g.fillRect(j * px, i * px, px, px); }));
    c.onmousemove = (e) => {
      const r = c.getBoundingClientRect(), j = Math.floor((e.clientX - r.left) / px), i = Math.floor((e.clientY - r.top) / px);
      if (i >= 0 && i < n && j >= 0 && j < n) $('readout').textContent = `head ${h}: ${D.tokens[i]} → ${D.tokens[j]} = ${W[i][j].toFixed(4)}`;
    };
    f.onclick = () => { head = h; $('head').value = String(h); $('dot').replaceChildren(); render(); };
    f.appendChild(c);
    f.appendChild(el('figcaption', `head ${h}`));
    box.appendChild(f);
  }
}

// ------------------------------------------------------------------------------------------- the block
function block() {
  const B = D.block;
  strip('embed', B.embed, 'E[token]');
  $('added-box').hidden = !B.added;
  strip('added', B.added, 'added');
  $('posnote').textContent = {
    rotary: 'Nothing is added to these rows before the first layer: this model gives positions by rotating queries ' +
      'and keys in every layer (step 3).',
    none: 'Nothing is added to these rows before the first layer, and this model has no position encoding.',
    added: 'Before the first layer the model adds a position vector to each row (and may add more, or normalise): ' +
      'the second strip shows what it adds.',
    unknown: 'This model\'s embedding is not read here.',
  }[B.positions];
  $('step-embed').hidden = !B.embed;
  strip('x', D.X, 'X');
  strip('out', D.output, 'MHA(X)');
  const stages = [['pre', 'input'], ['attn_out', 'attention'], ['mlp_out', 'MLP'], ['post', 'output']]
    .filter(([k]) => B.norms[k]);
  $('step-residual').hidden = stages.length < 2;
  if (stages.length) {
    table('norms', D.tokens.map((_, i) => stages.map(([k]) => B.norms[k][i])), D.tokens,
      stages.map(([, name]) => `‖${name}‖`), { weights: true, perColumn: true });
  }
  strip('pre', B.pre, 'input'); strip('post', B.post, 'output');
  $('residualnote').textContent = B.residual === 'sum'
    ? `Here output = input + attention + MLP for every token (checked: within ${B.checks.residual.toExponential(1)} of the stream's size): the norms before attention and the MLP read the stream, they do not change it.`
    : B.residual === 'other' ? 'This model normalises (or scales) the stream after each addition, so the output is not the plain sum ' +
      'of the three: the tutorial\'s "残差 + LayerNorm".' : '';
  $('step-mlp').hidden = !B.mlp_out;
  strip('mlp_in', B.mlp_in, 'MLP input'); strip('hidden', B.hidden, 'hidden'); strip('mlp_out', B.mlp_out, 'MLP output');
  $('mlpnote').textContent = B.hidden ? `Here d_ff = ${B.hidden[0].length} (${(B.hidden[0].length / D.d_model).toFixed(1)} × d_model).` : '';
}

// ------------------------------------------------------------------------------------------- sampling
let logits = null, order = null;
function decode(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new Float32Array(bytes.buffer);
}
function distribution(t, k, p) {  // the same steps as multihead's sampling: / T, top-k, top-p, softmax
  const z = Array.from(order, (i) => logits[i] / t);  // sorted, largest first
  let m = z.length;
  if (k > 0 && k < m) {  // every token at least as likely as the k-th (ties kept, as multihead's top-k keeps them)
    const kth = z[k - 1];
    let j = k;
    while (j < m && z[j] >= kth) j++;
    m = j;
  }
  const soft = (len) => { let s = 0; const e = new Float64Array(len); for (let i = 0; i < len; i++) { e[i] = Math.exp(z[i] - z[0]); s += e[i]; }
    return Array.from(e, (x) => x / s); };
  if (p < 1) {
    const q = soft(m);
    let cum = 0, keep = 0;
    for (; keep < m; keep++) { if (cum >= p) break; cum += q[keep]; }
    m = Math.max(1, keep);
  }
  return { kept: m, probs: soft(m) };
}
function mulberry32(a) {
  return () => { a |= 0; a = (a + 0x6D2B79F5) | 0; let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
}
const shown = (s) => JSON.stringify(s);
function textOf(id) { const r = D.next.top.indexOf(id); return r >= 0 ? shown(D.next.texts[r]) : `token ${id}`; }
function sampling() {
  const t = Math.abs(+$('s-temperature').value) < 1e-9 ? 1 : Math.exp(+$('s-temperature').value);
  const k = Math.max(0, Math.floor(+$('s-topk').value || 0)), p = +$('s-topp').value;
  const { kept, probs } = distribution(t, k, p), model = distribution(1, 0, 1).probs;
  $('s-tvalue').textContent = `T = ${t.toFixed(2)}`;
  $('s-pvalue').textContent = `p = ${p.toFixed(2)}`;
  let mass = 0;
  for (let i = 0; i < kept; i++) mass += model[i];
  $('kept').textContent = `${kept} of ${logits.length} tokens kept (${(100 * mass).toFixed(1)}% of the model's own ` +
    `probability at T = 1); greedy decoding picks ${textOf(order[0])}.`;
  const rows = Math.min(15, D.next.top.length), t0 = $('probs');
  t0.replaceChildren();
  const top = el('tr');
  ['rank', 'token', 'logit', 'p (model)', 'p (sampled from)'].forEach((h) => top.appendChild(el('th', h)));
  t0.appendChild(top);
  for (let r = 0; r < rows; r++) {
    const id = order[r], tr = el('tr', undefined, r < kept ? '' : 'dropped');
    tr.dataset.id = id; tr.dataset.p = String(r < kept ? probs[r] : 0);
    [String(r + 1), textOf(id), logits[id].toFixed(3), (100 * model[r]).toFixed(2) + '%',
      r < kept ? (100 * probs[r]).toFixed(2) + '%' : 'dropped'].forEach((v, c) => {
      const td = el('td', v);
      if (c === 4 && r < kept) td.style.background = color(probs[r], 0, 1);
      tr.appendChild(td);
    });
    t0.appendChild(tr);
  }
  return { kept, probs };
}
function sample() {
  const { kept, probs } = sampling(), u = mulberry32(+$('s-seed').value || 0)();
  let r = 0, cum = probs[0];
  while (cum < u && r < kept - 1) { r++; cum += probs[r]; }
  $('sampled').textContent = `sampled (seed ${+$('s-seed').value || 0}, u = ${u.toFixed(4)}): ${textOf(order[r])}, ` +
    `p = ${(100 * probs[r]).toFixed(2)}%`;
  $('sampled').dataset.id = order[r];
}

// ------------------------------------------------------------------------------------------- the page
function show(data) {
  D = data; n = D.tokens.length; dk = D.d_k; group = D.heads / D.kv_heads; head = D.head;
  $('title').textContent = `${D.model}: one transformer block, step by step`;
  $('text').textContent = `“${D.text}” → ${n} tokens: ` + D.tokens.join(' · ');
  $('why').textContent = D.why;
  const box = $('roletest');
  box.replaceChildren();
  box.hidden = !D.role_test;
  if (D.role_test) {  // the sentences the head was tested on, and its two scores
    const t = D.role_test;
    box.appendChild(el('summary', `The test: ${t.links} determiners in ${t.sentences.length} sentences where the noun is ` +
      `never the next word; this head: noun ${(100 * t.noun).toFixed(0)}%, adjacent word ${(100 * t.adjacent).toFixed(0)}% (passes if ${t.rule})`));
    const list = el('ol');
    t.sentences.forEach((x) => list.appendChild(el('li', x)));
    box.appendChild(list);
  }
  $('sizes').textContent = `d_model = ${D.d_model}, h = ${D.heads} heads, d_k = ${dk}, L = ${n} tokens`;
  $('shape-x').textContent = `X: (L, d_model) = (${n}, ${D.d_model})`;
  $('shape-qkv').textContent = `X (${n}×${D.d_model}) · W_Q (${D.d_model}×${D.heads * dk}) → (${n}×${D.heads * dk}) → ` +
    `reshape (h, L, d_k) = (${D.heads}, ${n}, ${dk})` +
    (D.kv_heads < D.heads ? `; K and V: (${D.kv_heads}, ${n}, ${dk}), one per group of ${group} query heads (GQA)` : '');
  $('rot').hidden = !D.rotated;
  $('shape-concat').textContent = `(h, L, d_k) = (${D.heads}, ${n}, ${dk}) → transpose, reshape → (L, h·d_k) = ` +
    `(${n}, ${D.heads * dk}); this head's slice outlined`;
  $('shape-wo').textContent = `Concat (${n}×${D.heads * dk}) · W_O (${D.heads * dk}×${D.d_model}) → (${n}×${D.d_model})`;
  $('checks').textContent = `checked against the model: weights within ${D.checks.weights.toExponential(1)}, ` +
    `concatenation within ${D.checks.concat.toExponential(1)}, output within ${D.checks.output.toExponential(1)}`;
  $('masknote').textContent = D.causal ? 'causal: each token attends to itself and the tokens before it (the ' +
    'tutorial\'s subsequent mask); masked scores become −∞, so their weights are 0'
    : 'every token may attend to every token (one sentence, no padding): nothing is masked here';
  const sel = $('head');
  sel.replaceChildren();
  for (let h = 0; h < D.heads; h++) {
    const o = el('option', `head ${h}`);
    o.value = h; o.selected = h === head;
    sel.appendChild(o);
  }
  const pick = $('layer-pick');
  if (pick && pick.options.length === 1) {
    for (let l = 0; l < D.layers; l++) { const o = el('option', `layer ${l}`); o.value = l; pick.appendChild(o); }
  }
  block();
  grid();
  render();
  dot(1 < n ? 1 : 0, 2 < n ? 2 : 0);
  $('step-next').hidden = !D.next;
  if (D.next) {
    logits = decode(D.next.logits);
    order = Uint32Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a] || a - b);
    $('vocab').textContent = String(D.next.vocab);
    sampling();
    $('sampled').textContent = '';
  }
  document.body.dataset.ready = '1';
}

$('head').onchange = () => { head = +$('head').value; $('dot').replaceChildren(); render(); };
$('temperature').oninput = () => {
  const s = +$('temperature').value;
  temperature = Math.abs(s) < 1e-9 ? 1 : Math.exp(s);
  render();
};
['s-temperature', 's-topk', 's-topp'].forEach((id) => { $(id).oninput = () => { if (D.next) sampling(); }; });
$('sample').onclick = () => { if (D.next) sample(); };

const ask = $('ask');
if (ask) {  // served: the model recomputes every step for the reader's text
  ask.onsubmit = async (e) => {
    e.preventDefault();
    const text = $('input').value, layer = $('layer-pick').value;
    if (!text.trim()) { $('error').textContent = 'type some text to explain'; $('error').hidden = false; return; }
    document.body.dataset.ready = '0';
    $('status').textContent = 'the model is reading it…';
    $('error').hidden = true;
    try {
      const r = await fetch('api/explain', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ text, layer: layer === '' ? null : +layer }),
      });
      const answer = await r.json();
      if (!r.ok) throw new Error(answer.error || `the server answered ${r.status}`);
      temperature = 1; $('temperature').value = '0';
      show(answer.data);
      $('status').textContent = `computed by the model in ${answer.seconds.toFixed(2)} s`;
    } catch (err) {
      $('error').textContent = String(err.message || err);
      $('error').hidden = false;
      $('status').textContent = '';
      document.body.dataset.ready = '1';
    }
  };
}
const initial = JSON.parse($('data').textContent);
if (ask) $('input').value = initial.text;
show(initial);
