"""``multihead bench peers``: multihead attached to an HF model against TransformerLens 4.3 (``TransformerBridge``)
and nnsight 0.8.1 on the same HF folder (SmolLM2-135M exported by ``multihead export smollm2``, 30 layers x 9
heads), each case in a fresh process at 2 threads, fp32 on the CPU.

Tasks (``--modes``):

* ``patterns`` -- every head's weights at 512 and 2,048 tokens, kept (ours: ``capture(model, ("pattern",))``;
  TransformerLens: ``run_with_cache`` filtered to ``hook_pattern``; nnsight: each attention layer's weights
  output saved, with ``attn_implementation="eager"``, which both peers need to see weights);
* ``stats`` -- per head and query: entropy, the mass on the first token and the top-4 keys, at 8,192 and 16,384
  tokens (ours: exact statistics from tiles, ``hook_stats``, no ``L x L`` map; the peers: each layer's pattern
  reduced as soon as it exists, in a hook or inside the trace, which is the least memory they can use);
* ``patch`` -- exact activation patching of all 270 heads' outputs on an IOI prompt pair, logit difference of the
  two names (ours: :func:`~multihead.interpret.causal.patching.activation_patching`, batched; TransformerLens: its
  ``patching.get_act_patch_attn_head_out_all_pos``; nnsight: one trace per head editing the output projection's
  input);
* ``attribution`` -- attribution patching of every head at 1,024 and 4,096 tokens (one forward on the clean input,
  one forward and backward on the corrupted one, in each tool's way of reading gradients).

Each row records seconds, the process's peak resident memory during the task above what it held with the model
loaded, and the result's largest difference from ours (the same numbers, or the row is not comparable). A case
that passes the memory cap (``MULTIHEAD_BENCH_MEMORY_GIB``, default 16) is stopped and recorded as out of memory.
Ours runs under both transformers versions (this environment's and the peers' ``.venv-peers``, ``make peers``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

SUITE = "multihead.bench.peers"
MODES = ("patterns", "stats", "patch", "attribution")
LENGTHS = {"patterns": [512, 2048], "stats": [8192, 16384], "patch": [0], "attribution": [1024, 4096]}
IMPLS = ("ours", "transformer_lens", "nnsight")
PEER_VENV = Path(".venv-peers")
IOI = (
    "When Mary and John went to the store, John gave a drink to",
    "When Mary and John went to the store, Mary gave a drink to",
    " Mary",
    " John",
)


# ---------------------------------------------------------------------------------------------------- in the worker
def _tokens(folder: Path, case: dict):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if case["mode"] == "patch":
        clean, corrupt, a, w = (tok.encode(t, add_special_tokens=False).ids for t in IOI)
        assert len(clean) == len(corrupt) and len(a) == 1 and len(w) == 1, "the IOI names must be single tokens"
        return torch.tensor([clean]), torch.tensor([corrupt]), a[0], w[0]
    g = torch.Generator().manual_seed(0)
    n = case["length"]
    ids = torch.randint(1000, tok.get_vocab_size() - 1000, (1, n), generator=g)
    other = ids.clone()  # the corrupted input: every 16th token from a third of the way on replaced
    picked = other[0, n // 3 :: max(1, n // 16)]
    other[0, n // 3 :: max(1, n // 16)] = torch.randint(1000, 40000, picked.shape, generator=g)
    return ids, other, int(ids[0, -1]), int(ids[0, -2])


def _reduce(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Entropy, first-token mass and top-4 keys per head and query of one layer's weights ``(1, H, L, L)``."""
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
    return ent, p[..., 0], p.topk(4, -1).indices


