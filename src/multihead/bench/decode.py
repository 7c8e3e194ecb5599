"""``multihead bench decode``: generation speed of a decoder-only model, each case in a fresh process.

One GPT-2-shaped model (d_model 256, 4 layers, 4 heads, FFN 1024, GELU-tanh, learned positions, pre-LN, tied
embeddings, vocabulary 4096, random weights; or, with ``--model RUN``, the shape of a causal LM pretraining run), a
16-token prompt, greedy decoding of exactly N new tokens (``--batches``: default 1 and 16):

* ``cached`` -- :func:`multihead.generate` with the KV cache (each step feeds one token per row);
* ``recompute`` -- the same model re-running the whole prefix at every step (no cache): the cost the cache removes,
  quadratic in length (batch 1 only, and at most 256 new tokens: it would take minutes beyond);
* ``hf_generate`` -- HF transformers' ``GPT2LMHeadModel.generate(use_cache=True, do_sample=False)`` with the same
  shape (PyTorch's SDPA attention, HF's default), needs ``transformers``.

With ``--model smollm2`` (or any pretrained LM :mod:`multihead.lm` loads: a ``.gguf`` file, an HF folder) the race is
on that model, loaded by us and by HF transformers from the same file (HF: ``from_pretrained(gguf_file=...)`` or the
folder, SDPA attention); the prompt is 16 random ordinary tokens, end-of-text never stops either side, and two
more cases time the prompt's forward pass at ``--prefill`` lengths (default 512 and 4096): ``prefill`` (ours,
filling the KV cache) and ``hf_prefill`` (HF's forward with ``use_cache=True``).

Reported: new tokens per second (batch x N / seconds), the speed-up of ``cached`` over the others measured in the
same run, and each case's peak memory above its start. ``--device cuda --dtype bf16`` runs every model there.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import machine_info, run_case, target, write_json

SUITE = "multihead.bench.decode"
D_MODEL, LAYERS, HEADS, D_FF, VOCAB, PROMPT = 256, 4, 4, 1024, 4096, 16
GPT2_SHAPE = {
    "d_model": D_MODEL,
    "layers": LAYERS,
    "heads": HEADS,
    "d_ff": D_FF,
    "vocab": VOCAB,
    "positional": "learned",
}
NEW_TOKENS = [64, 256, 1024]
BATCHES = [1, 16]
IMPLS = ["cached", "recompute", "hf_generate"]
RECOMPUTE_MAX = 256


def _ours(shape: dict, max_len: int):
    from ..models.seq2seq import CausalLM, CausalLMConfig
    from ..modules.decoder import DecoderConfig

    cfg = CausalLMConfig(
        vocab_size=shape["vocab"],
        max_len=max_len,
        positional=shape["positional"],
        decoder=DecoderConfig(
            d_model=shape["d_model"],
            num_heads=shape["heads"],
            num_layers=shape["layers"],
            d_ff=shape["d_ff"],
            activation="gelu_tanh",
            norm_first=True,
            dropout=0.0,
            cross_attention=False,
        ),
    )
    return CausalLM(cfg).eval()


def _hf(shape: dict, max_len: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=shape["vocab"],
        n_positions=max_len,
        n_embd=shape["d_model"],
        n_layer=shape["layers"],
        n_head=shape["heads"],
        n_inner=shape["d_ff"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=0,
        eos_token_id=None,
        bos_token_id=None,
    )
    return GPT2LMHeadModel(cfg).eval()


def shape_of_run(path) -> dict:
    """The shape of a causal LM pretraining run (``multihead pretrain --objective clm``), for a same-shape race."""
    import json

    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        cfg = None
    causal = cfg.get("pretrain", {}).get("causal") if isinstance(cfg, dict) else None
    if not causal or cfg["pretrain"].get("objective", {}).get("name") != "clm":
        raise ValueError(f"--model {path}: not a causal LM pretraining run (multihead pretrain --objective clm)")
    dec = causal["decoder"]
    return {
        "d_model": dec["d_model"],
        "layers": dec["num_layers"],
        "heads": dec["num_heads"],
        "d_ff": dec["d_ff"] or 4 * dec["d_model"],
        "vocab": causal["vocab_size"],
        "positional": causal["positional"],
        "from": str(path),
    }


_LOADED: dict = {}


def _pretrained(source: str, impl: str):
    """A pretrained LM loaded once per worker process: ours (``multihead.lm``) or HF's from the same file."""
    if (source, impl) not in _LOADED:
        from .. import lm

        if impl.startswith("hf"):
            import transformers

            path = lm.resolve(source)
            kwargs = {"gguf_file": path.name} if path.is_file() else {}
            folder = path.parent if path.is_file() else path
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
        else:
            model = lm.load(source).model
        _LOADED[(source, impl)] = model
    return _LOADED[(source, impl)]


