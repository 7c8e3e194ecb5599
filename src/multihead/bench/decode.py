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
filling the KV cache) and ``hf_prefill`` (HF's forward with ``use_cache=True``). A GGUF model also races llama.cpp
(:mod:`multihead.bench.llamacpp`) on copies of the same file: a current llama.cpp (PyPI's ``xllamacpp``) at
``xllamacpp_f32`` (dequantised to float32, our precision), ``xllamacpp_bf16``, ``xllamacpp_q8_0``, ``xllamacpp_q4_1``
(requantised from the float32 values) and ``xllamacpp`` (the file's own quantisation), and gpt4all's 2024 build at ``llamacpp_f32`` and
``llamacpp``; llama.cpp decodes one row at a time, so its batch cases run the rows in turn, and the xllamacpp
cases never stop at end-of-text (gpt4all's build does). With ``--context N`` (default 4096) every
implementation also decodes after N tokens of held-out text, ours under each KV policy (``cached:window``, ...,
at ``--kv-budget`` keys per head, default 512; ``cached:head-aware`` needs ``--kv-heads`` kv-heads.json).

Reported: new tokens per second (batch x N / seconds, prompt included), **decode tokens per second** (from the
time of each new token: the prompt excluded), the speed-up of ``cached`` over the others measured in the same
run, and each case's peak memory above its start. ``--device cuda --dtype bf16`` runs every model there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

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
_STAMPS: list[list[float]] = []  # per timed run: the time of each new token (decode-only speed)


def _pretrained(source: str, impl: str):
    """A pretrained LM loaded once per worker process: ours (``multihead.lm``) or HF's from the same file."""
    if (source, impl) not in _LOADED:
        from ..loading import kind

        if impl.startswith("hf"):
            import transformers

            path = kind(source).path
            kwargs = {"gguf_file": path.name} if path.is_file() else {}
            folder = path.parent if path.is_file() else path
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
        else:
            from ..loading import load as load_source  # the one loader: it knows what a source is

            model = load_source(source).detail.model
        _LOADED[(source, impl)] = model
    return _LOADED[(source, impl)]


def _prompt(case: dict, vocab: int) -> torch.Tensor:
    """``(batch, length)``: 16 random ordinary tokens (or ``prefill`` of them), or ``context`` tokens of held-out
    IMDB text (every row the same)."""
    b = case["batch"]
    if case.get("context"):
        from ..heads.lm import held_out_rows

        key = ("text", case["shape"]["pretrained"], case["context"])
        if key not in _LOADED:
            from ..loading import load as load_source  # the one loader: it knows what a source is

            _LOADED[key] = held_out_rows(
                load_source(case["shape"]["pretrained"]).detail, rows=1, length=case["context"]
            )
        return _LOADED[key].expand(b, -1)
    length = case.get("prefill") or PROMPT
    low = min(1000, vocab // 10)  # ordinary tokens, past the special ones
    return torch.randint(low, vocab, (b, length), generator=torch.Generator().manual_seed(0))


def _stamp_runs():
    """A fresh list of token times for one timed run, and the streamer that fills it."""
    times: list[float] = []
    _STAMPS.append(times)
    return times, lambda *_: times.append(time.perf_counter())


class _HFStamps:
    """HF's streamer protocol: ``put`` gets the prompt first, then each new token."""

    def __init__(self) -> None:
        self.times, self.calls = _stamp_runs()[0], 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls > 1:
            self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def recorded(case: dict) -> dict:
    """What the timed runs recorded beside their total time: decode-only tokens/s (the best run), the new tokens."""
    if not _STAMPS:
        return {}
    rates, counts = [], []
    for runs in _split_rows(case):
        steps = sum(len(t) - 1 for t in runs if len(t) > 1)
        span = sum(t[-1] - t[0] for t in runs if len(t) > 1)
        if span > 0:
            rows = 1 if _llamacpp(case["impl"]) else case["batch"]
            rates.append(rows * steps / span)
            counts.append(sum(len(t) for t in runs) * rows)
    _STAMPS.clear()
    if not rates:
        return {}
    out = {"decode_tokens_per_second": max(rates), "new_tokens_made": counts[rates.index(max(rates))]}
    return {**out, **_kernel(case)}


def _kernel(case: dict) -> dict:
    """The kernel our decoding step chose in this process, and why (ours); llama.cpp's build and what it uses of the
    CPU (the xllamacpp cases)."""
    from ..models import fast_decode

    peer = _LOADED.get(("llamacpp", case["impl"]))
    if peer is not None and hasattr(peer, "system"):
        return {"llamacpp_version": peer.version, "llamacpp_system": peer.system}

    model = _LOADED.get((case.get("shape", {}).get("pretrained"), "cached"))
    path = {}
    if model is not None and hasattr(model, "hf"):  # attached: multihead's step over HF's weights, or HF's layers
        from ..hf import lean

        with torch.no_grad():
            reason = lean.why_not(model.hf)
        path["path"] = f"HF's layers ({reason})" if reason else "multihead's step over HF's weights"
        model = None if reason else lean.view(model.hf)
    choice = None if model is None else fast_decode.chosen(model)
    if choice is None:
        return path
    return {**path, "kernel": choice.kernel, "kernel_choice": choice.as_dict(), "why": choice.why()}


def _split_rows(case: dict) -> list[list[list[float]]]:
    """The recorded runs grouped per timed call (llama.cpp decodes a batch's rows in turn: one list per row)."""
    per = case["batch"] if _llamacpp(case["impl"]) else 1
    return [_STAMPS[i : i + per] for i in range(0, len(_STAMPS), per)]


# ours with weights stored in another format (multihead.models.precision)
PRECISIONS = {"cached_bf16": "bf16", "cached_int8": "int8", "compiled_step_bf16": "bf16", "compiled_step_int8": "int8"}
# llama.cpp's cases: engine and precision of the copy it reads
LLAMACPP = {
    "llamacpp": ("gpt4all", "as-is"),
    "llamacpp_f32": ("gpt4all", "f32"),
    "xllamacpp": ("xllamacpp", "as-is"),
    "xllamacpp_f32": ("xllamacpp", "f32"),
    "xllamacpp_bf16": ("xllamacpp", "bf16"),
    "xllamacpp_q8_0": ("xllamacpp", "q8_0"),
    "xllamacpp_q4_1": ("xllamacpp", "q4_1"),
}


def _llamacpp(impl: str) -> bool:
    return impl in LLAMACPP


def _build_llamacpp(case: dict):
    from ..loading import kind
    from . import llamacpp as L

    source, b, n = case["shape"]["pretrained"], case["batch"], case["new_tokens"]
    if not _is_gguf(source):
        raise ValueError(f"llama.cpp reads GGUF files; {source} is not one")
    engine, precision = LLAMACPP[case["impl"]]
    copy = L.llamacpp_copy(kind(source).path, precision)
    context = max(2048, case.get("context", 0) + n + 64)
    model = L.load(copy, threads=torch.get_num_threads(), context=context, engine=engine)
    _LOADED[("llamacpp", case["impl"])] = model
    key = ("tokenizer", source)
    if key not in _LOADED:
        from ..loading import load as load_source  # the one loader: it knows what a source is

        _LOADED[key] = load_source(source).detail
    ids = _prompt(case, _LOADED[key].model.config.vocab_size)[0].tolist()
    prompt = ids if engine == "xllamacpp" else _LOADED[key].decode(ids)  # gpt4all's build takes text

    def run():
        for _ in range(b):  # one row at a time: llama.cpp's one slot decodes a row
            _stamp_runs()[0].extend(L.generate(model, prompt, n)["times"])

    return run


def _build_pretrained(case: dict):
    source, impl, n = case["shape"]["pretrained"], case["impl"], case["new_tokens"]
    if _llamacpp(impl):
        return _build_llamacpp(case)
    model = _pretrained(source, "hf" if impl.startswith("hf") else "cached")
    ids = _prompt(case, model.config.vocab_size)
    mask = torch.ones_like(ids)
    if impl == "bound":
        return _bound(model)
    if impl == "bound_compiled":
        return _bound(model, compiled=True)
    if impl == "prefill":
        return torch.no_grad()(lambda: model.prefill(ids))
    if impl == "hf_prefill":
        return torch.no_grad()(lambda: model(ids, attention_mask=mask, use_cache=True))
    if impl in (
        "cached",
        "cached_old",
        "cached_hf_layers",
        "compiled",
        "compiled_step",
        "blas",
        *PRECISIONS,
    ) or impl.startswith("cached:"):
        from ..models import fast_decode, kernels, precision
        from ..models.generation import generate
        from ..modules import fastpath

        if impl in PRECISIONS:  # weights stored in that format (this process's copy of the model)
            precision.convert(model, PRECISIONS[impl])

        if impl == "blas":  # the lean step's BLAS product, whatever this machine's measurement chose (this process)
            os.environ[kernels.ENV] = "blas"

        if impl == "cached_hf_layers":  # an attached model through HF's own layers (this process only)
            if not hasattr(model, "hf"):
                raise ValueError(f"cached_hf_layers is an attached model's case; {source} is read natively")
            from ..hf import lean

            lean.ENABLED = False
        if impl == "cached_old":  # the path before the decoding layout and the lean step (this process only)
            fastpath.LAYOUT = fast_decode.ENABLED = False
        if impl == "compiled":  # batch 1 takes the compiled step; a batch the lean one on the rows layout
            fast_decode.compile(model)
        if impl.startswith("compiled_step"):  # batch 1 takes one compiled graph per step; a batch the lean step
            fast_decode.compile(model, whole_step=True)
        policy = _policy(case)

        def ours():
            return generate(model, ids, None, max_new_tokens=n, streamer=_stamp_runs()[1], kv_policy=policy)

        return ours
    if impl == "hf_generate":
        return lambda: model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            streamer=_HFStamps(),
        )
    raise ValueError(
        "a pretrained race has the cases cached, blas, cached_bf16, cached_int8, cached_old, cached_hf_layers, "
        "compiled, compiled_step, compiled_step_bf16, compiled_step_int8, cached:POLICY, "
        "bound, bound_compiled, "
        f"hf_generate, {', '.join(LLAMACPP)}, prefill and hf_prefill; got {impl!r}"
    )


def _bound(model, compiled: bool = False):
    """The physical limit of a batch-1 step: one product of a row with every weight matrix of ``model``, nothing
    else. Its time is the least a step can take at this precision; a decode's tokens/s over ``1 / time`` is its
    share of the limit. ``compiled=False``: BLAS's product over each weight laid ``in x out``, contiguous (BLAS's
    fastest layout here); True: the compiled step's own reduction (inductor's) over each weight ``out x in``. The
    faster of the two is the limit the table reports against."""
    from ..models.kernels import KERNELS, linear_weights

    laid = [w.detach() for w in linear_weights(model)]  # tied weights once
    product = KERNELS["compiled" if compiled else "blas"].timer([tuple(w.shape) for w in laid], laid[0].dtype)

    @torch.no_grad()
    def run():
        product()

    run.weight_bytes = sum(w.numel() * w.element_size() for w in laid)  # type: ignore[attr-defined]
    return run


def _policy(case: dict):
    """The KV policy of a ``cached:NAME`` case (None for plain ``cached``)."""
    impl = case["impl"]
    if ":" not in impl:
        return None
    from ..modules.kv import KV_POLICIES, make_policy

    name = impl.split(":", 1)[1]
    options = {}
    if name in KV_POLICIES and KV_POLICIES[name].needs_split:
        from ..interpret.kv.heads import read_split

        if not case.get("kv_heads"):
            raise ValueError(f"cached:{name} needs --kv-heads kv-heads.json (multihead heads MODEL --kv)")
        options["full_heads"] = read_split(case["kv_heads"])
    budgeted = name not in KV_POLICIES or KV_POLICIES[name].budgeted
    return make_policy(name, case.get("kv_budget", 512) if budgeted else None, **options)


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


def _is_gguf(source: str) -> bool:
    from ..loading import kind

    return kind(source).format == "gguf"


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
    context: int | None = None,
    policies=None,
    kv_budget: int = 512,
    kv_heads: str | None = None,
    rounds: int = 1,
) -> dict:
    """Every case in a fresh process; ``rounds`` times over, the cases alternated (round 1 of each, then round 2:
    a machine's drift falls on every case alike), each row naming its round. ``prefill=()``: no prefill cases."""
    from tqdm import tqdm

    shape = shape or GPT2_SHAPE
    pretrained = "pretrained" in shape
    lengths = lengths or ([64] if pretrained else NEW_TOKENS)
    batches = batches or ([1, 8] if pretrained else BATCHES)
    gguf = pretrained and _is_gguf(shape["pretrained"])
    peers = ["hf_generate"] + ([*LLAMACPP] if gguf else [])
    if pretrained and not gguf:
        from ..loading import kind

        if kind(shape["pretrained"]).family is None:  # read attached: HF's own layers too
            peers.insert(0, "cached_hf_layers")
    impls = impls or (
        ["cached", "blas", "compiled", "compiled_step", *PRECISIONS, "cached_old", *peers] if pretrained else IMPLS
    )
    limits = ("bound", "bound_compiled")
    if pretrained:  # the limit is measured once per run whatever --impls names (a row per new-token count is wrong)
        impls = [i for i in impls if i not in limits]
    cases, results = [], []
    if pretrained:  # the physical limit: one product over every weight, batch 1 (BLAS's, and the compiled step's)
        for impl in limits:
            cases.append({"impl": impl, "batch": 1, "new_tokens": 1, "shape": shape, "device": device, "dtype": dtype})
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
    if pretrained and context:
        if policies is None:  # every registered policy that needs no split of the heads
            from ..modules.kv import KV_POLICIES

            policies = [n for n, c in KV_POLICIES.items() if kv_heads or not c.needs_split]
        with_context = ["cached", "compiled", *[f"cached:{p}" for p in policies], "hf_generate"]
        with_context += ["xllamacpp_f32", "llamacpp_f32"] if gguf else []
        for impl in with_context:
            cases.append(
                {
                    "impl": impl,
                    "batch": 1,
                    "new_tokens": min(lengths),
                    "context": context,
                    "kv_budget": kv_budget,
                    "kv_heads": kv_heads,
                    "shape": shape,
                    "device": device,
                    "dtype": dtype,
                }
            )
    if pretrained:
        for length in [512, 4096] if prefill is None else prefill:
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
    if rounds > 1:
        cases = [{**c, "round": r + 1} for r in range(rounds) for c in cases]
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
        if out is not None:  # what is measured so far, after every case (the ratios are added at the end)
            write_json(
                out, {"suite": "decode", "partial": True, "machine": machine_info(threads, device), "results": results}
            )

    def key(r):
        return r["batch"], r["new_tokens"], r.get("prefill"), r.get("context"), r.get("round")

    ours = ("cached", "prefill")
    base = {key(r): r for r in results if r["impl"] in ours and "error" not in r}
    bounds = [r for r in results if r["impl"] in ("bound", "bound_compiled") and "error" not in r]
    bound = min(bounds, key=lambda r: r["seconds_min"]) if bounds else None  # the faster way to stream the weights
    for r in results:
        if "error" in r:
            continue
        r["tokens_per_second"] = r["batch"] * (r["new_tokens"] or r.get("prefill", 0)) / r["seconds_min"]
        if bound is not None and r.get("decode_tokens_per_second"):  # share of the limit at this batch
            rows = 1 if _llamacpp(r["impl"]) else r["batch"]
            r["share_of_bound"] = r["decode_tokens_per_second"] / (rows / bound["seconds_min"])
        ref = base.get(key(r))
        if ref and r is not ref:
            r["cached_speedup"] = r["seconds_min"] / ref["seconds_min"]
            if r.get("decode_tokens_per_second") and ref.get("decode_tokens_per_second"):
                r["decode_ratio_ours_to_this"] = ref["decode_tokens_per_second"] / r["decode_tokens_per_second"]
    config = {**shape, "prompt": PROMPT, "device": device, "dtype": dtype}
    if pretrained:
        config.update(_layout_of(_pretrained(shape["pretrained"], "cached")))
        _LOADED.clear()
    payload = {"suite": "decode", "config": config, "machine": machine_info(threads, device), "results": results}
    if out is not None:
        write_json(out, payload)
    return payload


def _layout_of(model) -> dict:
    """The sizes the table prints, read from the model's anatomy (native or attached alike)."""
    from ..modules.anatomy import anatomy

    body = anatomy(model)
    site = body.sites[0]
    mlp = body.blocks[0].mlp if body.blocks else None
    widths = [m.out_features for m in mlp.modules() if isinstance(m, nn.Linear)] if mlp is not None else []
    d_model = int(body.unembed.weight.shape[1]) if body.unembed is not None else site.num_heads * site.head_dim
    return {
        "d_model": d_model,
        "layers": len(body.sites),
        "heads": site.num_heads,
        "d_ff": max(widths, default=0),
        "vocab": int(model.config.vocab_size),
        "positional": f"{model.config.positional} ({body.source})",
    }


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
        f"{'new':>5} {'batch':>5} {'impl':<17}{'seconds':>9}{'tokens/s':>10}{'decode/s':>10}{'ours is':>9}"
        f"{'of limit':>9}{'peak MiB':>10}",
    ]
    for r in payload["results"]:
        where = f"{r['new_tokens']:>5} {r['batch']:>5}"
        if r.get("context"):
            where = f"{'+' + str(r['new_tokens']) + ' @' + str(r['context']):>11}"
        if r.get("prefill"):
            where = f"{'L=' + str(r['prefill']):>11}"
        if "error" in r:
            lines.append(f"{where} {r['impl']:<17} {r['error']}")
            continue
        ratio = r.get("decode_ratio_ours_to_this") or r.get("cached_speedup")
        decode = r.get("decode_tokens_per_second")
        share = r.get("share_of_bound")
        if r["impl"].startswith("bound"):
            where = f"{'limit':>11}"
        lines.append(
            f"{where} {r['impl']:<17}{r['seconds_min']:>9.3f}{r['tokens_per_second']:>10.1f}"
            f"{(f'{decode:.1f}' if decode else '-'):>10}{(f'{ratio:.2f}x' if ratio else '-'):>9}"
            f"{(f'{share:.0%}' if share else '-'):>9}{r['peak_mb'] or 0:>10.0f}"
        )
    if any(r.get("decode_ratio_ours_to_this") for r in payload["results"]):
        lines.append("ours is: decode tokens/s of ours (plain cached) over this one's, in the same case")
    if any(r.get("share_of_bound") for r in payload["results"]):
        lines.append(
            "of limit: decode tokens/s over the limit's (one product of a row with every weight, the faster of BLAS's "
            "and the compiled reduction: the least time a step can take); cached_old: ours before the decoding "
            "layout; compiled: ours with fast_decode.compile (batch 1 compiled, batches the lean step); compiled_step: "
            "one compiled graph per step (fast_decode.compile(whole_step=True)), _bf16 / _int8 over weights stored so; blas: ours "
            "with the BLAS product whatever was measured; cached_hf_layers: an attached model decoded through HF's "
            "own layers (cached: through multihead's step over HF's weights)"
        )
    chosen = next((r for r in payload["results"] if r["impl"] == "cached" and r.get("why")), None)
    if chosen is not None:
        lines.append(f"cached (ours as it runs by default) decoded a row with {chosen['why']}")
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"decode-{time.strftime('%Y%m%d-%H%M%S')}.json"


DEFAULT_CONTEXT = 4096  # bench decode --model LM: decode after this many tokens unless --context says otherwise


def lm_layout(source: str) -> tuple[list[int], int]:
    """``(key/value heads per layer, positions)`` of a pretrained causal LM, from its config or file header alone
    (no weight is read)."""
    from ..loading import kind

    k = kind(source)
    if k.family is None:  # an HF folder read attached: its config.json
        from ..pretrained.formats.hf import read_config

        hf = read_config(k.path)
        text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else hf
        layers = int(text.get("num_hidden_layers") or text.get("n_layer") or 0)
        heads = int(text.get("num_key_value_heads") or text.get("num_attention_heads") or text.get("n_head") or 0)
        positions = int(text.get("max_position_embeddings") or text.get("n_positions") or 2048)
        return [heads] * layers, positions
    from ..pretrained import read_source

    read = read_source(source)
    adapter = k.family.adapter(read.format)
    config = k.family.config(adapter.config(read) if adapter.config else read.config)
    d = config.decoder
    return [d.attention.num_kv_heads or d.num_heads] * d.num_layers, int(config.max_len)


def from_args(args, out: Path) -> dict:
    """``multihead bench decode`` (the suite protocol in :mod:`multihead.bench`); ``--lengths`` = new tokens."""
    model = getattr(args, "model", None)
    from ..loading import kind

    if model and kind(model).name == "lm":  # asking the registry says the install line now
        shape = {"pretrained": model}
    else:
        shape = shape_of_run(model) if model else None
    kv_heads = getattr(args, "kv_heads", None)
    pretrained = bool(shape and "pretrained" in shape)
    asked = getattr(args, "context", None)
    context = (asked or DEFAULT_CONTEXT) if pretrained and not getattr(args, "no_context", False) else None
    if asked and getattr(args, "no_context", False):
        raise ValueError("--context N decodes after N tokens and --no-context decodes after none: pass one of them")
    if kv_heads and not pretrained:
        raise ValueError("--kv-heads is for --model with a pretrained LM (decoding after --context under each policy)")
    if pretrained and context is not None:  # refused from the headers, before any case runs
        from ..interpret.kv.heads import check_split, read_split

        split = read_split(kv_heads) if kv_heads else None
        kv_per_layer, positions = lm_layout(model)
        new = min(args.lengths or [64])  # the tokens decoded after the context (the shortest length)
        if context + new > positions:
            if asked:
                raise ValueError(
                    f"--context {context:,} plus {new} new tokens is past {model}'s {positions:,} positions: "
                    f"choose --context {max(positions - new, 1)} or less"
                )
            context = max(positions - new, 1)
            print(f"{model} has {positions:,} positions: decoding after {context:,} tokens (--context sets it)")
        if split is not None:
            check_split(split, kv_per_layer, model)
    from ..modules.kv import KV_POLICIES

    policies = [n for n, c in KV_POLICIES.items() if kv_heads or not c.needs_split]
    return run(
        context=context,
        policies=policies,
        kv_budget=getattr(args, "kv_budget", None) or 512,
        kv_heads=kv_heads,
        prefill=() if getattr(args, "no_prefill", False) else getattr(args, "prefill", None),
        rounds=getattr(args, "rounds", None) or 1,
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
