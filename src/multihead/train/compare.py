"""``multihead compare``: the modern multi-head family side by side on the same data, tokens and steps.

Every variant is the default causal LM of ``multihead pretrain --objective clm`` (pre-LN, d_model 128, 4 heads,
4 layers, FFN 512) with one attention option changed -- never a fork of the model code:

========  ===========================================================================================
mha       multi-head attention, rotary positions (the baseline)
gqa       grouped-query attention, 2 key/value heads for 4 query heads
mla       Multi-head Latent Attention (latent 32, decoupled rotary key 16; DeepSeek-V2)
gated     a sigmoid gate on each head's output (Qiu et al. 2025)
sinks     a learned sink logit per head (as gpt-oss)
diff      differential attention (Ye et al. 2025)
alibi     ALiBi distance biases instead of rotary positions (Press et al. 2022)
talking   talking-heads attention (Shazeer et al. 2020; explicit weights)
========  ===========================================================================================

Parameter counts are matched by default: each variant's FFN width is set so that its parameter count is the closest
to the baseline's (``mha`` at the given size), since a variant that adds parameters (the gate, talking heads) or
removes them (GQA, MLA) would otherwise be compared at a different model size; ``match_params=False`` keeps one FFN
width for all. The chosen widths and counts are in ``compare.json``.

Each variant x seed is a pretraining run folder under ``OUT/`` (a finished one is reused, so an interrupted
comparison continues). Measured per run: validation perplexity, parameters, KV-cache bytes per token (from a filled
cache), training tokens/s, greedy decode tokens/s (batch 8), the first token's share of attention per layer (the
attention-sink measure), and perplexity at 4x the trained length (ALiBi as trained; rotary variants past the positions
they were trained on). Throughput is reported as the fastest seed (interference on a shared machine only slows a run;
every seed's number is in the JSON). ``OUT/compare.json``
and ``OUT/compare.png`` hold the means and standard deviations over seeds.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from .._io import FolderError, atomic_write_json, folder_kind
from ..plotting import save as save_figure

VARIANTS: dict[str, tuple[dict, str, str]] = {  # name -> (causal.decoder overrides, positional, description)
    "mha": ({}, "rope", "multi-head attention, rotary positions"),
    "gqa": ({"num_kv_heads": 2}, "rope", "grouped-query, 2 key/value heads"),
    "mla": ({"mla_latent": 32, "mla_rope_dim": 16}, "none", "latent attention, latent 32 + rope key 16"),
    "gated": ({"gate": True}, "rope", "sigmoid output gate per head"),
    "sinks": ({"sinks": True}, "rope", "a learned sink logit per head"),
    "diff": ({"differential": True}, "rope", "differential attention"),
    "alibi": ({}, "alibi", "ALiBi biases, no position embedding"),
    "talking": ({"talking_heads": True}, "rope", "talking heads (explicit weights)"),
}


def parse_variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise ValueError(f"unknown variants {bad or '(none given)'}; choose from {', '.join(VARIANTS)}")
    twice = sorted({v for v in names if names.count(v) > 1})
    if twice:  # one run trained twice would report two seeds with a spread of 0
        raise ValueError(f"variants named twice: {', '.join(twice)}; name each once (--seeds gives repeats)")
    return names


def variant_config(
    name: str,
    *,
    data: str,
    seed: int,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float,
    threads: int | None,
    size: dict | None = None,
    data_options: dict | None = None,
):
    """The pretraining config of one variant: the shared recipe, ``size`` (``causal.decoder`` fields: d_model,
    num_heads, num_layers, d_ff) and ``data_options`` (``data`` fields: limit, vocab_size) for all, then the
    variant's own option."""
    from .config import merge
    from .pretrain import PretrainConfig

    decoder, positional, _ = VARIANTS[name]
    over = {
        "data": {"name": data, "seq_len": seq_len, **(data_options or {})},
        "objective": {"name": "clm"},
        "causal": {"positional": positional, "max_len": seq_len, "decoder": {**(size or {}), **decoder}},
        "optim": {"steps": steps, "batch_size": batch_size, "lr": lr},
        "run": {"seed": seed, "threads": threads, "progress": False, "eval_every": steps},
    }
    return PretrainConfig.from_dict(merge(PretrainConfig().to_dict(), over))


def parameter_count(cfg) -> int:
    """Parameters of the causal LM a pretraining config builds (on the meta device: no memory, no time)."""
    import torch

    from ..models.seq2seq import CausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in CausalLM(cfg.causal).parameters())


