"""Causal interventions on attention heads, through the hook points every multihead model has (``hook_z``: each
head's output before the output projection, ``(B, H, L, D)``): ablation, activation patching of every head in
batched passes, and attribution patching from one forward and one backward pass.

Definitions (each checked by a test against its plain form):

* **ablation** of heads -- their ``z`` replaced by zeros (= ``head_mask`` 0), by their mean over a reference batch,
  or by their value on other inputs (resampling);
* **activation patching** (Vig et al. 2020; Meng et al. 2022; Wang et al. 2022) -- run the *corrupted* input with
  one head's ``z`` taken from the *clean* run; the head's effect is ``metric(patched) - metric(corrupted)``. All heads
  are patched in batched passes: row ``r`` of a batch of copies of the corrupted input has head ``r`` patched, and
  one extra unpatched row in every batch is the baseline, so an effect is a difference of two rows of one pass;
* **path patching** (Wang et al. 2022) -- the part of some sender heads' effect that reaches the metric only
  through chosen receiver heads' query, key or value input (:func:`path_patching`);
* **attribution patching** (Nanda 2023; Syed et al. 2023) -- the first-order estimate of every head's effect,
  ``sum (z_clean - z_corrupt) * d metric / d z`` at the corrupted run: one forward and one backward pass for all
  heads. Exact where the metric is linear in ``z``; elsewhere compare it with activation patching.

``model`` is any multihead model; ``run(model, inputs)`` turns inputs into the output the metric reads (default
``model(inputs)``, e.g. a CausalLM's logits ``(B, T, V)``); ``metric(output) -> (B,)`` one number per row.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from ...models.seq2seq import CausalLM
from ...data.batching import as_batch
from ...modules.anatomy import anatomy
from ...modules.capture import attention_modules, capture


def _run(model, inputs):
    return model(inputs)


def _for_metric(model, run: Callable, metric) -> Callable:
    """A model whose forward takes HF's ``logits_to_keep``, scored by a :class:`LogitMetric` at a position from the
    end, projects only the last positions to the vocabulary, as multihead's own LMs do when patching resumes."""
    import inspect

    if run is not _run or not isinstance(metric, LogitMetric) or metric.position >= 0:
        return run
    try:
        takes = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return run
    keep = -metric.position
    return (lambda m, x: m(x, logits_to_keep=keep)) if takes else run


def _repeat(inputs, n: int):
    """``inputs`` (a tensor with batch 1, or a tuple of them) repeated ``n`` times along the batch axis."""
    if isinstance(inputs, tuple):
        return tuple(_repeat(t, n) for t in inputs)
    if not isinstance(inputs, Tensor) or inputs.shape[0] != 1:
        raise ValueError(
            f"activation patching takes one clean and one corrupted input (batch 1), got shape "
            f"{getattr(inputs, 'shape', type(inputs).__name__)}"
        )
    return inputs.expand(n, *inputs.shape[1:]).contiguous()


def _check_pair(clean, corrupt) -> None:
    a = clean if not isinstance(clean, tuple) else clean[0]
    b = corrupt if not isinstance(corrupt, tuple) else corrupt[0]
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"the clean and corrupted inputs must have the same shape to patch position by position: "
            f"clean {tuple(a.shape)} ({a.shape[-1]} tokens), corrupted {tuple(b.shape)} "
            f"({b.shape[-1]} tokens); pad or rephrase one of them to the other's length"
        )


def _metric(metric, out, rows: int) -> Tensor:
    value = metric(out)
    if isinstance(value, (int, float)) and rows == 1:
        value = torch.tensor([float(value)])
    if isinstance(value, Tensor) and value.dim() == 0 and rows > 1 and isinstance(out, Tensor):
        # one number for the batch (TransformerLens's metrics average over it): each row is another patch here, so
        # the metric is asked of each row alone, where the batch's average is that row's number
        value = torch.stack([torch.as_tensor(metric(out[i : i + 1])).reshape(()) for i in range(rows)])
    if isinstance(value, Tensor) and value.numel() == 1 and rows == 1:
        value = value.reshape(1)  # one row: a batch-averaged metric is that row's number
    if not isinstance(value, Tensor) or value.shape != (rows,):
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        averaged = isinstance(value, Tensor) and value.numel() == 1
        raise ValueError(
            f"the metric must return one number per batch row, a tensor of shape ({rows},); got {got}"
            + (
                ": it averages over the batch, as TransformerLens's metrics do, but here each row is another patch; "
                "return one number per row (drop the .mean() over the batch), or patch one row at a time "
                "(batch_size=1)"
                if averaged
                else ""
            )
        )
    if not bool(torch.isfinite(value).all()):
        raise ValueError(
            "the metric is not finite on these inputs (NaN or inf); check the answer tokens and the metric function"
        )
    return value