def _ours(folder: Path, case: dict, clean, corrupt, a, w):
    from transformers import AutoModelForCausalLM

    from .. import hf
    from ..interpret.causal import patching as P
    from ..modules.capture import capture

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf.attach(model)
    mode = case["mode"]
    if mode == "patterns":

        def task():
            with torch.no_grad(), capture(model, ("pattern",)) as cache:
                model(clean)
            return torch.stack([_reduce(p)[0].sum(-1)[0] for p in cache.patterns()])

    elif mode == "stats":

        def task():
            with torch.no_grad(), capture(model, ("stats",), stats={"topk": 4}) as cache:
                model(clean)
            layers = [cache.stats(i) for i in range(len(cache.attention_modules))]
            kept = [(s.entropy, s.mass["first"], s.topk_index) for s in layers]  # what the row asks for
            return torch.stack([e[0].mean(-1) for e, _, _ in kept])

    elif mode == "patch":

        def task():
            return P.activation_patching(model, clean, corrupt, P.logit_diff(a, w), batch_size=32)["effect"]

    else:

        def task():
            return P.attribution_patching(model, clean, corrupt, P.logit_diff(a, w))["effect"]

    return model, task


def _transformer_lens(folder: Path, case: dict, clean, corrupt, a, w):
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge

    model = TransformerBridge.boot_transformers(str(folder), device="cpu")
    layers, mode = model.cfg.n_layers, case["mode"]

    def diff(logits):
        return logits[0, -1, a] - logits[0, -1, w]

    if mode == "patterns":

        def task():
            with torch.no_grad():
                _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_pattern"))
            return torch.stack([_reduce(cache[f"blocks.{i}.attn.hook_pattern"])[0].sum(-1)[0] for i in range(layers)])

    elif mode == "stats":

        def task():
            out = {}

            def reduce(p, hook):
                out[hook.name] = _reduce(p)

            with torch.no_grad():
                model.run_with_hooks(clean, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), reduce)])
            return torch.stack([out[f"blocks.{i}.attn.hook_pattern"][0][0].mean(-1) for i in range(layers)])

    elif mode == "patch":

        def task():
            with torch.no_grad():
                _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_z"))
                base = diff(model(corrupt))
                # TransformerLens returns the patched metric; the effect is its difference from the corrupted run's
                return patching.get_act_patch_attn_head_out_all_pos(model, corrupt, cache, diff) - base

    else:

        def task():
            with torch.no_grad():
                _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_z"))
            acts, grads = {}, {}
            for i in range(layers):
                name = f"blocks.{i}.attn.hook_z"
                model.add_hook(name, lambda t, hook, name=name: acts.__setitem__(name, t.detach()))
                model.add_hook(name, lambda t, hook, name=name: grads.__setitem__(name, t.detach()), "bwd")
            try:
                diff(model(corrupt)).backward()
            finally:
                model.reset_hooks()
            rows = []
            for i in range(layers):
                name = f"blocks.{i}.attn.hook_z"
                rows.append(((cache[name] - acts[name]) * grads[name]).sum((0, 1, 3)))
            return torch.stack(rows)

    return model, task