def matched_ffn(variants: list[str], **kwargs) -> dict[str, int]:
    """The FFN width per variant whose parameter count is closest to the baseline's (``mha`` at ``size``).

    Parameters grow linearly in ``d_ff`` (two linear layers and a bias per block), so two meta-device builds per
    variant give the slope and the width follows; ``kwargs`` are :func:`variant_config`'s."""
    size = dict(kwargs.pop("size", None) or {})
    base_cfg = variant_config("mha", size=size, **kwargs)
    dec = base_cfg.causal.decoder
    base_ff = dec.d_ff or 4 * dec.d_model
    target = parameter_count(base_cfg)
    out = {}
    for name in variants:
        p0 = parameter_count(variant_config(name, size={**size, "d_ff": base_ff}, **kwargs))
        p1 = parameter_count(variant_config(name, size={**size, "d_ff": base_ff + 64}, **kwargs))
        slope = (p1 - p0) / 64
        width = base_ff + round((target - p0) / slope)
        if width < 1:
            raise ValueError(
                f"{name} has {p0 - target:,} more parameters than mha outside the FFN at this size, more "
                f"than an FFN of width {base_ff} holds; pass a larger --d-ff or --no-match-params"
            )
        out[name] = width
    return out


def measure(path: Path, *, long_factor: int = 4) -> dict:
    """The inference-side numbers of a finished causal LM run: cache bytes per token, decode speed, the first
    token's attention share per layer, perplexity at ``long_factor`` x the trained length."""
    import torch

    with torch.no_grad():
        return _measure(path, long_factor)