def head_outputs(model: nn.Module, inputs, *, run: Callable = _run) -> list[Tensor]:
    """Every attention layer's per-head outputs ``z`` ``(B, H, L, D)`` on ``inputs``, in layer order."""
    with capture(model, ("z",), to_cpu=False) as cache, torch.no_grad():
        run(model, inputs)
    return [cache.get_layer("z", i) for i in range(len(cache.attention_modules))]


def _check_heads(model, heads: dict[int, list[int]]) -> list[tuple[str, nn.Module]]:
    mods = attention_modules(model)
    for layer, hs in heads.items():
        if not 0 <= int(layer) < len(mods):
            raise ValueError(
                f"layer {layer} does not exist: the model has {len(mods)} attention layers (0..{len(mods) - 1})"
            )
        h = mods[int(layer)][1].num_heads
        bad = [x for x in hs if not 0 <= int(x) < h]
        if bad:
            raise ValueError(f"heads {bad} of layer {layer} do not exist: it has {h} heads (0..{h - 1})")
    return mods


@contextmanager
def ablated(
    model: nn.Module, heads: dict[int, list[int]], mode: str = "zero", *, reference=None, run: Callable = _run
) -> Iterator[None]:
    """Inside the block, ``heads`` (``{layer: [head, ...]}``) are ablated on every forward pass: ``zero``, ``mean``
    (their mean ``z`` over the batch and positions of ``reference`` inputs) or ``resample`` (their ``z`` on
    ``reference`` inputs, which must have the batch shape of the inputs run inside)."""
    if mode not in ("zero", "mean", "resample"):
        raise ValueError(f"unknown ablation {mode!r}; choose zero, mean or resample")
    mods = _check_heads(model, heads)
    if mode != "zero" and reference is None:
        raise ValueError(f"{mode} ablation needs reference= inputs (the activations to put in the heads' place)")
    ref = head_outputs(model, reference, run=run) if mode != "zero" else None
    handles = []

    def hook_for(layer: int, hs: list[int]):
        def edit(z: Tensor, hook) -> Tensor:
            z = z.clone()
            if mode == "zero":
                z[:, hs] = 0
            elif mode == "mean":
                z[:, hs] = ref[layer][:, hs].mean(dim=(0, 2), keepdim=True).to(z.dtype)
            else:
                if ref[layer].shape != z.shape:
                    raise ValueError(
                        f"resample ablation needs reference inputs of the same batch shape: reference "
                        f"{tuple(ref[layer].shape)} vs inputs {tuple(z.shape)}"
                    )
                z[:, hs] = ref[layer][:, hs].to(z.dtype)
            return z

        return edit

    try:
        for layer, hs in heads.items():
            handles.append(mods[int(layer)][1].hook_z.add_hook(hook_for(int(layer), [int(h) for h in hs])))
        yield
    finally:
        for h in handles:
            h.remove()


def _resumable(model, run, metric) -> bool:
    """Whether patching can rerun ``model`` from the patched layer: a CausalLM run on its ids, scored by a metric
    that reads one position's logits (so only that position is projected to the vocabulary)."""
    return run is _run and isinstance(metric, LogitMetric) and isinstance(model, CausalLM)


def _first_row(model, inputs, rows: int, *, run: Callable, resid: bool) -> tuple[list[Tensor], list[Tensor]]:
    """Every attention layer's ``z`` (and with ``resid``, the residual stream entering every decoder layer of a
    CausalLM) on ``inputs`` run as a batch of ``rows`` copies, first row kept. A patching pass of ``rows`` rows
    takes its activations from here: BLAS and attention kernels may round differently at another batch size, and a
    head patched with its own activation must change nothing, exactly."""
    zs: dict[int, Tensor] = {}
    seen: list[Tensor] = []
    mods = attention_modules(model)
    handles = [
        m.hook_z.add_hook(lambda t, hook, i=i: zs.__setitem__(i, t[:1].clone())) for i, (_, m) in enumerate(mods)
    ]
    if resid:
        handles += [
            b.register_forward_pre_hook(lambda mod, args: seen.append(args[0][:1].clone()))
            for b in model.decoder.layers
        ]
    try:
        run(model, _repeat(inputs, rows))
    finally:
        for h in handles:
            h.remove()
    return [zs[i] for i in range(len(mods))], seen


