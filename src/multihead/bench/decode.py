"""``multihead bench decode``: generation speed of a decoder-only model, each case in a fresh process.

One GPT-2-shaped model (d_model 256, 4 layers, 4 heads, FFN 1024, GELU-tanh, learned positions, pre-LN, tied
embeddings, vocabulary 4096, random weights), a 16-token prompt, greedy decoding of exactly N new tokens:

* ``cached`` -- :func:`multihead.generate` with the KV cache (each step feeds one token per row);
* ``recompute`` -- the same model re-running the whole prefix at every step (no cache): the cost the cache removes,
  quadratic in length (batch 1 only, and at most 256 new tokens: it would take minutes beyond);
* ``hf_generate`` -- HF transformers' ``GPT2LMHeadModel.generate(use_cache=True, do_sample=False)`` with the same
  shape (PyTorch's SDPA attention, HF's default), needs ``transformers``.

Reported: new tokens per second (batch x N / seconds), the speed-up of ``cached`` over the others measured in the
same run, and each case's peak memory above its start.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import machine_info, run_case, write_json

SUITE = "multihead.bench.decode"
D_MODEL, LAYERS, HEADS, D_FF, VOCAB, PROMPT = 256, 4, 4, 1024, 4096, 16
NEW_TOKENS = [64, 256, 1024]
BATCHES = [1, 16]
IMPLS = ["cached", "recompute", "hf_generate"]
RECOMPUTE_MAX = 256


def _ours():
    from ..models.seq2seq import CausalLM, CausalLMConfig
    from ..modules.decoder import DecoderConfig

    cfg = CausalLMConfig(vocab_size=VOCAB, max_len=PROMPT + max(NEW_TOKENS), positional="learned",
                         decoder=DecoderConfig(d_model=D_MODEL, num_heads=HEADS, num_layers=LAYERS, d_ff=D_FF,
                                               activation="gelu_tanh", norm_first=True, dropout=0.0,
                                               cross_attention=False))
    return CausalLM(cfg).eval()


def _hf():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=PROMPT + max(NEW_TOKENS), n_embd=D_MODEL, n_layer=LAYERS,
                     n_head=HEADS, n_inner=D_FF, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return GPT2LMHeadModel(cfg).eval()


def build(case: dict):
    b, n = case["batch"], case["new_tokens"]
    ids = torch.randint(1, VOCAB, (b, PROMPT), generator=torch.Generator().manual_seed(0))
    if case["impl"] == "cached":
        from ..models.generation import generate

        model = _ours()
        return lambda: generate(model, ids, None, max_new_tokens=n)
    if case["impl"] == "recompute":
        model = _ours()

        @torch.no_grad()
        def step():
            seq = ids
            for _ in range(n):
                nxt = model(seq)[:, -1].argmax(-1)
                seq = torch.cat([seq, nxt[:, None]], 1)
            return seq

        return step
    if case["impl"] == "hf_generate":
        model = _hf()
        mask = torch.ones_like(ids)
        return lambda: model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, use_cache=True)
    raise ValueError(f"unknown implementation {case['impl']!r}; choose from {IMPLS}")


def flops(case: dict) -> float:
    return 0.0


def run(*, lengths=None, impls=None, threads=None, out: Path | None = None, min_time: float = 0.0,
        progress=True) -> dict:
    from tqdm import tqdm

    cases, results = [], []
    for n in lengths or NEW_TOKENS:
        for b in BATCHES:
            for impl in impls or IMPLS:
                cases.append({"impl": impl, "batch": b, "new_tokens": n})
    for c in tqdm(cases, desc="bench decode", disable=not progress):
        if c["impl"] == "recompute" and (c["batch"] > 1 or c["new_tokens"] > RECOMPUTE_MAX):
            results.append({**c, "error": f"skipped: recomputing the prefix is quadratic (batch 1, at most "
                                          f"{RECOMPUTE_MAX} new tokens are measured)"})
            continue
        results.append(run_case(SUITE, c, threads=threads, min_time=min_time, min_repeats=1, timeout=1200))
    base = {(r["batch"], r["new_tokens"]): r for r in results if r["impl"] == "cached" and "error" not in r}
    for r in results:
        if "error" in r:
            continue
        r["tokens_per_second"] = r["batch"] * r["new_tokens"] / r["seconds_min"]
        ref = base.get((r["batch"], r["new_tokens"]))
        if ref and r is not ref:
            r["cached_speedup"] = r["seconds_min"] / ref["seconds_min"]
    payload = {"suite": "decode", "config": {"d_model": D_MODEL, "layers": LAYERS, "heads": HEADS, "d_ff": D_FF,
                                              "vocab": VOCAB, "prompt": PROMPT},
               "machine": machine_info(threads), "results": results}
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    lines = [f"torch {payload['machine']['torch']}, {payload['machine']['threads']} threads; GPT-2 shape d_model "
             f"{D_MODEL}, {LAYERS} layers, {HEADS} heads, vocab {VOCAB}; prompt {PROMPT}; greedy",
             f"{'new':>5} {'batch':>5} {'impl':<12}{'seconds':>9}{'tokens/s':>10}{'cached is':>11}{'peak MiB':>10}"]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['new_tokens']:>5} {r['batch']:>5} {r['impl']:<12} {r['error']}")
            continue
        sp = r.get("cached_speedup")
        lines.append(f"{r['new_tokens']:>5} {r['batch']:>5} {r['impl']:<12}{r['seconds_min']:>9.2f}"
                     f"{r['tokens_per_second']:>10.0f}{(f'{sp:.2f}x' if sp else '-'):>11}{r['peak_mb'] or 0:>10.0f}")
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"decode-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench decode`` (the suite protocol in :mod:`multihead.bench`); ``--lengths`` = new tokens."""
    return run(lengths=args.lengths, impls=args.impls, threads=args.threads, out=out, min_time=args.min_time or 0.0)
