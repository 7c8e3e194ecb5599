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
const ask = $('ask');  // the served page's form (null on a page written to a file)

function rgb(v, lo, hi) {  // diverging for signed values, white -> blue for weights: [r, g, b]
  if (lo >= 0) {
    const t = hi > 0 ? v / hi : 0, c = Math.round(255 - 180 * t);
    return [c, c + 20 > 255 ? 255 : c + 20, 255];
  }
  const m = Math.max(-lo, hi) || 1, t = Math.max(-1, Math.min(1, v / m));
  return t >= 0 ? [255, Math.round(255 - 150 * t), Math.round(255 - 150 * t)]
    : [Math.round(255 + 150 * t), Math.round(255 + 150 * t), 255];
}
const color = (v, lo, hi) => { const [r, g, b] = rgb(v, lo, hi); return `rgb(${r},${g},${b})`; };

// A matrix of at most TABLE_CELLS numbers is a table (every cell's exact value in data-v); a larger one is drawn as
// pixels, one per number, read by hovering: a table of L×L cells at a few hundred tokens freezes the tab.
const TABLE_CELLS = 1600;
function paint(M, cols, colorOf) {  // an offscreen canvas, one pixel per number
  const rows = M.length, c = document.createElement('canvas');
  c.width = Math.max(1, cols); c.height = Math.max(1, rows);
  const g = c.getContext('2d'), img = g.createImageData(c.width, c.height);
  for (let i = 0; i < rows; i++) {
    const r = M[i];
    for (let j = 0; j < cols; j++) {
      const [R, G, B] = colorOf(r[j], i, j), o = 4 * (i * cols + j);
      img.data[o] = R; img.data[o + 1] = G; img.data[o + 2] = B; img.data[o + 3] = 255;
    }
  }
  g.putImageData(img, 0, 0);
  return c;
}
function table(id, M, rows, cols, opts = {}) {  // a matrix as a table, or as pixels when it is large
  const t = $(id);
  let lo = Infinity, hi = -Infinity;
  M.forEach((r, i) => r.forEach((v, j) => {
    if (!opts.off || !opts.off(i, j)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }));
  if (opts.weights) lo = 0;
  const top_ = opts.perColumn ? cols.map((_, j) => Math.max(...M.filter((_, i) => !(opts.skipRow && opts.skipRow(i))).map((r) => r[j]))) : null;
  const shade = (v, i, j) => (opts.off && opts.off(i, j) ? [247, 247, 247] : top_ ? rgb(Math.min(v, top_[j]), 0, top_[j]) : rgb(v, lo, hi));
  let map = $(id + '-map');
  if (M.length * cols.length > TABLE_CELLS) {
    t.replaceChildren(); t.hidden = true;
    if (!map) { map = el('canvas', undefined, 'map'); map.id = id + '-map'; t.after(map); }
    map.hidden = false;
    const px = Math.max(1, Math.min(8, Math.floor(900 / cols.length)));
    map.width = cols.length * px; map.height = M.length * px;
    const g = map.getContext('2d');
    g.imageSmoothingEnabled = false;
    g.drawImage(paint(M, cols.length, shade), 0, 0, map.width, map.height);
    map.title = `${rows.length} × ${cols.length}: hover to read a value${opts.onpick ? ', click to pick one' : ''}`;
    const at = (e) => { const r = map.getBoundingClientRect();
      return [Math.floor((e.clientY - r.top) * M.length / r.height), Math.floor((e.clientX - r.left) * cols.length / r.width)]; };
    map.onmousemove = (e) => {
      const [i, j] = at(e);
      if (i >= 0 && i < M.length && j >= 0 && j < cols.length) {
        $('readout').textContent = `${rows[i]} / ${cols[j]}: ${opts.off && opts.off(i, j) ? 'masked' : M[i][j]}`;
      }
    };
    map.onclick = opts.onpick ? (e) => { const [i, j] = at(e); if (i >= 0 && i < M.length && j >= 0 && j < cols.length) opts.onpick(i, j); } : null;
    return;
  }
  if (map) map.hidden = true;
  t.hidden = false;
  t.replaceChildren();
  const top = el('tr');
  top.appendChild(el('th', ''));
  cols.forEach((c) => top.appendChild(el('th', c)));
  t.appendChild(top);
  M.forEach((r, i) => {
    const tr = el('tr');
    tr.appendChild(el('th', rows[i]));
    r.forEach((v, j) => {
      const off = opts.off && opts.off(i, j);
      const td = el('td', off ? '−∞' : fmt(v), off ? 'off' : '');
      td.dataset.v = String(v); td.dataset.i = i; td.dataset.j = j;
      if (!off) { const [R, G, B] = shade(v, i, j); td.style.background = `rgb(${R},${G},${B})`; }
      if (opts.skipRow && opts.skipRow(i)) td.classList.add('sink');
      td.title = off ? 'masked' : `${rows[i]} / ${cols[j]}: ${v}`;
      if (opts.onpick) td.onclick = () => opts.onpick(i, j);
      tr.appendChild(td);
    });
    t.appendChild(tr);
  });
}

// ------------------------------------------------------------------------------------------- the pictures
// The strips (one row per token, d_model or d_ff numbers wide) come with the page when it is a file, and from the
// server when their step scrolls into view when it is served (GET api/strip).
function decode(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new Float32Array(bytes.buffer);
}
function unpack(p, plain) {  // packed float32 -> rows (plain: Arrays of numbers, for the page's arithmetic)
  if (!p) return null;
  const f = decode(p.f32), s = p.shape, w = s[s.length - 1], rows = [];
  for (let i = 0; i < f.length / w; i++) { const r = f.subarray(i * w, (i + 1) * w); rows.push(plain ? Array.from(r) : r); }
  if (s.length === 2) return rows;
  const per = s[s.length - 2];
  return Array.from({ length: rows.length / per }, (_, h) => rows.slice(h * per, (h + 1) * per));
}
const fetched = new Map();
function picture(name) {  // a strip's rows (null where the model has no such step), fetched once per answer
  if (D.strips) return Promise.resolve(unpack(D.strips[name]));
  const key = `${D.answer}/${name}`;
  if (!fetched.has(key)) {
    fetched.set(key, fetch(`api/strip?answer=${encodeURIComponent(D.answer)}&name=${encodeURIComponent(name)}`)
      .then(async (r) => { const a = await r.json(); if (!r.ok) throw new Error(a.error || `the server answered ${r.status}`); return unpack(a.strip); }));
  }
  return fetched.get(key);
}

const LABEL = 80;  // a strip's token column (px)
const rowHeight = () => (n <= 60 ? 14 : Math.max(2, Math.floor(840 / n)));  // labelled rows up to 60 tokens
const sinkRow = (i) => D.sinks && D.sinks.tokens.includes(i);
function scaleOf(M) {  // the 99th percentile of |v| outside the sink rows: an attention sink's huge coordinates
  const a = [];       // must not wash out every other token's
  M.forEach((r, i) => { if (!sinkRow(i) || M.length === 1) r.forEach((v) => a.push(Math.abs(v))); });
  a.sort((x, y) => x - y);
  return { m: a[Math.min(a.length - 1, Math.floor(0.99 * a.length))] || 1, max: a[a.length - 1] || 0 };
}
function strip(id, M, label, highlight) {  // a wide matrix as pixels: one labelled row per token, hover reads a value
  const c = $(id);
  if (!M) { c.width = 0; c.height = 0; c.dataset.drawn = 'nothing'; return; }
  const w = M[0].length, px = Math.max(1, Math.min(3, Math.floor(1000 / w))), ROW = rowHeight();
  c.width = LABEL + w * px; c.height = n * ROW;
  const g = c.getContext('2d'), { m, max } = scaleOf(M);
  g.imageSmoothingEnabled = false;
  g.drawImage(paint(M, w, (v) => rgb(v, -m, m)), LABEL, 0, w * px, n * ROW);
  g.font = '11px ui-monospace, monospace'; g.textAlign = 'right'; g.textBaseline = 'middle'; g.fillStyle = '#444';
  if (ROW >= 10) D.tokens.forEach((t, i) => g.fillText((sinkRow(i) ? '⚓' : '') + (t.length > 10 ? t.slice(0, 9) + '…' : t), LABEL - 6, i * ROW + ROW / 2));
  if (highlight) {
    g.strokeStyle = '#d62728'; g.lineWidth = 2;
    g.strokeRect(LABEL + highlight[0] * px, 1, (highlight[1] - highlight[0]) * px, n * ROW - 2);
  }
  c.dataset.scale = String(m);
  c.dataset.drawn = label;
  c.title = `${label}: ${n} tokens × ${w} numbers; red positive, blue negative, full colour at ±${m.toFixed(2)} ` +
    `(99% of the values lie within${D.sinks ? ', sink rows left out' : ''}; the largest is ${max.toFixed(2)})`;
  c.onmousemove = (e) => {
    const r = c.getBoundingClientRect(), j = Math.floor((e.clientX - r.left - LABEL) / px), i = Math.floor((e.clientY - r.top) / ROW);
    if (i >= 0 && i < n && j >= 0 && j < w) $('readout').textContent = `${label}[${D.tokens[i]}][${j}] = ${M[i][j]}`;
  };
}
const STRIPS = { x: ['X', 'X'], concat: ['concat', 'concat'], out: ['output', 'MHA(X)'], embed: ['block.embed', 'E[token]'],
  added: ['block.added', 'added'], pre: ['block.pre', 'input'], post: ['block.post', 'output'],
  mlp_in: ['block.mlp_in', 'MLP input'], hidden: ['block.hidden', 'hidden'], mlp_out: ['block.mlp_out', 'MLP output'] };
let watcher = null, drawing = 0;  // drawing: the answer whose pictures are drawn (a later answer cancels earlier draws)
function later() {  // draw each strip when it scrolls into view
  if (watcher) watcher.disconnect();
  const answer = ++drawing;
  watcher = new IntersectionObserver((seen) => seen.forEach((e) => {
    if (!e.isIntersecting) return;
    watcher.unobserve(e.target);
    const id = e.target.id;
    if (id === 'grid') { grid(); return; }
    const [name, label] = STRIPS[id];
    picture(name).then((M) => {
      if (answer !== drawing) return;
      strip(id, M, label, id === 'concat' ? [head * dk, (head + 1) * dk] : null);
    }).catch((err) => { $('error').textContent = String(err.message || err); $('error').hidden = false; });
  }), { rootMargin: '400px' });
  Object.keys(STRIPS).forEach((id) => { const c = $(id); c.width = 0; c.height = 0; delete c.dataset.drawn; watcher.observe(c); });
  $('grid').replaceChildren(); delete $('grid').dataset.drawn;
  watcher.observe($('grid'));
}

// ------------------------------------------------------------------------------------------- attention
const kv = (h) => Math.floor(h / group);
const open = (i, j) => !D.causal || j <= i;  // the mask: causal, or every token sees every token
function scores(h) {
  const q = D.Q[h], k = D.K[kv(h)];
  return q.map((qi) => k.map((kj) => qi.reduce((s, x, d) => s + x * kj[d], 0)));
}
function softmaxRows(S) {
  return S.map((r, i) => {
    const keep = r.map((_, j) => open(i, j));
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
  const masked = (i, j) => !open(i, j);
  $('which').textContent = `layer ${D.layer} of ${D.layers}, head ${head} of ${D.heads}` +
    (D.kv_heads < D.heads ? ` (keys and values: shared head ${kv(head)} of ${D.kv_heads})` : '');
  table('q', D.Q[head], D.tokens, dims(dk)); table('k', D.K[kv(head)], D.tokens, dims(dk));
  table('v', V, D.tokens, dims(dk));
  if (D.rotated) table('qlin', D.Q_lin[head], D.tokens, dims(dk));
  table('scores', S, D.tokens, D.tokens, { onpick: dot });
  table('scaled', scaled, D.tokens, D.tokens, { off: masked });
  table('mask', D.tokens.map((_, i) => D.tokens.map((_, j) => (open(i, j) ? 1 : 0))), D.tokens, D.tokens, { off: masked, weights: true });
  table('weights', W, D.tokens, D.tokens, { off: masked, weights: true });
  table('z', Z, D.tokens, dims(dk));
  if ($('concat').dataset.drawn) picture('concat').then((M) => strip('concat', M, 'concat', [head * dk, (head + 1) * dk]));
  $('tvalue').textContent = temperature.toFixed(2);
  $('tnote').textContent = temperature === 1 ? 'T = 1: the model\'s own weights'
    : `T = ${temperature.toFixed(2)}: softmax(scores / √d_k / T); ${temperature < 1 ? 'sharper' : 'flatter'} than the model's`;
  document.querySelectorAll('#grid figure').forEach((f) => f.classList.toggle('pick', +f.dataset.head === head));
}

function dot(i, j) {  // one score, term by term
  const q = D.Q[head][i], k = D.K[kv(head)][j], box = $('dot');
  box.replaceChildren();
  document.querySelectorAll('#scores td.pick').forEach((x) => x.classList.remove('pick'));
  const cell = document.querySelector(`#scores td[data-i="${i}"][data-j="${j}"]`);
  if (cell) cell.classList.add('pick');
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

function grid() {  // every head of the layer: its weights at T = 1, one small square each (a pixel per weight)
  const box = $('grid'), size = Math.max(96, Math.min(12 * n, 160));
  box.replaceChildren();
  for (let h = 0; h < D.heads; h++) {
    const W = weightsOf(h, 1), f = el('figure'), c = el('canvas');
    f.dataset.head = h;
    c.width = n; c.height = n; c.style.width = `${size}px`; c.style.height = `${size}px`;
    c.getContext('2d').drawImage(paint(W, n, (v) => rgb(v, 0, 1)), 0, 0);
    c.onmousemove = (e) => {
      const r = c.getBoundingClientRect(), j = Math.floor((e.clientX - r.left) * n / r.width), i = Math.floor((e.clientY - r.top) * n / r.height);
      if (i >= 0 && i < n && j >= 0 && j < n) $('readout').textContent = `head ${h}: ${D.tokens[i]} → ${D.tokens[j]} = ${W[i][j].toFixed(4)}`;
    };
    f.onclick = () => { head = h; $('head').value = String(h); $('dot').replaceChildren(); render(); };
    f.appendChild(c);
    f.appendChild(el('figcaption', `head ${h}` + (D.sinks ? ` · ⚓ ${pct(D.sinks.share[h])}` : '')));
    box.appendChild(f);
  }
  box.dataset.drawn = '1';
  render();
}

// ------------------------------------------------------------------------------------------- the block
function block() {
  const B = D.block;
  $('added-box').hidden = !B.has.added;
  $('posnote').textContent = {
    rotary: 'Nothing is added to these rows before the first layer: this model gives positions by rotating queries ' +
      'and keys in every layer (step 3).',
    none: 'Nothing is added to these rows before the first layer, and this model has no position encoding.',
    added: 'Before the first layer the model adds a position vector to each row (and may add more, or normalise): ' +
      'the second strip shows what it adds.',
    unknown: 'This model\'s embedding is not read here.',
  }[B.positions];
  $('step-embed').hidden = !B.has.embed;
  const stages = [['pre', 'input'], ['attn_out', 'attention'], ['mlp_out', 'MLP'], ['post', 'output']]
    .filter(([k]) => B.norms[k]);
  $('step-residual').hidden = stages.length < 2;
  if (stages.length) {
    table('norms', D.tokens.map((_, i) => stages.map(([k]) => B.norms[k][i])), D.tokens,
      stages.map(([, name]) => `‖${name}‖`), { weights: true, perColumn: true, skipRow: sinkRow });
  }
  $('residualnote').textContent = B.residual === 'sum'
    ? `Here output = input + attention + MLP for every token (checked: within ${B.checks.residual.toExponential(1)} of the stream's size): the norms before attention and the MLP read the stream, they do not change it.`
    : B.residual === 'other' ? 'This model normalises (or scales) the stream after each addition, so the output is not the plain sum ' +
      'of the three: the tutorial\'s "残差 + LayerNorm".' : '';
  $('step-mlp').hidden = !B.has.mlp_out;
  $('mlpnote').textContent = B.d_ff ? `Here d_ff = ${B.d_ff} (${(B.d_ff / D.d_model).toFixed(1)} × d_model).` : '';
}

// ------------------------------------------------------------------------------------------- sampling
let logits = null, order = null;
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
function pick(seed) {  // the token sampled with the page's settings and a seed: its rank in order, and u
  const { kept, probs } = sampling(), u = mulberry32(seed)();
  let r = 0, cum = probs[0];
  while (cum < u && r < kept - 1) { r++; cum += probs[r]; }
  return { r, u, probs, kept };
}
function sample() {
  const seed = +$('s-seed').value || 0, { r, u, probs } = pick(seed);
  $('sampled').textContent = `sampled (seed ${seed}, u = ${u.toFixed(4)}): ${textOf(order[r])}, ` +
    `p = ${(100 * probs[r]).toFixed(2)}%`;
  $('sampled').dataset.id = order[r];
}

// ------------------------------------------------------------------------------------------- the whole model
const pct = (x) => `${(100 * x).toFixed(0)}%`;
function sinks() {  // what an attention sink is, from this layer's own numbers
  const S = D.sinks, box = $('sinks');
  box.replaceChildren();
  box.hidden = !S;
  if (!S) return;
  const who = S.tokens.map((i) => `“${D.tokens[i]}” (token ${i})`).join(', ');
  const mean = S.share.reduce((a, b) => a + b, 0) / S.share.length;
  const vmin = Math.min(...S.value), vmax = Math.max(...S.value);
  box.appendChild(el('strong', '⚓ An attention sink. '));
  box.appendChild(document.createTextNode(
    `${who} enters this layer with a residual stream of length ${S.norms.map((x) => x.toFixed(0)).join(', ')}, ` +
    `${(Math.max(...S.norms) / S.median).toFixed(0)}× the median token's (${S.median.toFixed(0)}). ` +
    `${S.heads} of ${D.heads} heads give it more than half of their attention (on average over the other tokens; ` +
    `all heads: ${pct(mean)}), where an even spread over the keys each token may see would give it ${pct(S.even)}. `));
  if (mean > S.even && vmax < 1) {
    box.appendChild(document.createTextNode(
      `Its value vectors are ${vmin.toFixed(2)}–${vmax.toFixed(2)}× as long as the median token's, so attending to it ` +
      'writes little: a head that finds nothing useful must still put weights summing to 1 somewhere, and the model ' +
      'learned to park them on this token (Xiao et al., 2023, “Efficient Streaming Language Models with Attention Sinks”). '));
  } else {
    box.appendChild(document.createTextNode('Here its value vectors are not shorter than the other tokens\', so the ' +
      'usual reading (a place to park attention that writes little) does not hold for this layer. '));
  }
  box.appendChild(document.createTextNode('The colour scales of the strips and of the norms table leave its row out, ' +
    'so the other tokens stay readable; it is marked ⚓.'));
}
function u8(p) { const b = Uint8Array.from(atob(p.u8), (c) => c.charCodeAt(0)); return b; }
function overview() {
  const O = D.overview, flow = $('flow');
  flow.replaceChildren();
  flow.className = 'note flow';
  [`${n} tokens`, `embedding: one row of ${D.d_model} per token`,
    `${D.layers} blocks, each: attention (${D.heads} heads of ${dk}) + MLP${D.block.d_ff ? ` (${D.block.d_ff} wide)` : ''}`,
    D.next ? `logits over ${D.next.vocab} tokens → the next token` : 'one vector per token (an encoder)']
    .forEach((t, i) => { if (i) flow.appendChild(document.createTextNode(' → ')); flow.appendChild(el('span', t)); });
  const box = $('layers'), side = O.side;
  box.replaceChildren();
  O.squares.forEach((sq, l) => {
    const row = el('div', undefined, 'row' + (l === D.layer ? ' pick' : '') + (ask ? ' ask' : ''));
    row.dataset.layer = l;
    row.appendChild(el('span', `layer ${l}`, 'name'));
    const bytes = u8(sq), H = sq.shape[0];
    for (let h = 0; h < H; h++) {
      const M = Array.from({ length: side }, (_, i) => bytes.subarray((h * side + i) * side, (h * side + i + 1) * side));
      const c = el('canvas');
      c.width = side; c.height = side;
      c.getContext('2d').drawImage(paint(M, side, (v) => rgb(v / 255, 0, 1)), 0, 0);
      c.title = `layer ${l}, head ${h}` + (D.sinks && l === D.layer ? `: ${pct(D.sinks.share[h])} of its attention on the sink` : '');
      row.appendChild(c);
    }
    if (ask && l !== D.layer) row.onclick = () => { $('layer-pick').value = String(l); ask.requestSubmit(); };
    box.appendChild(row);
  });
  const c = $('lengths');
  if (!O.norms) { c.width = 0; c.height = 0; return; }
  const N = unpack(O.norms), L = N.length, px = Math.max(1, Math.min(16, Math.floor(1000 / n))), ROW = 10;
  const logs = N.map((r) => Array.from(r, (v) => Math.log10(Math.max(v, 1e-6))));
  const lo = Math.min(...logs.map((r) => Math.min(...r))), hi = Math.max(...logs.map((r) => Math.max(...r)));
  c.width = LABEL + n * px; c.height = L * ROW;
  const g = c.getContext('2d');
  g.imageSmoothingEnabled = false;
  g.drawImage(paint(logs, n, (v) => rgb(v - lo, 0, hi - lo || 1)), LABEL, 0, n * px, L * ROW);
  g.font = '10px ui-monospace, monospace'; g.textAlign = 'right'; g.textBaseline = 'middle'; g.fillStyle = '#444';
  for (let l = 0; l < L; l++) g.fillText(l < L - 1 ? `into ${l}` : 'out', LABEL - 6, l * ROW + ROW / 2);
  c.onmousemove = (e) => {
    const r = c.getBoundingClientRect(), j = Math.floor((e.clientX - r.left - LABEL) / px), i = Math.floor((e.clientY - r.top) / ROW);
    if (i >= 0 && i < L && j >= 0 && j < n) {
      $('readout').textContent = `‖x‖ of ${D.tokens[j]} ${i < L - 1 ? `entering layer ${i}` : 'leaving the last layer'} = ${N[i][j].toFixed(2)}`;
    }
  };
}

// ------------------------------------------------------------------------------------------- the page
function show(data) {
  D = data; fetched.clear(); n = D.tokens.length; dk = D.d_k; group = D.heads / D.kv_heads; head = D.head;
  ['Q', 'K', 'V', 'Q_lin', 'K_lin'].forEach((k) => { if (D[k] && D[k].f32) D[k] = unpack(D[k], true); });
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
  sinks();
  overview();
  render();
  later();
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

async function asked(body) {  // the server's answer to a question, or an Error with what it said
  const r = await fetch('api/explain', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const answer = await r.json();
  if (!r.ok) throw new Error(answer.error || `the server answered ${r.status}`);
  return answer;
}
function failed(err) {
  $('error').textContent = String(err.message || err);
  $('error').hidden = false;
  $('status').textContent = '';
  document.body.dataset.ready = '1';
}
if (ask) {  // served: the model recomputes every step for the reader's text
  ask.onsubmit = async (e) => {
    e.preventDefault();
    const text = $('input').value, layer = $('layer-pick').value;
    if (!text.trim()) { $('error').textContent = 'type some text to explain'; $('error').hidden = false; return; }
    document.body.dataset.ready = '0';
    $('status').textContent = 'the model is reading it…';
    $('error').hidden = true;
    try {
      const answer = await asked({ text, layer: layer === '' ? null : +layer });
      temperature = 1; $('temperature').value = '0';
      show(answer.data);
      $('status').textContent = `computed by the model in ${answer.seconds.toFixed(2)} s`;
    } catch (err) { failed(err); }
  };
  const gen = $('generate');
  if (gen) {
    gen.onclick = async () => {  // the generate loop: pick, append, run the model again, for every token asked
      const steps = Math.max(1, Math.min(64, Math.floor(+$('g-steps').value || 1))), log = $('g-log');
      gen.disabled = true; log.replaceChildren(); $('error').hidden = true;
      document.body.dataset.ready = '0';
      try {
        for (let s = 0; s < steps && D.next; s++) {
          const { r, probs, kept } = pick((+$('s-seed').value || 0) + s), id = order[r], said = textOf(id);
          $('g-status').textContent = `step ${s + 1} of ${steps}: appending ${said}, the model is reading the longer text…`;
          const layer = $('layer-pick').value;
          const answer = await asked({ text: D.text, layer: layer === '' ? null : +layer, next: id });
          const li = el('li', `${said}: p = ${(100 * probs[r]).toFixed(1)}% of the ${kept} token${kept > 1 ? 's' : ''} kept ` +
            `(computed in ${answer.seconds.toFixed(2)} s)`);
          li.dataset.id = id;
          log.appendChild(li);
          show(answer.data);
          $('input').value = D.text;
        }
        $('g-status').textContent = `${log.children.length} tokens generated; the page shows the last step`;
        document.body.dataset.ready = '1';
      } catch (err) { failed(err); } finally { gen.disabled = false; }
    };
  }
}
const initial = JSON.parse($('data').textContent);
if (ask) $('input').value = initial.text;
show(initial);
