"""One self-contained HTML file to explore attention: no CDN, no network, opens from disk.

* **Head view** -- the tokens in two columns (queries left, keys right); a line per link, its opacity the weight;
  heads toggled by colour; hover a token to see only its links.
* **Model view** -- a thumbnail of every layer x head; click one to open it in the head view.
* **Image view** (pages of image models) -- the picture; hover a patch (a ViT's self-attention) or a word of the
  question (text-to-image cross-attention) and every head of the layer shows, over the picture, where it looks.

Weights travel as 8-bit quantised, base64-encoded matrices inside a ``<script type="application/json">`` block
(``<``, ``>`` and ``&`` are escaped as ``\\u003c`` ... so no token can close the block), and the script only ever
inserts tokens with ``textContent``: text such as ``<img src=x onerror=alert(1)>`` shows as text and runs nothing.

One module over the usual size on purpose: the page's HTML, its inline script and the data it embeds are
written together and must agree field by field.
"""

from __future__ import annotations

from ..._io import atomic_write_text

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ...modules.capture import capture
from ..maps import AttentionMaps, Subject

STYLE = """
[hidden] { display: none !important; }
body { font-family: system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; } #text { color: #555; margin: 0 0 10px; white-space: pre-wrap; }
nav { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; margin-bottom: 8px; }
button.tab { padding: 4px 10px; border: 1px solid #999; background: #f4f4f4; cursor: pointer; }
button.tab.active { background: #333; color: #fff; }
#how { font-size: 13px; color: #444; margin: 0 0 8px; max-width: 900px; } #how summary { cursor: pointer; }
#heads { display: flex; flex-wrap: wrap; gap: 4px; margin: 6px 0; }
#heads label { padding: 2px 6px; border-radius: 3px; color: #fff; cursor: pointer; font-size: 12px; user-select: none; }
#heads label.off { opacity: 0.25; }
#lines text { font-size: 13px; cursor: default; } #links { pointer-events: none; } #lines text.focus { font-weight: bold; }
#grid { display: grid; gap: 6px; } .cell { text-align: center; font-size: 10px; cursor: pointer; }
.cell canvas { width: 72px; height: 72px; image-rendering: pixelated; border: 1px solid #ccc; display: block; }
.cell.hl canvas { border: 2px solid #d62728; } #found button { margin: 2px; }
#headmap-frame { width: 480px; height: 480px; max-width: 90vw; overflow: auto; border: 1px solid #ccc;
cursor: grab; background: #fff; } #headmap-frame.drag { cursor: grabbing; }
#headmap-canvas { display: block; image-rendering: pixelated; }
#headmap p { font-size: 12px; margin: 4px 0; } #headmap button { margin-right: 4px; min-width: 28px; }
#image-view { display: flex; gap: 16px; flex-wrap: wrap; } #picture { width: 280px; height: 280px;
image-rendering: pixelated; border: 1px solid #999; cursor: crosshair; }
#image-heads { display: flex; flex-wrap: wrap; gap: 8px; align-content: flex-start; max-width: 760px; }
#image-heads canvas { width: 168px; height: 168px; image-rendering: pixelated; border: 1px solid #ccc; display: block; }
#image-queries span { display: inline-block; padding: 2px 6px; margin: 2px; border: 1px solid #bbb; cursor: default; }
#image-queries span.focus { background: #333; color: #fff; }
#image-caption { font-size: 13px; margin: 6px 0; max-width: 720px; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("data").textContent);
  const KT = D.key_tokens || D.tokens;  // cross-attention: keys are another sequence (e.g. letters)
  const NQ = D.tokens.length, NK = KT.length, N = Math.max(NQ, NK), ROW = 20, cache = {};
  let layer = 0, selected = new Set(), focus = null;
  function thumb(l, h) {  // links mode: the head's map averaged over bins, scaled to its largest bin
    const bin = atob(D.thumbs[l][h]), out = new Float32Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i) / 255;
    return out;
  }
  function weights(l, h) {  // Float32Array NQ*NK, row-major: query rows, key columns
    const key = l + ":" + h;
    if (!cache[key]) {
      const bin = atob(D.weights[l][h]), out = new Float32Array(bin.length);
      for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i) / 255;
      cache[key] = out;
    }
    return cache[key];
  }
  const LINKS = D.mode === "links";  // long inputs: top-k links per query and a thumbnail per head, no full maps
  const lcache = {};
  function links(l, h) {  // {idx: Uint16Array NQ*K, w: Float32Array NQ*K}, best first per row
    const key = l + ":" + h;
    if (!lcache[key]) {
      const bi = atob(D.links[l][h].i), bw = atob(D.links[l][h].w);
      const idx = new Uint16Array(bw.length), w = new Float32Array(bw.length);
      for (let p = 0; p < bw.length; p++) {
        idx[p] = bi.charCodeAt(2 * p) | (bi.charCodeAt(2 * p + 1) << 8);
        const x = bw.charCodeAt(p) / 255;
        w[p] = x * x;  // stored as round(255 sqrt(w)): weights of 1e-4 (long inputs) survive 8 bits
      }
      lcache[key] = {idx: idx, w: w};
    }
    return lcache[key];
  }
  function rowLinks(l, h, i, limit) {  // [[key, weight], ...] of query i, largest first
    if (LINKS) {
      const L = links(l, h), out = [];
      for (let t = 0; t < D.k && out.length < limit; t++) out.push([L.idx[i * D.k + t], L.w[i * D.k + t]]);
      return out;
    }
    const w = weights(l, h), row = Array.from(w.subarray(i * NK, (i + 1) * NK));
    return row.map((v, j) => [j, v]).sort((a, b) => b[1] - a[1]).slice(0, limit);
  }
  function colour(h, n) { return "hsl(" + Math.round(360 * h / Math.max(1, n)) + ",70%,45%)"; }
  function el(tag, attrs, text) {
    const e = tag === "svg" || tag === "line" || tag === "text" || tag === "g"
      ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;  // never innerHTML: tokens stay text
    return e;
  }
  function setLayer(l) {
    layer = l;
    document.getElementById("layer").value = String(l);
    selected = new Set([...Array(D.heads[l]).keys()]);
    drawHeads(); drawLines();
  }
  function showHead(l, h) {
    setLayer(l); selected = new Set([h]); drawHeads(); drawLines(); tab("head");
  }
  function drawHeads() {
    const box = document.getElementById("heads"); box.replaceChildren();
    for (let h = 0; h < D.heads[layer]; h++) {
      const lab = el("label", {"data-head": h, "class": selected.has(h) ? "" : "off"}, "head " + h);
      lab.style.background = colour(h, D.heads[layer]);
      lab.addEventListener("click", () => { selected.has(h) ? selected.delete(h) : selected.add(h); drawHeads(); drawLines(); });
      box.appendChild(lab);
    }
    const sel = [...selected].sort((a, b) => a - b);
    document.getElementById("current").textContent =
      "layer " + layer + ", " + (sel.length === 1 ? "head " + sel[0] : sel.length + " heads");
  }
  const LEFT = 200, RIGHT = 320;
  function drawTokens() {  // once: the tokens never change; hovering only redraws the lines
    const svg = document.getElementById("lines"); svg.replaceChildren();
    svg.setAttribute("width", 520); svg.setAttribute("height", ROW * N + 10);
    svg.appendChild(el("g", {id: "links"}));
    for (const side of ["q", "k"]) {
      const names = side === "q" ? D.tokens : KT;
      for (let i = 0; i < names.length; i++) {
        const t = el("text", {x: side === "q" ? LEFT : RIGHT, y: ROW * i + 18, "text-anchor": side === "q" ? "end" : "start",
          "data-side": side, "data-index": i}, names[i]);
        t.addEventListener("mouseenter", () => { focus = {side: side, i: i}; drawLines(); });
        t.addEventListener("mouseleave", () => { focus = null; drawLines(); });
        svg.appendChild(t);
      }
    }
  }
  function visibleRows() {  // long inputs: only the rows on screen (and a screen either side) get lines
    if (N <= 300 || focus) return [0, N];
    const top = document.getElementById("lines").getBoundingClientRect().top;
    const first = Math.floor((-top - window.innerHeight) / ROW), last = Math.ceil((-top + 2 * window.innerHeight) / ROW);
    return [Math.max(0, first), Math.min(N, last)];
  }
  function drawLines() {
    const g = document.getElementById("links"); g.replaceChildren();
    const topK = NK > 64 ? 3 : NK, [r0, r1] = visibleRows();
    g.setAttribute("data-rows", r0 + "-" + r1);
    for (const h of selected) {
      const c = colour(h, D.heads[layer]);
      for (let i = 0; i < NQ; i++) {
        if (focus && focus.side === "q" && focus.i !== i) continue;
        const near = r0 <= i && i < r1;
        if (!focus && !near) continue;
        const order = rowLinks(layer, h, i, focus ? NK : topK);
        const top = order.length ? order[0][1] : 0;
        for (let t = 0; t < order.length; t++) {
          const [j, v] = order[t];
          if (focus && focus.side === "k" && focus.i !== j) continue;
          if (!focus && !(r0 <= j && j < r1) && !near) continue;
          // short inputs: weights above 0.05 (hovered: 0.01); long ones spread thin, so a hovered token's three
          // strongest links always show, drawn relative to the row's largest weight
          if (v < (focus ? 0.01 : 0.05) && !(focus && LINKS && t < 3 && v > 0)) continue;
          const alpha = LINKS && focus ? Math.max(0.2, v / top) : v;
          g.appendChild(el("line", {x1: LEFT + 5, y1: ROW * i + 14, x2: RIGHT - 5, y2: ROW * j + 14, stroke: c,
            "stroke-width": 2, "stroke-opacity": alpha.toFixed(3), "data-weight": v.toPrecision(3)}));
        }
      }
    }
    for (const t of document.querySelectorAll("#lines text.focus")) t.classList.remove("focus");
    if (focus) {
      const t = document.querySelector("#lines text[data-side='" + focus.side + "'][data-index='" + focus.i + "']");
      if (t) t.classList.add("focus");
    }
    drawHeadMap();
  }
  // One selected head's map, drawn from the stored data (links: the top-k of each row) at up to 2048 pixels a side,
  // shown in a 480-pixel frame at any length: "fit" shows it whole, + / - (or the mouse wheel) zoom around the
  // pointer, dragging pans. Colour: the square root of each weight over the head's largest, so that the faint
  // weights of long inputs stay visible; hovering reads the weight under the pointer.
  let zoom = 1, hm = null;  // hm: the head on display
  function drawHeadMap() {
    const box = document.getElementById("headmap");
    if (selected.size !== 1) { box.hidden = true; return; }
    const h = [...selected][0], S = Math.min(2048, Math.max(NQ, NK)), sq = S / NQ, sk = S / NK;
    const canvas = document.getElementById("headmap-canvas");
    if (NQ <= 64 && NK <= 64) { drawLabelledMap(h, canvas); return; }
    canvas.style.imageRendering = "pixelated";
    delete canvas.dataset.cell;
    canvas.width = Math.max(1, Math.round(NK * sk)); canvas.height = Math.max(1, Math.round(NQ * sq));
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(canvas.width, canvas.height);
    const val = new Float32Array(canvas.width * canvas.height);
    let top = 0;
    for (let i = 0; i < NQ; i++) {
      const y = Math.min(canvas.height - 1, Math.floor(i * sq));
      for (const [j, v] of rowLinks(layer, h, i, LINKS ? D.k : NK)) {
        const p = y * canvas.width + Math.min(canvas.width - 1, Math.floor(j * sk));
        if (v > val[p]) val[p] = v;
        if (v > top) top = v;
      }
    }
    for (let p = 0; p < val.length; p++) {
      const v = top > 0 ? Math.sqrt(val[p] / top) : 0;
      img.data[4 * p] = Math.round(255 * (1 - v)); img.data[4 * p + 1] = Math.round(255 * (1 - 0.8 * v));
      img.data[4 * p + 2] = Math.round(255 - 100 * v); img.data[4 * p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    hm = {h: h, canvas: canvas};
    document.getElementById("headmap-caption").textContent = "layer " + layer + " head " + h + ": " +
      (LINKS ? "the " + D.k + " largest weights of every row (the stored links)" : "every weight") +
      (S < Math.max(NQ, NK) ? ", the largest in each pixel" : "") + "; query tokens down, key tokens across; " +
      "darker = more attention (square root of the weight over this head's largest, " + top.toFixed(3) + ")";
    box.hidden = false;
    setZoom(zoom);
  }
  // Up to 64 tokens a side the map is drawn cell by cell with every query token down the left and every key token
  // across the top, so the matrix reads without hovering.
  function drawLabelledMap(h, canvas) {
    const ctx = canvas.getContext("2d"), font = "12px system-ui, sans-serif";
    const cell = Math.max(10, Math.min(40, Math.floor(420 / Math.max(NQ, NK))));
    const short = (t) => (t.length > 14 ? t.slice(0, 13) + "\u2026" : t);
    ctx.font = font;
    const width = (ts) => Math.ceil(Math.max(...ts.map((t) => ctx.measureText(short(t)).width), 10)) + 8;
    const ml = width(D.tokens.slice(0, NQ)), mt = width(KT.slice(0, NK));
    canvas.width = ml + NK * cell; canvas.height = mt + NQ * cell;
    canvas.style.imageRendering = "auto";
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    const W = [];
    let top = 0;
    for (let i = 0; i < NQ; i++) {
      const row = new Float32Array(NK);
      for (const [j, v] of rowLinks(layer, h, i, LINKS ? D.k : NK)) { row[j] = v; if (v > top) top = v; }
      W.push(row);
    }
    for (let i = 0; i < NQ; i++) for (let j = 0; j < NK; j++) {
      const v = top > 0 ? Math.sqrt(W[i][j] / top) : 0;
      ctx.fillStyle = `rgb(${Math.round(255 * (1 - v))},${Math.round(255 * (1 - 0.8 * v))},${Math.round(255 - 100 * v)})`;
      ctx.fillRect(ml + j * cell, mt + i * cell, cell, cell);
    }
    ctx.font = font; ctx.fillStyle = "#333"; ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    for (let i = 0; i < NQ; i++) ctx.fillText(short(D.tokens[i]), ml - 4, mt + i * cell + cell / 2);
    ctx.textAlign = "left";
    for (let j = 0; j < NK; j++) {
      ctx.save(); ctx.translate(ml + j * cell + cell / 2, mt - 4); ctx.rotate(-Math.PI / 2);
      ctx.fillText(short(KT[j]), 0, 0); ctx.restore();
    }
    hm = {h: h, canvas: canvas, ml: ml, mt: mt, cell: cell};
    Object.assign(canvas.dataset, {ml: ml, mt: mt, cell: cell});
    document.getElementById("headmap-caption").textContent = "layer " + layer + " head " + h + ": " +
      (LINKS ? "the " + D.k + " largest weights of every row (the stored links)" : "every weight") +
      "; query tokens down the left, key tokens across the top; darker = more attention (square root of the " +
      "weight over this head's largest, " + top.toFixed(3) + ")";
    document.getElementById("headmap").hidden = false;
    setZoom(zoom);
  }
  function setZoom(z, cx, cy) {  // z = 1 fits the frame; (cx, cy): the frame point that stays put
    const frame = document.getElementById("headmap-frame"), canvas = document.getElementById("headmap-canvas");
    const fw = frame.clientWidth || 480, fh = frame.clientHeight || 480;  // (480: the frame's size while hidden)
    const fit = Math.min(fw / canvas.width, fh / canvas.height);
    const old = canvas.getBoundingClientRect();
    zoom = Math.max(1, Math.min(64, z));
    const w = canvas.width * fit * zoom, ht = canvas.height * fit * zoom;
    if (cx === undefined) { cx = fw / 2; cy = fh / 2; }
    const fx = (frame.scrollLeft + cx) / (old.width || 1), fy = (frame.scrollTop + cy) / (old.height || 1);
    canvas.style.width = w + "px"; canvas.style.height = ht + "px";
    frame.scrollLeft = fx * w - cx; frame.scrollTop = fy * ht - cy;
    document.getElementById("headmap-zoom").textContent = zoom === 1 ? "fit" : zoom.toFixed(1) + "x";
  }
  function setupHeadMap() {
    const frame = document.getElementById("headmap-frame"), canvas = document.getElementById("headmap-canvas");
    document.getElementById("zoom-in").onclick = () => setZoom(zoom * 2);
    document.getElementById("zoom-out").onclick = () => setZoom(zoom / 2);
    document.getElementById("zoom-fit").onclick = () => setZoom(1);
    frame.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = frame.getBoundingClientRect();
      setZoom(zoom * (e.deltaY < 0 ? 1.25 : 0.8), e.clientX - r.left, e.clientY - r.top);
    }, {passive: false});
    let drag = null;
    frame.addEventListener("mousedown", (e) => {
      drag = {x: e.clientX, y: e.clientY, l: frame.scrollLeft, t: frame.scrollTop}; frame.classList.add("drag");
    });
    window.addEventListener("mouseup", () => { drag = null; frame.classList.remove("drag"); });
    frame.addEventListener("mousemove", (e) => {
      if (drag) { frame.scrollLeft = drag.l - (e.clientX - drag.x); frame.scrollTop = drag.t - (e.clientY - drag.y); }
      if (!hm) return;
      const r = canvas.getBoundingClientRect();
      let i = Math.floor((e.clientY - r.top) / r.height * NQ), j = Math.floor((e.clientX - r.left) / r.width * NK);
      if (hm.cell) {  // the labelled map: margins, then one cell per token
        const s = canvas.width / r.width;
        i = Math.floor(((e.clientY - r.top) * s - hm.mt) / hm.cell); j = Math.floor(((e.clientX - r.left) * s - hm.ml) / hm.cell);
      }
      if (i < 0 || j < 0 || i >= NQ || j >= NK) return;
      const hit = rowLinks(layer, hm.h, i, LINKS ? D.k : NK).find((x) => x[0] === j);
      document.getElementById("headmap-hover").textContent = "query " + i + " " + JSON.stringify(D.tokens[i]) +
        " -> key " + j + " " + JSON.stringify(KT[j]) + ": " +
        (hit ? hit[1].toFixed(4) : LINKS ? "below the stored top " + D.k : "0");
    });
  }
  function drawGrid() {
    const grid = document.getElementById("grid"); grid.replaceChildren();
    const cols = Math.max(...D.heads);
    grid.style.gridTemplateColumns = "repeat(" + cols + ", 80px)";
    const hl = new Set(D.highlights.map(x => x.layer + ":" + x.head));
    for (let l = 0; l < D.heads.length; l++) {
      for (let h = 0; h < cols; h++) {
        if (h >= D.heads[l]) { grid.appendChild(el("div")); continue; }
        const cell = el("div", {"class": "cell thumb" + (hl.has(l + ":" + h) ? " hl" : ""), "data-layer": l, "data-head": h});
        const TW = LINKS ? D.thumb[1] : NK, TH = LINKS ? D.thumb[0] : NQ;
        const canvas = el("canvas", {width: TW, height: TH});
        const ctx = canvas.getContext("2d"), img = ctx.createImageData(TW, TH);
        const w = LINKS ? thumb(l, h) : weights(l, h);
        for (let p = 0; p < TW * TH; p++) {  // white -> dark blue
          const v = w[p];
          img.data[4 * p] = Math.round(255 * (1 - v)); img.data[4 * p + 1] = Math.round(255 * (1 - 0.8 * v));
          img.data[4 * p + 2] = Math.round(255 - 100 * v); img.data[4 * p + 3] = 255;
        }
        ctx.putImageData(img, 0, 0);
        cell.appendChild(canvas);
        cell.appendChild(el("span", {}, "L" + l + " H" + h));
        cell.addEventListener("click", () => showHead(l, h));
        grid.appendChild(cell);
      }
    }
  }
  // image view: the picture on the key side; queries are its patches (ViT) or the question's words (cross-attention)
  const IM = D.image || null;
  let imageQuery = IM ? IM.query_offset + (IM.queries === "patches" ? (IM.grid >> 1) * IM.grid + (IM.grid >> 1) : 0) : 0;
  let grey = null;
  // inferno (perceptually uniform, dark to bright), 9 stops interpolated
  const INFERNO = [[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66], [245, 125, 21],
    [250, 193, 39], [252, 255, 164], [252, 255, 164]];
  function inferno(v) {
    const t = Math.max(0, Math.min(1, v)) * 7, i = Math.floor(t), f = t - i, a = INFERNO[i], c = INFERNO[i + 1];
    return [a[0] + f * (c[0] - a[0]), a[1] + f * (c[1] - a[1]), a[2] + f * (c[2] - a[2])];
  }
  function drawPicture(ctx, heat) {  // grey picture, optionally with a heat map (NK-sized row) over its patches
    // the heat, scaled to the map's largest value, is blended in with an opacity that grows with it: where a head
    // does not look the photograph shows as it is; where it looks most, the colour (inferno) covers it
    const S = IM.size, img = ctx.createImageData(S, S);
    let top = 0;
    if (heat) for (let j = 0; j < IM.grid * IM.grid; j++) top = Math.max(top, heat[IM.key_offset + j]);
    for (let y = 0; y < S; y++) for (let x = 0; x < S; x++) {
      const p = y * S + x, g = grey[p];
      let r = g, gg = g, b = g;
      if (heat) {
        const v = top > 0 ? heat[IM.key_offset + Math.floor(y / IM.patch) * IM.grid + Math.floor(x / IM.patch)] / top : 0;
        const c = inferno(v), a = 0.85 * Math.sqrt(v);
        r = (1 - a) * g + a * c[0]; gg = (1 - a) * g + a * c[1]; b = (1 - a) * g + a * c[2];
      }
      img.data[4 * p] = r; img.data[4 * p + 1] = gg; img.data[4 * p + 2] = b; img.data[4 * p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  function queryName(q) {
    if (IM.queries !== "patches") return "\u201c" + D.tokens[q] + "\u201d";
    if (q < IM.query_offset) return D.tokens[q];
    const i = q - IM.query_offset;
    return "patch (row " + Math.floor(i / IM.grid) + ", column " + (i % IM.grid) + ")";
  }
  function drawImageView() {
    if (!IM) return;
    const pic = document.getElementById("picture"), ctx = pic.getContext("2d");
    drawPicture(ctx, null);
    if (IM.queries === "patches" && imageQuery >= IM.query_offset) {  // outline the hovered patch
      const i = imageQuery - IM.query_offset;
      ctx.strokeStyle = "#00e5ff"; ctx.lineWidth = Math.max(0.5, IM.size / 100);
      ctx.strokeRect((i % IM.grid) * IM.patch + 0.25, Math.floor(i / IM.grid) * IM.patch + 0.25, IM.patch - 0.5, IM.patch - 0.5);
    }
    pic.setAttribute("data-query", imageQuery);
    for (const s of document.querySelectorAll("#image-queries span"))
      s.classList.toggle("focus", Number(s.getAttribute("data-index")) === imageQuery);
    document.getElementById("image-caption").textContent =
      "layer " + layer + ": where each head looks from " + queryName(imageQuery) +
      " (each head's map scaled to its largest weight: brighter and more opaque = more attention)";
    const box = document.getElementById("image-heads"); box.replaceChildren();
    for (let h = 0; h < D.heads[layer]; h++) {
      const cell = el("div", {"class": "cell", "data-head": h});
      const c = el("canvas", {width: IM.size, height: IM.size});
      const w = weights(layer, h);
      drawPicture(c.getContext("2d"), w.subarray(imageQuery * NK, (imageQuery + 1) * NK));
      cell.appendChild(c); cell.appendChild(el("span", {}, "head " + h));
      box.appendChild(cell);
    }
  }
  function setupImage() {
    if (!IM) return;
    const bin = atob(IM.pixels);
    grey = new Uint8ClampedArray(bin.length);
    for (let i = 0; i < bin.length; i++) grey[i] = bin.charCodeAt(i);
    const pic = document.getElementById("picture");
    pic.width = IM.size; pic.height = IM.size;
    const qs = document.getElementById("image-queries");
    const names = IM.queries === "patches" ? D.tokens.slice(0, IM.query_offset) : D.tokens;
    names.forEach((t, i) => {
      const s = el("span", {"data-index": i}, t);
      s.addEventListener("mouseenter", () => { imageQuery = i; drawImageView(); });
      qs.appendChild(s);
    });
    if (IM.queries === "patches") pic.addEventListener("mousemove", (ev) => {
      const r = pic.getBoundingClientRect();
      const col = Math.min(IM.grid - 1, Math.floor((ev.clientX - r.left) / r.width * IM.grid));
      const row = Math.min(IM.grid - 1, Math.floor((ev.clientY - r.top) / r.height * IM.grid));
      const q = IM.query_offset + row * IM.grid + col;
      if (q !== imageQuery) { imageQuery = q; drawImageView(); }
    });
    document.getElementById("tab-image").hidden = false;
  }
  function tab(name) {
    document.getElementById("head-view").hidden = name !== "head";
    document.getElementById("model-view").hidden = name !== "model";
    document.getElementById("image-view").hidden = name !== "image";
    document.getElementById("tab-head").classList.toggle("active", name === "head");
    document.getElementById("tab-model").classList.toggle("active", name === "model");
    document.getElementById("tab-image").classList.toggle("active", name === "image");
    if (name === "image") drawImageView();
    if (name === "head" && !document.getElementById("headmap").hidden) setZoom(zoom);  // laid out only now
  }
  document.getElementById("title").textContent = D.model + ": attention, " + D.heads.length +
    (D.heads.length === 1 ? " layer" : " layers");
  document.getElementById("text").textContent = D.text.length > 600 ? D.text.slice(0, 600) + " \u2026" : D.text;
  const sel = document.getElementById("layer");
  for (let l = 0; l < D.heads.length; l++) sel.appendChild(el("option", {value: l}, "layer " + l));
  sel.addEventListener("change", () => { setLayer(Number(sel.value)); if (!document.getElementById("image-view").hidden) drawImageView(); });
  document.getElementById("tab-head").addEventListener("click", () => tab("head"));
  document.getElementById("tab-model").addEventListener("click", () => tab("model"));
  document.getElementById("tab-image").addEventListener("click", () => tab("image"));
  const found = document.getElementById("found");
  if (D.highlights.length) found.appendChild(el("p", {}, "Heads found by the case study:"));
  for (const f of D.highlights) {
    const b = el("button", {"data-layer": f.layer, "data-head": f.head}, "layer " + f.layer + " head " + f.head + ": " + f.caption);
    b.addEventListener("click", () => showHead(f.layer, f.head));
    found.appendChild(b);
  }
  let pending = false;
  window.addEventListener("scroll", () => {  // long inputs: redraw the lines of the rows now on screen
    if (N <= 300 || focus || pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; drawLines(); });
  });
  drawTokens(); setLayer(D.start.layer); drawGrid(); setupImage(); setupHeadMap();
  selected = new Set([D.start.head]); drawHeads(); drawLines();  // one head first: its links, its map
  tab(IM ? "image" : "head");
  document.body.setAttribute("data-ready", "1");
})();
"""