def _nnsight(folder: Path, case: dict, clean, corrupt, a, w):
    import nnsight
    from nnsight import LanguageModel

    model = LanguageModel(str(folder), device_map="cpu", attn_implementation="eager", dispatch=True)
    layers = model.config.num_hidden_layers
    heads = model.config.num_attention_heads
    d = model.config.hidden_size // heads
    mode = case["mode"]

    if mode == "patterns":

        def task():
            with torch.no_grad(), model.trace(clean):
                pats = nnsight.save([])
                for i in range(layers):
                    pats.append(model.model.layers[i].self_attn.output[1].save())
            return torch.stack([_reduce(p)[0].sum(-1)[0] for p in pats])

    elif mode == "stats":

        def task():
            with torch.no_grad(), model.trace(clean):
                found = nnsight.save([])
                for i in range(layers):
                    p = model.model.layers[i].self_attn.output[1]
                    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
                    found.append((ent.save(), p[..., 0].save(), p.topk(4, -1).indices.save()))
            return torch.stack([e[0].mean(-1) for e, _, _ in found])

    elif mode == "patch":

        def task():
            with torch.no_grad(), model.trace(clean):
                zs = nnsight.save([])
                for i in range(layers):
                    zs.append(model.model.layers[i].self_attn.o_proj.input.save())
            with torch.no_grad(), model.trace(corrupt):
                logits = model.lm_head.output.save()
            base = float(logits[0, -1, a] - logits[0, -1, w])
            effect = torch.zeros(layers, heads)
            for i in range(layers):
                for h in range(heads):
                    with torch.no_grad(), model.trace(corrupt):
                        model.model.layers[i].self_attn.o_proj.input[:, :, h * d : (h + 1) * d] = zs[i][
                            :, :, h * d : (h + 1) * d
                        ]
                        out = model.lm_head.output.save()
                    effect[i, h] = float(out[0, -1, a] - out[0, -1, w]) - base
            return effect

    else:

        def task():
            with torch.no_grad(), model.trace(clean):
                zs = nnsight.save([])
                for i in range(layers):
                    zs.append(model.model.layers[i].self_attn.o_proj.input.save())
            with model.trace(corrupt):
                acts = nnsight.save([])
                grads = nnsight.save([])
                inputs = []
                for i in range(layers):
                    x = model.model.layers[i].self_attn.o_proj.input
                    acts.append(x.save())
                    inputs.append(x)
                logits = model.lm_head.output
                metric = logits[0, -1, a] - logits[0, -1, w]
                with metric.backward():
                    for x in reversed(inputs):  # gradients arrive in backward order
                        grads.append(x.grad.save())
            rows = []
            for i, g in zip(range(layers), reversed(grads)):
                delta = (zs[i] - acts[i]) * g
                rows.append(delta.view(*delta.shape[:2], heads, d).sum((0, 1, 3)))
            return torch.stack(rows)

    return model, task


def worker(spec: dict) -> dict:
    from .._proc import status_kib
    from .harness import _reset_peak

    torch.set_num_threads(int(spec.get("threads") or 2))
    case = spec["case"]
    folder = Path(spec["model"])
    clean, corrupt, a, w = _tokens(folder, case)
    build = {"ours": _ours, "transformer_lens": _transformer_lens, "nnsight": _nnsight}[case["impl"]]
    t0 = time.perf_counter()
    _, task = build(folder, case, clean, corrupt, a, w)
    load = time.perf_counter() - t0
    before = status_kib("VmRSS")
    can_reset = _reset_peak()
    t0 = time.perf_counter()
    value = task()
    seconds = time.perf_counter() - t0
    peak = status_kib("VmHWM")
    import transformers

    return {
        "seconds": seconds,
        "load_seconds": load,
        "peak_mb": (peak - before) / 1024 if can_reset else None,
        "peak_rss_mb": peak / 1024,
        "value": value.detach().float().flatten().tolist(),
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
    }