@torch.no_grad()
def activation_patching(
    model: nn.Module,
    clean,
    corrupt,
    metric: Callable[[object], Tensor],
    *,
    run: Callable = _run,
    batch_size: int = 32,
    per_position: bool = False,
) -> dict:
    """Every head's effect when its ``z`` is copied from the clean run into the corrupted one (see the module
    docstring); with ``per_position``, every head at every position separately. Returns ``{"effect": (layers, H)``
    (or ``(layers, H, L)``), ``"clean"``, ``"corrupt"``: the metric on each input}``.

    A CausalLM scored by :func:`logit_diff` or :func:`token_probability` (with the default ``run``) is rerun only
    from the patched layer on (its input is the corrupted run's residual stream there, cached once) and projects
    only the metric's position to the vocabulary: each pass patches heads of one layer. Any other model or metric
    runs the whole model on every pass."""
    _check_pair(clean, corrupt)
    model.eval()
    run = _for_metric(model, run, metric)
    mods = attention_modules(model)
    heads = [m.num_heads for _, m in mods]
    with capture(model, ("z",), layers=[0], to_cpu=False) as seen:  # the clean metric, and the positions per head
        base_clean = float(_metric(metric, run(model, clean), 1)[0])
    length = seen.get_layer("z", 0).shape[2]
    resume = _resumable(model, run, metric)
    kept: dict[int, tuple[list[Tensor], list[Tensor]]] = {}  # rows -> (clean z, corrupted residual inputs)

    def activations(rows: int) -> tuple[list[Tensor], list[Tensor]]:
        if rows not in kept:
            kept[rows] = (
                _first_row(model, clean, rows, run=run, resid=False)[0],
                _first_row(model, corrupt, rows, run=run, resid=True)[1] if resume else [],
            )
        return kept[rows]

    jobs = [
        (l, h, p)
        for l in range(len(mods))
        for h in range(heads[l])
        for p in (range(length) if per_position else [None])
    ]
    values = torch.empty(len(jobs))
    step = max(1, batch_size - 1)
    if resume:  # one group per layer, started there
        groups = [(l, [i for i, j in enumerate(jobs) if j[0] == l]) for l in range(len(mods))]
        read = replace(metric, position=-1)
    else:
        groups = [(0, list(range(len(jobs))))]
    corrupt_value = None
    for start_layer, members in groups:
        for start in range(0, len(members), step):
            chunk = members[start : start + step]
            rows = len(chunk) + 1  # the last row stays unpatched: the baseline of this pass
            clean_z, resid_in = activations(rows)
            by_layer: dict[int, list[tuple[int, int, int | None]]] = {}
            for r, i in enumerate(chunk):
                l, h, p = jobs[i]
                by_layer.setdefault(l, []).append((r, h, p))
            handles = []

            def hook_for(layer: int, items, clean_z=clean_z):
                def edit(z: Tensor, hook) -> Tensor:
                    z = z.clone()
                    src = clean_z[layer][0]  # (H, L, D)
                    for r, h, p in items:
                        if p is None:
                            z[r, h] = src[h]
                        else:
                            z[r, h, p] = src[h, p]
                    return z

                return edit

            try:
                for layer, items in by_layer.items():
                    handles.append(mods[layer][1].hook_z.add_hook(hook_for(layer, items)))
                if resume:
                    out = model(
                        _repeat(corrupt, rows),
                        resid=resid_in[start_layer].expand(rows, -1, -1),
                        start_at_layer=start_layer,
                        logits_at=metric.position,
                    )
                    value = _metric(read, out, rows)
                else:
                    value = _metric(metric, run(model, _repeat(corrupt, rows)), rows)
            finally:
                for h in handles:
                    h.remove()
            values[chunk] = value[:-1] - value[-1]
            if corrupt_value is None:
                corrupt_value = float(value[-1])
    shape = (len(mods), max(heads), length) if per_position else (len(mods), max(heads))
    effect = torch.full(shape, float("nan"))
    for (l, h, p), v in zip(jobs, values.tolist()):
        effect[(l, h) if p is None else (l, h, p)] = v
    return {"effect": effect, "clean": base_clean, "corrupt": corrupt_value}