def _json_for_script(obj) -> str:
    """JSON that cannot end the surrounding ``<script>`` element or open a comment."""
    return json.dumps(obj, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_image(pixels: torch.Tensor, *, patch: int, queries: str, query_offset: int = 0, key_offset: int = 0) -> dict:
    """The image view's data: a square uint8 picture ``(C, S, S)`` (shown grey) whose ``(S / patch)^2`` patches are
    the keys from ``key_offset`` on (row-major). ``queries="patches"``: the queries are the same patches from
    ``query_offset`` on (tokens before it, e.g. [CLS], are listed to hover); ``"tokens"``: the queries are the maps'
    tokens (e.g. a question's words, cross-attention)."""
    if queries not in ("patches", "tokens"):
        raise ValueError(f"queries must be 'patches' or 'tokens', got {queries!r}")
    grey = pixels.float().mean(0).round().clamp(0, 255).to(torch.uint8)  # (S, S)
    size = grey.shape[-1]
    if grey.dim() != 2 or grey.shape[0] != size or size % patch:
        raise ValueError(
            f"the image view takes square pictures tiled by the patch; got {tuple(pixels.shape)} with patch {patch}"
        )
    return {
        "size": size,
        "patch": patch,
        "grid": size // patch,
        "queries": queries,
        "query_offset": query_offset,
        "key_offset": key_offset,
        "pixels": base64.b64encode(grey.numpy().tobytes()).decode(),
    }


HOW = (
    "<p><b>Head view</b>: the tokens in two columns, queries on the left, the keys they read on the right; a "
    "line per link, darker for more weight. Click a coloured head label to show or hide that head; hover a token to "
    "keep only its links. <b>Model view</b>: one thumbnail per layer and head (rows: layers); click one to open it "
    "in the head view, where its map opens under the head labels: + and - (or the mouse wheel) zoom, dragging "
    "pans, and hovering reads the weight of a query and key. <b>Image view</b> (image models): hover a patch of the picture, or a word of the question, "
    "and every head of the chosen layer shows over the picture where it looks from there. Pick the layer at the "
    "top. Everything is in this one file: it works offline.</p>"
)
FULL_LIMIT = 128 * 128  # query x key weights per head kept in full; larger maps travel as links + thumbnails
LINKS_K = 8  # links kept per query and head in links mode
THUMB = 64  # thumbnail bins per side


@dataclass
class LinkMaps:
    """What the page needs of a long input, without any ``L x L`` map: per layer, each head's ``top-k`` links per
    query (``index``/``weight`` ``(H, Lq, K)``) and a thumbnail ``(H, T, T)`` (the map averaged over bins)."""

    text: str
    tokens: list[str]
    index: list[Tensor]
    weight: list[Tensor]
    thumbs: list[Tensor]
    model: str = ""
    key_tokens: list[str] | None = None

    @property
    def keys(self) -> list[str]:
        return self.tokens if self.key_tokens is None else self.key_tokens

    @property
    def heads(self) -> list[int]:
        return [w.shape[0] for w in self.weight]

    @classmethod
    def from_maps(cls, maps: AttentionMaps, k: int = LINKS_K, thumb: int = THUMB) -> LinkMaps:
        index, weight, thumbs = [], [], []
        for w in maps.layers:  # (H, Lq, Lk)
            v, i = w.float().topk(min(k, w.shape[-1]), dim=-1)
            index.append(i)
            weight.append(v)
            tq, tk = min(thumb, w.shape[1]), min(thumb, w.shape[2])
            thumbs.append(
                torch.nn.functional.adaptive_avg_pool2d(w.float(), (tq, tk)) if w.shape[0] else w.new_zeros(0, tq, tk)
            )
        return cls(maps.text, maps.tokens, index, weight, thumbs, maps.model, maps.key_tokens)


def _b64(t: Tensor) -> str:
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode()


def start_head(maps: AttentionMaps | LinkMaps, highlights: dict | None = None) -> tuple[int, int]:
    """The head the page opens on: the first highlighted one (the case study's, an induction head...), else the
    most focused head (the largest mean weight a query puts on one key other than itself and the first token), so
    that a reader meets one head's links, not every head's at once."""
    if highlights:
        return next(iter(highlights))
    if not isinstance(maps, AttentionMaps) or len(maps.tokens) < 3 or maps.key_tokens is not None:
        return (0, 0)
    best, where = -1.0, (0, 0)
    for l, w in enumerate(maps.layers):
        if w.shape[0] == 0:
            continue
        x = w[:, 1:, 1:].clone()  # queries past the first token, keys past the first token (the usual sink)
        x[:, torch.eye(x.shape[1], dtype=torch.bool)] = 0
        focus = x.max(-1).values.mean(-1)  # (H,)
        h = int(focus.argmax())
        if float(focus[h]) > best:
            best, where = float(focus[h]), (l, h)
    return where


def page_data(
    maps: AttentionMaps | LinkMaps,
    highlights: dict | None = None,
    image: dict | None = None,
    start: tuple[int, int] | None = None,
) -> dict:
    """The page's data: full 8-bit maps when they are small (and always for the image view), else top-k links per
    query (16-bit key index, 8-bit ``sqrt`` of the weight: 1e-4 is still 3/255) and 8-bit thumbnails scaled to each
    head's largest bin. ``start``: the head the page opens on (default :func:`start_head`)."""
    l0, h0 = start if start is not None else start_head(maps, highlights)
    common = {
        "start": {"layer": l0, "head": h0},
        "model": maps.model,
        "text": maps.text,
        "tokens": maps.tokens,
        "key_tokens": maps.keys,
        "heads": maps.heads,
        "image": image,
        "highlights": [{"layer": l, "head": h, "caption": c} for (l, h), c in sorted((highlights or {}).items())],
    }
    full = isinstance(maps, AttentionMaps) and (image is not None or len(maps.tokens) * len(maps.keys) <= FULL_LIMIT)
    if full:
        enc = [[_b64((w[h].clamp(0, 1) * 255).round().to(torch.uint8)) for h in range(w.shape[0])] for w in maps.layers]
        return {**common, "mode": "full", "weights": enc}
    if len(maps.keys) > 65535:
        raise ValueError(f"the page indexes keys with 16 bits; {len(maps.keys)} keys is too many")
    lm = maps if isinstance(maps, LinkMaps) else LinkMaps.from_maps(maps)
    k = lm.weight[0].shape[-1] if lm.weight else 0
    links = [
        [
            {
                "i": _b64(i[h].to(torch.int32).to(torch.uint16) if hasattr(torch, "uint16") else i[h].short()),
                "w": _b64((w[h].clamp(0, 1).sqrt() * 255).round().to(torch.uint8)),
            }
            for h in range(w.shape[0])
        ]
        for i, w in zip(lm.index, lm.weight)
    ]
    thumbs = [
        [_b64((t[h] / t[h].max().clamp_min(1e-12) * 255).round().to(torch.uint8)) for h in range(t.shape[0])]
        for t in lm.thumbs
    ]
    shape = list(lm.thumbs[0].shape[1:]) if lm.thumbs else [0, 0]
    return {**common, "mode": "links", "k": k, "links": links, "thumbs": thumbs, "thumb": shape}


def write_page(
    maps: AttentionMaps | LinkMaps,
    path: Path,
    *,
    highlights: dict | None = None,
    image: dict | None = None,
    start: tuple[int, int] | None = None,
) -> Path:
    """Write the page for ``maps`` to ``path``; ``highlights`` maps ``(layer, head)`` to a caption (the first one is
    where the page opens, unless ``start`` names another head); ``image`` (:func:`page_image`) adds the image
    view."""
    html = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>multihead attention</title>"
        f"<style>{STYLE}</style></head><body>\n"
        '<header><h1 id="title"></h1><p id="text"></p>'
        f'<details id="how"><summary>How to read this page</summary>{HOW}</details></header>\n'
        '<nav><button class="tab active" id="tab-head">Head view</button>'
        '<button class="tab" id="tab-model">Model view</button>'
        '<button class="tab" id="tab-image" hidden>Image view</button>'
        '<label>Layer <select id="layer"></select></label><span id="current"></span></nav>\n'
        '<section id="head-view"><div id="heads"></div><div id="headmap" hidden><p id="headmap-caption"></p>'
        '<p><button id="zoom-out" title="zoom out">-</button><button id="zoom-in" title="zoom in">+</button>'
        '<button id="zoom-fit" title="show the whole map">fit</button> <span id="headmap-zoom">fit</span>'
        ' (wheel: zoom, drag: pan)</p><div id="headmap-frame"><canvas id="headmap-canvas"></canvas></div>'
        '<p id="headmap-hover"></p></div><svg id="lines"></svg></section>\n'
        '<section id="model-view" hidden><div id="grid"></div></section>\n'
        '<section id="image-view" hidden><div><canvas id="picture"></canvas><div id="image-queries"></div>'
        '</div><div><p id="image-caption"></p><div id="image-heads"></div></div></section>\n'
        '<section id="found"></section>\n'
        f'<script type="application/json" id="data">{_json_for_script(page_data(maps, highlights, image, start))}</script>\n'
        f"<script>{SCRIPT}</script>\n</body></html>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, html)
    return path


@torch.no_grad()
def subject_link_maps(subject: Subject, text: str, *, k: int = 8, thumb: int = 64):
    """The page's data for one (long) text from exact statistics on the model's own path: each head's top-``k``
    links per query and a ``thumb x thumb`` thumbnail (:class:`multihead.interpret.pages.page.LinkMaps`); no map is
    built. Returns ``(link_maps, truncated)``."""
    subject.model.eval()
    ids, keep = subject.encode([text])
    n = int(keep[0].sum())
    tokens, _ = subject.display(ids[0, :n].tolist())
    with capture(subject.model, ("stats",), stats={"topk": k, "thumbnail": thumb}) as cache:
        subject.model(ids, keep)
    layers = [cache.stats(i) for i in range(len(cache.attention_modules))]
    cut = max(0, subject.length(text) - n)
    return LinkMaps(
        text,
        tokens,
        [st.topk_index[0] for st in layers],
        [st.topk_weight[0].float() for st in layers],
        [st.thumbnail[0].float() for st in layers],
        subject.name,
    ), cut


__all__ = ["LinkMaps", "page_data", "page_image", "subject_link_maps", "write_page"]
