"""``multihead bench observe``: what reading a model costs, through each source, each case in a fresh process.

An HF Llama of SmolLM2-135M's shape (30 layers, 9 query and 3 key/value heads of 64, width 576, MLP 1536, vocabulary
49,152; random weights built from the config: timing needs no trained weights), batch 1, ``--lengths`` tokens
(default 128), fp32, no gradients:

* ``bare`` -- the HF model as it comes (its ``sdpa`` attention);
* ``attached`` / ``observed`` -- after :func:`multihead.hf.attach` (HF's attention registry) or
  :func:`multihead.modules.observe.observe` (the function-level observer), nothing captured;
* ``eager_maps`` -- HF's own way to get every map: ``attn_implementation="eager"`` with ``output_attentions=True``;
* ``attached_maps`` / ``observed_maps`` -- every layer's pattern captured (:func:`multihead.modules.capture.capture`).

Ratios: the plain cases against ``bare`` (the cost of being able to look), the map cases against ``eager_maps``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import check_impls, machine_info, run_case, write_json

SUITE = "multihead.bench.observe"
SHAPE = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
IMPLS = ["bare", "attached", "observed", "eager_maps", "attached_maps", "observed_maps"]
BASE = {"attached": "bare", "observed": "bare", "attached_maps": "eager_maps", "observed_maps": "eager_maps"}


def build(case: dict):
    import transformers

    from ..modules.capture import capture

    impl, length = case["impl"], case["length"]
    eager = impl == "eager_maps"
    config = transformers.LlamaConfig(**SHAPE)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager" if eager else "sdpa"
    ).eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
    if impl.startswith("attached"):
        from .. import hf

        hf.attach(model)
    elif impl.startswith("observed"):
        from ..modules.observe import observe

        observe(model, ids[:, :8])

    def plain():
        with torch.no_grad():
            return model(ids).logits

    def maps():
        with torch.no_grad():
            if eager:
                return model(ids, output_attentions=True).attentions
            with capture(model, to_cpu=False) as cache:
                model(ids)
            return cache.patterns()

    return maps if impl.endswith("maps") else plain


def flops(case: dict) -> float:
    return 0.0


def run(*, lengths=None, impls=None, threads=None, out: Path | None = None, min_time: float = 1.0, progress=True):
    from tqdm import tqdm

    check_impls(impls, IMPLS)
    cases = [{"impl": i, "length": n} for n in (lengths or [128]) for i in (impls or IMPLS)]
    results = []
    payload = {
        "suite": "observe",
        "config": {**SHAPE, "batch": 1, "dtype": "float32", "weights": "random (SmolLM2-135M's shape)"},
        "machine": machine_info(threads),
        "results": results,
    }
    for c in tqdm(cases, desc="bench observe", disable=not progress):
        results.append(run_case(SUITE, c, threads=threads, min_time=min_time, timeout=1200))
        _ratios(results)
        if out is not None:  # written as it goes
            write_json(out, payload)
    return payload


def _ratios(results: list[dict]) -> None:
    by = {(r["impl"], r["length"]): r for r in results if "error" not in r}
    for r in results:
        base = by.get((BASE.get(r["impl"], ""), r["length"]))
        if base is not None and "error" not in r:
            r["time_vs_" + base["impl"]] = r["seconds_min"] / base["seconds_min"]


def format_table(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        f"{m.get('cpu', m.get('machine'))}; torch {m['torch']}, {m['threads']} threads; SmolLM2-135M's shape, random "
        "weights, batch 1, fp32; ratios in this run",
        f"{'L':>6} {'impl':<15}{'seconds':>10}{'ratio':>8}  against",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['length']:>6} {r['impl']:<15} {r['error']}")
            continue
        base = BASE.get(r["impl"])
        ratio = r.get(f"time_vs_{base}") if base else None
        lines.append(
            f"{r['length']:>6} {r['impl']:<15}{r['seconds_min']:>10.3f}{(f'{ratio:.3f}' if ratio else '-'):>8}"
            f"  {base or ''}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"observe-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench observe`` (the suite protocol in :mod:`multihead.bench`)."""
    return run(lengths=args.lengths, impls=args.impls, threads=args.threads, out=out, min_time=args.min_time)