def _build_pretrained(case: dict):
    source, impl, b, n = case["shape"]["pretrained"], case["impl"], case["batch"], case["new_tokens"]
    model = _pretrained(source, impl)
    vocab = model.config.vocab_size
    length = case.get("prefill") or PROMPT
    ids = torch.randint(1000, vocab, (b, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if impl == "prefill":
        return torch.no_grad()(lambda: model.prefill(ids))
    if impl == "hf_prefill":
        return torch.no_grad()(lambda: model(ids, attention_mask=mask, use_cache=True))
    if impl == "cached":
        from ..models.generation import generate

        return lambda: generate(model, ids, None, max_new_tokens=n)
    if impl == "hf_generate":
        return lambda: model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
    raise ValueError(f"a pretrained race has the cases cached, hf_generate, prefill, hf_prefill; got {impl!r}")


def build(case: dict):
    b, n = case["batch"], case["new_tokens"]
    shape = case.get("shape", GPT2_SHAPE)
    if "pretrained" in shape:
        return _build_pretrained(case)
    max_len = PROMPT + case.get("max_new", n)
    device, dtype = target(case)
    ids = torch.randint(1, shape["vocab"], (b, PROMPT), generator=torch.Generator().manual_seed(0)).to(device)
    if case["impl"] == "cached":
        from ..models.generation import generate

        model = _ours(shape, max_len).to(device=device, dtype=dtype)
        return lambda: generate(model, ids, None, max_new_tokens=n)
    if case["impl"] == "recompute":
        model = _ours(shape, max_len).to(device=device, dtype=dtype)

        @torch.no_grad()
        def step():
            seq = ids
            for _ in range(n):
                nxt = model(seq)[:, -1].argmax(-1)
                seq = torch.cat([seq, nxt[:, None]], 1)
            return seq

        return step
    if case["impl"] == "hf_generate":
        model = _hf(shape, max_len).to(device=device, dtype=dtype)
        mask = torch.ones_like(ids)
        return lambda: model.generate(
            ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True
        )
    raise ValueError(f"unknown implementation {case['impl']!r}; choose from {IMPLS}")


def flops(case: dict) -> float:
    return 0.0


def run(
    *,
    lengths=None,
    impls=None,
    threads=None,
    out: Path | None = None,
    min_time: float = 0.0,
    progress=True,
    batches=None,
    shape: dict | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    prefill=None,
) -> dict:
    from tqdm import tqdm

    shape = shape or GPT2_SHAPE
    pretrained = "pretrained" in shape
    lengths = lengths or ([64] if pretrained else NEW_TOKENS)
    batches = batches or ([1, 8] if pretrained else BATCHES)
    impls = impls or (["cached", "hf_generate"] if pretrained else IMPLS)
    cases, results = [], []
    for n in lengths:
        for b in batches:
            for impl in impls:
                cases.append(
                    {
                        "impl": impl,
                        "batch": b,
                        "new_tokens": n,
                        "shape": shape,
                        "max_new": max(lengths),
                        "device": device,
                        "dtype": dtype,
                    }
                )
    if pretrained:
        for length in prefill or [512, 4096]:
            for impl in ("prefill", "hf_prefill"):
                cases.append(
                    {
                        "impl": impl,
                        "batch": 1,
                        "new_tokens": 0,
                        "prefill": length,
                        "shape": shape,
                        "device": device,
                        "dtype": dtype,
                    }
                )
    for c in tqdm(cases, desc="bench decode", disable=not progress):
        if c["impl"] == "recompute" and (c["batch"] > 1 or c["new_tokens"] > RECOMPUTE_MAX):
            results.append(
                {
                    **c,
                    "error": f"skipped: recomputing the prefix is quadratic (batch 1, at most "
                    f"{RECOMPUTE_MAX} new tokens are measured)",
                }
            )
            continue
        results.append(run_case(SUITE, c, threads=threads, min_time=min_time, min_repeats=1, timeout=1200))

    def key(r):
        return r["batch"], r["new_tokens"], r.get("prefill")

    ours = ("cached", "prefill")
    base = {key(r): r for r in results if r["impl"] in ours and "error" not in r}
    for r in results:
        if "error" in r:
            continue
        r["tokens_per_second"] = r["batch"] * (r["new_tokens"] or r.get("prefill", 0)) / r["seconds_min"]
        ref = base.get(key(r))
        if ref and r is not ref:
            r["cached_speedup"] = r["seconds_min"] / ref["seconds_min"]
    config = {**shape, "prompt": PROMPT, "device": device, "dtype": dtype}
    if pretrained:
        c = _pretrained(shape["pretrained"], "cached").config
        config.update(
            d_model=c.decoder.d_model,
            layers=c.decoder.num_layers,
            heads=c.decoder.num_heads,
            d_ff=c.decoder.d_ff,
            vocab=c.vocab_size,
            positional=c.positional,
        )
        _LOADED.clear()
    payload = {"suite": "decode", "config": config, "machine": machine_info(threads, device), "results": results}
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    c = payload["config"]
    m = payload["machine"]
    lines = [
        f"torch {m['torch']} on {m.get('gpu') or str(m['threads']) + ' threads'}, {c.get('dtype', 'fp32')}; "
        f"d_model {c['d_model']}, "
        f"{c['layers']} layers, {c['heads']} heads, FFN {c['d_ff']}, vocab {c['vocab']}, ours with "
        f"{c['positional']} positions"
        + (
            f"; pretrained {c['pretrained']}, ours vs HF from the same file"
            if "pretrained" in c
            else " (HF GPT-2: learned)"
        )
        + f"{' (shape of ' + c['from'] + ')' if 'from' in c else ''}"
        f"; prompt {PROMPT}; greedy",
        f"{'new':>5} {'batch':>5} {'impl':<12}{'seconds':>9}{'tokens/s':>10}{'cached is':>11}{'peak MiB':>10}",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['new_tokens']:>5} {r['batch']:>5} {r['impl']:<12} {r['error']}")
            continue
        sp = r.get("cached_speedup")
        if r.get("prefill"):
            lines.append(
                f"{'L=' + str(r['prefill']):>11} {r['impl']:<12}{r['seconds_min']:>9.2f}"
                f"{r['tokens_per_second']:>10.0f}{(f'{sp:.2f}x' if sp else '-'):>11}{r['peak_mb'] or 0:>10.0f}"
            )
            continue
        lines.append(
            f"{r['new_tokens']:>5} {r['batch']:>5} {r['impl']:<12}{r['seconds_min']:>9.2f}"
            f"{r['tokens_per_second']:>10.0f}{(f'{sp:.2f}x' if sp else '-'):>11}{r['peak_mb'] or 0:>10.0f}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"decode-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench decode`` (the suite protocol in :mod:`multihead.bench`); ``--lengths`` = new tokens."""
    model = getattr(args, "model", None)
    from ..loading import kind

    if model and kind(model).name == "lm":
        from .. import lm

        lm.resolve(model)  # the install line now, not a failure in every worker
        shape = {"pretrained": model}
    else:
        shape = shape_of_run(model) if model else None
    return run(
        prefill=getattr(args, "prefill", None),
        lengths=args.lengths,
        impls=args.impls,
        threads=args.threads,
        out=out,
        min_time=args.min_time or 0.0,
        batches=getattr(args, "batches", None),
        shape=shape,
        device=getattr(args, "device", "cpu"),
        dtype=getattr(args, "dtype", "fp32"),
    )