def _measure(path: Path, long_factor: int) -> dict:
    import torch

    from ..models.generation import generate
    from ..modules.capture import capture
    from .pretrain import held_out_rows, load_pretrain_run

    run = load_pretrain_run(path)
    model, n = run.model, run.config.causal.max_len
    rows = held_out_rows(run, n)[:16]  # (R, n) held-out tokens
    cache = model.new_cache()
    model(rows[:1], cache=cache)
    cache_bytes = sum(t.numel() * t.element_size() for layer in cache.self_attn for t in (layer.k, layer.v)) / n
    with capture(model, ("pattern",)) as c:
        model(rows)
    first = [float(p[:, :, 1:, 0].mean()) for p in c.patterns()]  # queries after the first, key 0
    prompts = rows[:8, : n // 2]
    t0 = time.perf_counter()
    out = generate(model, prompts, torch.ones_like(prompts, dtype=torch.bool), max_new_tokens=n - n // 2)
    decode = sum(len(t) for t in out.tokens) / (time.perf_counter() - t0)
    # every variant at long_factor x the trained length: ALiBi as it is (no table), the rotary ones (MLA's decoupled
    # rotary key included) through a cache that lets them run past max_len (positions they never saw in training)
    from ..modules.kv import KVCache

    long_rows = held_out_rows(run, long_factor * n)[:4].long()  # (4, factor * n)
    past = None if run.config.causal.positional == "alibi" else KVCache(len(model.decoder.layers), extrapolate=True)
    long_logits = model(long_rows, cache=past)[:, :-1]  # predicting token t + 1 from tokens <= t
    # the same text cut into trained-length pieces (context restarts each piece): the same targets, every one of
    # them predicted from at most n - 1 tokens; the first token of each piece has no context there, so it is
    # left out of both
    pieces = long_rows.reshape(-1, n)
    piece_logits = model(pieces)[:, :-1].reshape(long_rows.shape[0], long_factor, n - 1, -1)
    targets = long_rows[:, 1:].reshape(long_rows.shape[0], -1)
    inside = torch.ones(long_rows.shape[1] - 1, dtype=torch.bool)
    inside[n - 1 :: n] = False  # targets that start a piece
    ce = torch.nn.functional.cross_entropy
    long_ppl = math.exp(float(ce(long_logits[:, inside].flatten(0, 1).float(), targets[:, inside].flatten())))
    piece_targets = long_rows.reshape(long_rows.shape[0], long_factor, n)[:, :, 1:]
    piece_ppl = math.exp(float(ce(piece_logits.flatten(0, 2).float(), piece_targets.flatten())))
    return {
        "kv_cache_bytes_per_token": cache_bytes,
        "decode_tokens_per_second": decode,
        "first_token_share": first,
        "long_perplexity": long_ppl,
        "pieces_perplexity": piece_ppl,
        "long_factor": long_factor,
    }


def run_compare(
    *,
    data: str,
    variants: list[str],
    seeds: list[int],
    out: Path,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float,
    threads: int | None = None,
    size: dict | None = None,
    data_options: dict | None = None,
    match_params: bool = True,
    overwrite: bool = False,
    log=print,
) -> dict:
    from .._io import folder_lock

    common = dict(
        data=data,
        seed=seeds[0] if seeds else 0,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        threads=threads,
        data_options=data_options,
    )
    size = dict(size or {})
    # every variant's config and model shape is checked before any run trains (meta device: no memory)
    ffn = matched_ffn(variants, size=size, **common) if match_params else {}
    sizes = {v: {**size, "d_ff": ffn[v]} if v in ffn else size for v in variants}
    for name in variants:
        parameter_count(variant_config(name, size=sizes[name], **common))
    out = Path(out)
    with folder_lock(out):  # one comparison writes a folder at a time (each run inside is locked by pretrain too)
        out.mkdir(parents=True, exist_ok=True)
        return _run_locked(
            data=data,
            variants=variants,
            seeds=seeds,
            out=out,
            steps=steps,
            batch_size=batch_size,
            seq_len=seq_len,
            lr=lr,
            threads=threads,
            sizes=sizes,
            data_options=data_options,
            matched=match_params,
            overwrite=overwrite,
            log=log,
        )


# run settings that do not change what a run learns, and fields pretraining fills in from the data (the vocabulary
# the tokenizer reached)
_VOLATILE = (("run", "threads"), ("run", "progress"), ("causal", "vocab_size"), ("model", "vocab_size"))


def _same_recipe(stored: dict, cfg) -> bool:
    want = cfg.to_dict()
    for d in (stored, want):
        for section, key in _VOLATILE:
            d.get(section, {}).pop(key, None)
    return stored == want


def _run_locked(
    *,
    data,
    variants,
    seeds,
    out: Path,
    steps,
    batch_size,
    seq_len,
    lr,
    threads,
    sizes,
    data_options,
    matched,
    overwrite,
    log,
) -> dict:
    from .pretrain import pretrain
    from .runfolder import read_json

    plan, stale = [], []  # every finished run is checked against its recipe before anything trains
    for name in variants:
        for seed in seeds:
            folder = out / f"{name}-s{seed}"
            cfg = variant_config(
                name,
                data=data,
                seed=seed,
                steps=steps,
                batch_size=batch_size,
                seq_len=seq_len,
                lr=lr,
                threads=threads,
                size=sizes[name],
                data_options=data_options,
            )
            kind = folder_kind(folder)
            if kind not in ("missing", "empty", "run"):  # never trained over, even with --overwrite
                raise FolderError(
                    f"{folder} holds files that are not a run of this comparison; move them out, or use another --out"
                )
            done = (folder / "results.json").is_file()
            if kind == "run" and not _same_recipe(read_json(folder / "config.json", dict).get("pretrain", {}), cfg):
                stale.append(folder.name)  # finished or not: another recipe is replaced only with --overwrite
                done = False
            plan.append((name, seed, folder, cfg, done))
    if stale and not overwrite:
        raise ValueError(
            f"{', '.join(stale)} in {out} were trained with another recipe (steps, size, data or "
            "parameter matching differ); use another --out, or --overwrite to retrain them"
        )
    rows = []
    for name, seed, folder, cfg, done in plan:
        if done:
            results = read_json(folder / "results.json", dict)
            log(f"{name} seed {seed}: reusing {folder}")
        else:
            log(f"{name} seed {seed}: training {steps} steps -> {folder}")
            results = pretrain(cfg, folder, overwrite=True)
        m = measure(folder)
        rows.append(
            {
                "variant": name,
                "seed": seed,
                "d_ff": cfg.causal.decoder.d_ff,
                "perplexity": results["validation"]["perplexity"],
                "parameters": results["parameters"],
                "train_tokens_per_second": results["tokens_per_second"],
                "minutes": results["minutes"],
                **m,
            }
        )
        log(
            f"  perplexity {rows[-1]['perplexity']:.1f}, cache {m['kv_cache_bytes_per_token']:.0f} B/token, "
            f"decode {m['decode_tokens_per_second']:.0f} tok/s, first-token share "
            + " ".join(f"{v:.3f}" for v in m["first_token_share"])
        )
    payload = {
        "data": data,
        "steps": steps,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "lr": lr,
        "seeds": seeds,
        "matched_parameters": matched,
        "variants": {v: VARIANTS[v][2] for v in variants},
        "runs": rows,
        "summary": summarise(rows, variants),
    }
    atomic_write_json(out / "compare.json", payload)
    plot(payload, out / "compare.png")
    return payload


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarise(rows: list[dict], variants: list[str]) -> dict:
    out = {}
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]
        if not rs:
            continue
        s = {k: _mean_std([r[k] for r in rs]) for k in ("perplexity", "kv_cache_bytes_per_token")}
        for k in ("train_tokens_per_second", "decode_tokens_per_second"):  # the fastest seed: noise only slows
            s[k] = (max(r[k] for r in rs), 0.0)
        s["parameters"] = rs[0]["parameters"]
        s["d_ff"] = rs[0].get("d_ff")
        s["first_token_share"] = [
            statistics.fmean(r["first_token_share"][l] for r in rs) for l in range(len(rs[0]["first_token_share"]))
        ]
        for k in ("long_perplexity", "pieces_perplexity"):
            got = [r[k] for r in rs if r.get(k) is not None]
            s[k] = _mean_std(got) if got else None
        s["seeds"] = len(rs)
        out[v] = s
    return out


def format_table(payload: dict) -> str:
    matched = "parameters matched through the FFN width" if payload.get("matched_parameters") else "one FFN width"
    factor = payload["runs"][0]["long_factor"] if payload["runs"] else 4
    lines = [
        f"{payload['data']}, {payload['steps']} steps x {payload['batch_size']} rows x {payload['seq_len']} "
        f"tokens, seeds {payload['seeds']} (mean +- std; tokens/s: the fastest seed), {matched}",
        f"{'variant':<9}{'d_ff':>5}{'params':>11}{'val ppl':>15}{f'{factor}x: one pass':>16}{'in pieces':>16}"
        f"{'KV B/tok':>10}"
        f"{'train tok/s':>13}{'decode tok/s':>14}  first-token share by layer",
    ]
    for v, s in payload["summary"].items():
        (pm, ps), long, pieces = s["perplexity"], s.get("long_perplexity"), s.get("pieces_perplexity")
        long_text = "".join(f"{x[0]:>9.1f} +-{x[1]:>5.1f}" if x else f"{'-':>16}" for x in (long, pieces))
        lines.append(
            f"{v:<9}{s.get('d_ff') or '':>5}{s['parameters']:>11,}{pm:>8.1f} +-{ps:>5.1f}{long_text}"
            f"{s['kv_cache_bytes_per_token'][0]:>10.0f}{s['train_tokens_per_second'][0]:>13.0f}"
            f"{s['decode_tokens_per_second'][0]:>14.0f}  " + " ".join(f"{x:.3f}" for x in s["first_token_share"])
        )
    return "\n".join(lines)


def plot(payload: dict, path: Path) -> None:
    from ..plotting import pyplot

    plt = pyplot()
    names = list(payload["summary"])
    s = payload["summary"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4))
    x = list(range(len(names)))
    factor = payload["runs"][0]["long_factor"] if payload["runs"] else 4
    bars = [
        ("perplexity", "validation, trained length", "C0"),
        ("pieces_perplexity", f"{factor}x-length texts, in trained-length pieces", "C2"),
        ("long_perplexity", f"the same texts in one pass ({factor}x the trained length)", "C3"),
    ]
    for slot, (key, label, colour) in enumerate(bars):
        vals = [s[n].get(key) or (float("nan"), 0.0) for n in names]
        a.bar(
            [i + (slot - 1) * 0.27 for i in x],
            [m for m, _ in vals],
            0.27,
            yerr=[sd for _, sd in vals],
            capsize=2,
            label=label,
            color=colour,
        )
    a.set_xticks(x, names)
    a.set_yscale("log")
    a.legend(fontsize=7)
    a.set_title("validation perplexity (mean +- std over seeds)", fontsize=9)
    b.bar(names, [s[n]["kv_cache_bytes_per_token"][0] for n in names], color="C1")
    b.set_title("KV-cache bytes per token (all layers)", fontsize=9)
    for n in names:
        c.plot(range(len(s[n]["first_token_share"])), s[n]["first_token_share"], "o-", label=n)
    c.set_xlabel("layer")
    c.set_title("first token's share of attention", fontsize=9)
    c.legend(fontsize=7)
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=45, labelsize=8)
    fig.tight_layout()
    save_figure(fig, path, formats=("png",), dpi=100)


__all__ = [
    "VARIANTS",
    "format_table",
    "matched_ffn",
    "measure",
    "parameter_count",
    "parse_variants",
    "run_compare",
    "variant_config",
]