def attribution_patching(
    model: nn.Module, clean, corrupt, metric: Callable[[object], Tensor], *, run: Callable = _run
) -> dict:
    """First-order estimates of every head's patching effect from one forward and one backward pass on the
    corrupted input: ``sum over positions and dims of (z_clean - z_corrupt) * d metric / d z``. Returns
    ``{"effect": (layers, H), "corrupt": metric}``; no parameter gradient is kept."""
    _check_pair(clean, corrupt)
    model.eval()
    run = _for_metric(model, run, metric)
    mods = attention_modules(model)
    clean_z = head_outputs(model, clean, run=run)
    leaves: dict[int, Tensor] = {}
    handles = []

    def hook_for(layer: int):
        def edit(z: Tensor, hook) -> Tensor:
            # The first layer's z starts the graph (nothing before it is kept); every later z stays in it, so its
            # gradient is the whole derivative, through the later layers' attention too.
            if not z.requires_grad:
                z = z.detach().requires_grad_(True)
            else:
                z.retain_grad()
            leaves[layer] = z
            return z

        return edit

    wanted = [p.requires_grad for p in model.parameters()]
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for i, (_, mod) in enumerate(mods):
            handles.append(mod.hook_z.add_hook(hook_for(i)))
        with torch.enable_grad():
            value = _metric(metric, run(model, corrupt), 1)
            value.sum().backward()
    finally:
        for h in handles:
            h.remove()
        for p, w in zip(model.parameters(), wanted):
            p.requires_grad_(w)
    heads = max(m.num_heads for _, m in mods)
    effect = torch.full((len(mods), heads), float("nan"))
    for i, leaf in leaves.items():
        grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        est = ((clean_z[i].to(leaf.dtype) - leaf.detach()) * grad).sum(dim=(0, 2, 3))  # (H,)
        effect[i, : est.shape[0]] = est.float()
    return {"effect": effect, "corrupt": float(value.detach()[0])}


@torch.no_grad()
def path_patching(
    model: nn.Module,
    original,
    new,
    metric: Callable[[object], Tensor],
    *,
    senders: dict[int, list[int]],
    receivers: dict[int, list[int]],
    through="k",
    run: Callable = _run,
) -> dict:
    """The effect of the ``senders``' outputs on the ``metric`` that flows only through the ``receivers``'
    ``through`` input (``q``, ``k`` or ``v``, or several: ``("q", "k", "v")``; Wang et al. 2022, Goldowsky-Dill et
    al. 2023), in three passes:

    1. ``z`` of every head on ``original`` and on ``new``;
    2. ``original`` again with the senders' ``z`` from ``new`` and every other head frozen at its ``original``
       value (so the change reaches the receivers only along direct paths through the residual stream and the
       MLPs), recording each receiver's ``through`` vectors;
    3. ``original`` once more with only those receiver vectors replaced; the metric's change from ``original`` is
       the path's effect.

    Steps 2 and 3 run with an unchanged baseline row in the same batch, so no senders means an effect of exactly 0.
    With grouped-query attention a key/value head serves several query heads: patching ``k`` or ``v`` of a receiver
    patches its key/value head, which its group shares. Returns ``{"effect", "original", "patched"}``."""
    effect, base = _path_effects(model, original, new, metric, [senders], receivers, through, run, 2)
    return {"effect": float(effect[0]), "original": base, "patched": base + float(effect[0])}


@torch.no_grad()
def path_patching_each(
    model: nn.Module,
    original,
    new,
    metric: Callable[[object], Tensor],
    *,
    receivers: dict[int, list[int]],
    through="q",
    senders: list[tuple[int, int]] | None = None,
    run: Callable = _run,
    batch_size: int = 32,
) -> dict:
    """:func:`path_patching` of every sender head on its own (default: every head in a layer before the first
    receiver), in batched passes (row ``r`` sends from head ``r``): which heads act on the metric through the
    receivers' ``through`` input. Returns ``{"effect": (layers, H)`` (NaN where a head was not a sender),
    ``"original"}``."""
    mods = _check_heads(model, receivers)
    if senders is None:
        first = min(int(l) for l in receivers)
        senders = [(l, h) for l in range(first) for h in range(mods[l][1].num_heads)]
    sets = [{int(l): [int(h)]} for l, h in senders]
    effect, base = _path_effects(model, original, new, metric, sets, receivers, through, run, batch_size)
    out = torch.full((len(mods), max(m.num_heads for _, m in mods)), float("nan"))
    for (l, h), v in zip(senders, effect.tolist()):
        out[int(l), int(h)] = v
    return {"effect": out, "original": base}