# ---------------------------------------------------------------------------------------------------- the parent
def run_case(python: str, spec: dict, cap_gib: float, timeout: float) -> dict:
    """One case in a fresh process of ``python``, stopped when its resident memory passes ``cap_gib``."""
    from .._proc import status_kib

    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [python, "-m", SUITE, json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    start, killed = time.monotonic(), None
    while proc.poll() is None:
        if status_kib("VmRSS", proc.pid) > cap_gib * 2**20:
            proc.kill()
            killed = f"out of memory: stopped at the {cap_gib:g} GiB cap"
        elif time.monotonic() - start > timeout:
            proc.kill()
            killed = f"over {timeout:.0f} s: stopped"
        time.sleep(0.1)
    out, err = proc.communicate()
    if killed:
        return {**spec["case"], "error": killed}
    if proc.returncode != 0:
        tail = [ln for ln in (err or out).strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
        return {**spec["case"], "error": f"exit {proc.returncode}: {tail[0][:300]}"}
    return {**spec["case"], **json.loads(out.strip().splitlines()[-1])}


def _folder(model: str | None) -> Path:
    """The HF folder the three tools read (default: SmolLM2 exported once to bench/smollm2-hf)."""
    if model is not None:
        return Path(model)
    folder = Path("bench") / "smollm2-hf"
    if not (folder / "model.safetensors").is_file():
        from .. import lm

        from ..loading import load as load_source  # the one loader: it knows what a source is

        p = load_source("smollm2").detail
        lm.export(p.model, folder, pretrained=p, overwrite=folder.exists())
    return folder


def run(
    *,
    model: str | None = None,
    modes=None,
    impls=None,
    lengths=None,
    threads: int | None = None,
    out: Path,
    progress: bool = True,
) -> dict:
    from tqdm import tqdm

    from .harness import check_impls, machine_info, write_json

    check_impls(impls, IMPLS)
    folder = _folder(model)
    peers = PEER_VENV / "bin" / "python"
    cap = float(os.environ.get("MULTIHEAD_BENCH_MEMORY_GIB", "16"))
    threads = threads or 2
    pythons = {"ours": [sys.executable], "transformer_lens": [], "nnsight": []}
    if peers.is_file():
        pythons = {"ours": [sys.executable, str(peers)], "transformer_lens": [str(peers)], "nnsight": [str(peers)]}
    cases = []
    for mode in modes or MODES:
        for length in lengths or LENGTHS[mode]:
            for impl in impls or IMPLS:
                for python in pythons[impl] or [None]:
                    cases.append((python, {"mode": mode, "length": length, "impl": impl}))
    results = []
    for python, case in tqdm(cases, desc="bench peers", disable=not progress):
        if python is None:
            results.append({**case, "error": f"not installed: make peers (creates {PEER_VENV})"})
            continue
        spec = {"case": case, "model": str(folder), "threads": threads}
        results.append(run_case(python, spec, cap, timeout=3600))
    _compare(results)
    payload = {
        "suite": "peers",
        "model": str(folder),
        "memory_cap_gib": cap,
        "machine": machine_info(threads),
        "results": results,
    }
    write_json(out, payload)
    return payload


def _compare(results: list[dict]) -> None:
    """Each row's time and memory against ours at the same task and length (ours under the same transformers where
    there is one), and its result's largest difference from ours."""
    for r in results:
        if "error" in r or r["impl"] == "ours":
            continue
        ours = [
            o
            for o in results
            if o["impl"] == "ours" and o["mode"] == r["mode"] and o["length"] == r["length"] and "error" not in o
        ]
        ours.sort(key=lambda o: o.get("transformers") != r.get("transformers"))
        if not ours:
            continue
        o = ours[0]
        r["time_vs_ours"] = r["seconds"] / o["seconds"]
        if r.get("peak_mb") and o.get("peak_mb"):
            r["memory_vs_ours"] = r["peak_mb"] / o["peak_mb"]
        a, b = torch.tensor(o["value"]), torch.tensor(r["value"])
        if a.shape == b.shape:
            r["max_diff_vs_ours"] = float((a - b).abs().max())


def format_table(payload: dict) -> str:
    lines = [
        f"{payload['model']}: torch {payload['machine']['torch']}, {payload['machine']['threads']} threads, fp32; "
        f"each case in a fresh process; memory cap {payload['memory_cap_gib']:g} GiB",
        f"{'task':<12}{'L':>7} {'impl':<18}{'transformers':<14}{'seconds':>9}{'peak MiB':>10}{'time x':>8}"
        f"{'memory x':>9}{'max |diff|':>11}",
    ]
    for r in payload["results"]:
        head = f"{r['mode']:<12}{r['length'] or '-':>7} {r['impl']:<18}"
        if "error" in r:
            lines.append(f"{head}{'':<14}{r['error']}")
            continue
        t, m, d = r.get("time_vs_ours"), r.get("memory_vs_ours"), r.get("max_diff_vs_ours")
        lines.append(
            f"{head}{r['transformers']:<14}{r['seconds']:>9.2f}{(r['peak_mb'] or 0):>10.0f}"
            f"{(f'{t:.1f}' if t else '-'):>8}{(f'{m:.1f}' if m else '-'):>9}{(f'{d:.1e}' if d is not None else '-'):>11}"
        )
    lines.append("time x, memory x: the row's against ours on the same task (above 1: ours is faster or smaller)")
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench peers`` (the suite protocol in :mod:`multihead.bench`)."""
    return run(
        model=args.model, modes=args.modes, impls=args.impls, lengths=args.lengths, threads=args.threads, out=out
    )


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