def _path_effects(
    model, original, new, metric, sender_sets: list[dict], receivers: dict, through, run, batch_size: int
) -> tuple[Tensor, float]:
    """Steps 1-3 of :func:`path_patching` for each sender set, ``batch_size - 1`` sets and a baseline row per pass:
    ``(effects (len(sender_sets),), metric on original)``."""
    paths = (through,) if isinstance(through, str) else tuple(through)
    if not paths or any(t not in ("q", "k", "v") for t in paths):
        raise ValueError(f"through must be 'q', 'k' or 'v' (or several of them), got {through!r}")
    _check_pair(original, new)
    model.eval()
    mods = attention_modules(model)
    for s in sender_sets:
        _check_heads(model, s)
    _check_heads(model, receivers)
    z_orig, z_new = head_outputs(model, original, run=run), head_outputs(model, new, run=run)
    step = max(1, batch_size - 1)
    effects: list[float] = []
    base = float("nan")

    def groups(mod, hs: list[int], path: str) -> list[int]:
        if path == "q":
            return hs
        per = mod.num_heads // mod.num_kv_heads
        return sorted({h // per for h in hs})

    for start in range(0, len(sender_sets), step):
        chunk = sender_sets[start : start + step]
        rows = len(chunk) + 1
        inputs = _repeat(original, rows)
        handles, recorded = [], {}

        def freeze(layer: int, chunk=chunk, rows=rows):
            send = [(r, [int(h) for h in s[layer]]) for r, s in enumerate(chunk) if s.get(layer)]

            def edit(z: Tensor, hook) -> Tensor:
                z = z_orig[layer].to(z.dtype).expand(rows, -1, -1, -1).clone()
                for r, hs in send:
                    z[r, hs] = z_new[layer][0, hs].to(z.dtype)
                return z

            return edit

        try:
            for i, (_, mod) in enumerate(mods):
                handles.append(mod.hook_z.add_hook(freeze(i)))
            for layer in receivers:
                mod = mods[int(layer)][1]
                for path in paths:
                    handles.append(
                        getattr(mod, f"hook_{path}").add_hook(
                            lambda t, h, key=(int(layer), path), recorded=recorded: recorded.__setitem__(key, t.clone())
                        )
                    )
            run(model, inputs)
        finally:
            for h in handles:
                h.remove()
        handles = []
        try:
            for layer, hs in receivers.items():
                mod = mods[int(layer)][1]
                for path in paths:
                    idx = groups(mod, [int(h) for h in hs], path)

                    def put(t: Tensor, hook, key=(int(layer), path), idx=idx, recorded=recorded) -> Tensor:
                        t = t.clone()
                        t[:, idx] = recorded[key][:, idx].to(t.dtype)
                        return t

                    handles.append(getattr(mod, f"hook_{path}").add_hook(put))
            value = _metric(metric, run(model, inputs), rows)
        finally:
            for h in handles:
                h.remove()
        effects.extend((value[:-1] - value[-1]).tolist())
        base = float(value[-1])
    return torch.tensor(effects), base


# ---------------------------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class LogitMetric:
    """A metric read from one position of a CausalLM's ``(B, T, V)`` logits, one number per row: the logit
    difference ``logit[answer] - logit[wrong]`` (``wrong`` given) or the probability of ``answer``. Knowing which
    position it reads lets patching project only that position to the vocabulary."""

    answer: int
    wrong: int | None = None
    position: int = -1

    def __call__(self, logits) -> Tensor:
        logits = getattr(logits, "logits", logits)  # an HF model's output (CausalLMOutput) holds them
        row = logits[:, self.position].float()
        if self.wrong is None:
            return row.softmax(-1)[:, self.answer]
        return row[:, self.answer] - row[:, self.wrong]


def per_head(effect: Tensor) -> Tensor:
    """``(layers, H)`` from an effect that may be per position ``(layers, H, L)``: the largest magnitude over
    positions."""
    return effect.abs().amax(-1) if effect.dim() == 3 else effect


def patch_pairs(
    model: nn.Module,
    pairs,
    *,
    batch_size: int = 32,
    per_position: bool = False,
    attribution: bool = True,
    progress: bool = False,
    desc: str = "every head patched",
) -> dict:
    """Exact activation patching of every head (and attribution patching beside it), averaged over prompt pairs.

    ``pairs``: ``(clean ids (1, L), corrupted ids (1, L), metric)`` triples. Returns ``effect`` (the mean exact
    effect, ``(layers, H)`` or ``(layers, H, L)`` with ``per_position``), ``per_pair`` (each pair's exact effect and
    its clean/corrupted metric values), and, unless ``per_position`` or ``attribution=False``, ``attribution`` (the
    mean first-order estimate) and ``correlation`` (Pearson's r between the two over every head)."""
    from tqdm import tqdm

    exact, approx, values = [], [], []
    for clean, corrupt, metric in tqdm(list(pairs), desc=desc, disable=not progress):
        r = activation_patching(model, clean, corrupt, metric, batch_size=batch_size, per_position=per_position)
        exact.append(r["effect"])
        values.append({"clean": r["clean"], "corrupt": r["corrupt"]})
        if attribution and not per_position:
            approx.append(attribution_patching(model, clean, corrupt, metric)["effect"])
    if not exact:
        raise ValueError("patch_pairs needs at least one (clean, corrupted, metric) pair")
    effect = torch.stack(exact).mean(0)
    out = {"effect": effect, "per_pair": values, "exact": exact}
    if approx:
        est = torch.stack(approx).mean(0)
        out["attribution"] = est
        out["approx"] = approx
        out["correlation"] = float(torch.corrcoef(torch.stack([effect.flatten(), est.flatten()]))[0, 1])
    return out


def logit_diff(answer: int, wrong: int, position: int = -1) -> LogitMetric:
    """``logits[:, position, answer] - logits[:, position, wrong]`` of a CausalLM's ``(B, T, V)`` logits."""
    return LogitMetric(int(answer), int(wrong), int(position))


def token_probability(answer: int, position: int = -1) -> LogitMetric:
    """The softmax probability of ``answer`` at ``position``."""
    return LogitMetric(int(answer), None, int(position))


@torch.no_grad()
def direct_logit_attribution(model, ids: Tensor, answer: int, wrong: int | None = None, position: int = -1) -> dict:
    """How much each part writes directly to ``logit[answer] - logit[wrong]`` (or ``logit[answer]``) at
    ``position`` of a causal LM with pre-norm blocks: the final residual stream is the sum of the stream entering
    the first block (the embeddings), every head's ``z_h W_O^h``, the output biases and every MLP's output; the final
    norm is linear once its scale (``1 / rms``, or LayerNorm's ``1 / std`` with the mean removed) is frozen at its
    value on this input, so the parts add up to the logit difference exactly (``check`` holds the sum and the true
    value; a model whose parts do not add up -- its blocks normalise what they add, or its head is soft-capped -- is
    refused). Read from the model's anatomy (:func:`~multihead.modules.anatomy.anatomy`). Returns ``{"heads":
    (layers, H), "mlp": (layers,), "embed", "bias", "final_bias", "total", "check"}``."""
    body = anatomy(model)
    if body.unembed is None or not body.blocks:
        raise ValueError("direct logit attribution reads a causal LM's blocks and unembedding; this model has none")
    if any(b.adds is False for b in body.blocks):
        raise ValueError(
            "direct logit attribution reads the residual stream of pre-norm blocks without output norms; "
            "this model's blocks are post-norm or sandwich-normed"
        )
    if any(len(b.sites) != 1 for b in body.blocks):
        raise ValueError(
            "direct logit attribution reads decoder blocks of one attention layer each; this model's blocks hold "
            "several (an encoder-decoder)"
        )
    sites = [body.sites[b.sites[0]] for b in body.blocks]
    for site in sites:
        if not site.splits_per_head:
            raise ValueError(
                f"direct logit attribution splits each layer's output projection per head; {site.name} transforms "
                "the heads' outputs before its output projection (a gate, a norm, or differential attention)"
            )
    zs: dict[int, Tensor] = {}
    mlps: dict[int, Tensor] = {}
    entering: dict[str, Tensor] = {}

    def record_input(mod, args, kwargs) -> None:
        entering["x"] = (args[0] if args else kwargs["hidden_states"]).detach()

    handles = [body.blocks[0].module.register_forward_pre_hook(record_input, with_kwargs=True)]
    try:
        for i, (block, site) in enumerate(zip(body.blocks, sites)):
            handles.append(site.module.hook_z.add_hook(lambda t, h, i=i: zs.__setitem__(i, t.detach())))
            if block.hook("hook_mlp_out") is not None:
                handles.append(block.hook("hook_mlp_out").add_hook(lambda t, h, i=i: mlps.__setitem__(i, t.detach())))
        logits = body.logits(ids)[0, position]
    finally:
        for h in handles:
            h.remove()
    x_embed = entering["x"][0, position]  # (E,): token (and position) embedding entering the stack
    heads, bias = [], torch.zeros_like(x_embed)
    for i, site in enumerate(sites):  # each layer's weights at hand in turn (one offloaded layer at a time)
        with body.at_hand(site.name):
            heads.append(site.head_outputs(zs[i][0, :, position]))  # (H, E)
            if site.w_o.bias is not None:
                bias = bias + site.w_o.bias
    with body.at_hand(body.unembed, body.final_norm):
        return _attribute(body, logits, heads, bias, x_embed, mlps, sites, answer, wrong, position)


def _attribute(body, logits, heads, bias, x_embed, mlps, sites, answer, wrong, position) -> dict:
    """:func:`direct_logit_attribution` from the parts of the final stream (the unembedding and final norm at
    hand)."""
    w_u = body.unembed.weight
    direction = w_u[answer] - (0 if wrong is None else w_u[wrong])  # (E,)
    mlp_parts = [mlps[i][0, position] if i in mlps else torch.zeros_like(x_embed) for i in range(len(sites))]
    resid = x_embed + sum(h.sum(0) for h in heads) + bias + sum(mlp_parts)  # the final stream, from its parts
    kind, gain, shift, eps = body.final_norm_parts()
    center = kind == "layer"
    mean = resid.mean() if center else 0.0
    scale = torch.rsqrt((resid - mean).pow(2).mean() + eps) if kind != "none" else torch.ones(())

    def read(v: Tensor) -> Tensor:  # one part's direct contribution (the norm's scale frozen, its mean removed)
        if center:
            v = v - v.mean(-1, keepdim=True)
        v = v * scale
        return (v * gain if gain is not None else v) @ direction

    head_scores = torch.stack([read(h) for h in heads])  # (layers, H)
    mlp_scores = torch.stack([read(v) for v in mlp_parts])
    embed_score, bias_score = float(read(x_embed)), float(read(bias))
    final_bias = float(shift @ direction) if shift is not None else 0.0
    total = float(head_scores.sum() + mlp_scores.sum()) + embed_score + bias_score + final_bias
    true = float(logits[answer] - (0 if wrong is None else logits[wrong]))
    if abs(total - true) > 1e-3 * max(1.0, abs(true)):
        raise ValueError(
            f"{type(body.runner).__name__}: its residual stream does not split into head and MLP outputs (the parts "
            f"add up to {total:.4f}, the logit difference is {true:.4f}): its blocks normalise what they add, an MLP "
            "multihead does not find, or its final norm or unembedding is not the plain kind (a soft-capped or scaled "
            "head)"
        )
    return {
        "heads": head_scores,
        "mlp": mlp_scores,
        "embed": embed_score,
        "bias": bias_score,
        "final_bias": final_bias,
        "total": total,
        "check": {"sum_of_parts": total, "logit_difference": true},
    }


@torch.no_grad()
def logit_lens(model, ids: Tensor) -> list[Tensor]:
    """A causal LM's next-token logits read from the residual stream after every block (``hook_resid_post``)
    through the final norm and the unembedding: ``(B, T, V)`` per block. The last equals the model's logits."""
    body = anatomy(model)
    if body.unembed is None:
        raise ValueError("the logit lens reads a causal LM's unembedding; this model has none")
    norm, head = body.final_norm, body.unembed
    seen: list[Tensor] = []
    handles = [b.hook("hook_resid_post").add_hook(lambda t, hook: seen.append(t.detach())) for b in body.blocks]
    try:
        body.runner(ids)
    finally:
        for h in handles:
            h.remove()
    return [head(norm(x) if norm is not None else x) for x in seen]


__all__ = [
    "as_batch",
    "patch_pairs",
    "per_head",
    "LogitMetric",
    "ablated",
    "activation_patching",
    "attribution_patching",
    "head_outputs",
    "logit_diff",
    "logit_lens",
    "path_patching",
    "path_patching_each",
    "token_probability",
    "direct_logit_attribution",
]
