"""``multihead bench patch``: what interventions on every head cost, against a TransformerLens-style baseline written
here, each case in a fresh process (default model ``smollm2``; any pretrained LM with ``--model``):

* ``exact`` -- :func:`multihead.interpret.causal.patching.activation_patching`: every head patched clean -> corrupted in
  batched passes (row r patches head r, one baseline row per pass), each pass rerun from the patched layer with
  only the last position projected to the vocabulary;
* ``exact_baseline`` -- the way hook-based tools are used for it: one run caching every activation and every
  attention pattern of the clean input, then one forward pass per head with that head's output replaced (at 128
  tokens only: it is one pass per head);
* ``attribution`` -- :func:`~multihead.interpret.causal.patching.attribution_patching`: every head's first-order effect
  from two forward passes and one backward pass;
* ``forward_backward`` -- one forward and backward pass with parameter gradients (the yardstick of the attribution
  target: under 2x its time).

Inputs: two rows of held-out IMDB text of ``--lengths`` tokens (default 128, 1024, 4096); the metric is the next
token's probability at the last position. Reported: seconds, peak memory above the start, ratios in the same run.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import machine_info, run_case, write_json

SUITE = "multihead.bench.patch"
LENGTHS = [128, 1024, 4096]
IMPLS = ["exact", "exact_baseline", "attribution", "forward_backward"]
BASELINE_MAX = 128  # one forward per head: 270 passes at 4,096 tokens would take most of an hour here
EXACT_MAX = 4096
_LOADED: dict = {}


def _model(source: str):
    if source not in _LOADED:
        from ..loading import load as load_source  # the one loader: it knows what a source is

        _LOADED[source] = load_source(source).detail
    return _LOADED[source]


def build(case: dict):
    from ..heads.lm import held_out_rows
    from ..interpret.causal import patching as P
    from ..modules.capture import capture

    p = _model(case["model"])
    model = p.model
    ids = held_out_rows(p, rows=2, length=case["length"])
    clean, corrupt = ids[:1], ids[1:]
    metric = P.token_probability(100)
    impl = case["impl"]
    if impl == "exact":
        return lambda: P.activation_patching(model, clean, corrupt, metric, batch_size=case.get("batch", 16))
    if impl == "attribution":
        return lambda: P.attribution_patching(model, clean, corrupt, metric)
    if impl == "forward_backward":

        def step():
            model.zero_grad(set_to_none=True)
            metric(model(corrupt)).sum().backward()

        return step
    if impl == "exact_baseline":

        @torch.no_grad()
        def step():
            with capture(model, ("pattern", "q", "k", "v", "z")) as cache:  # cache everything, as such tools do
                model(clean)
            mods = cache.attention_modules
            out = []
            for name in mods:
                z_clean = cache[f"{name}.hook_z"]
                attn = dict(model.named_modules())[name]
                for head in range(attn.num_heads):

                    def edit(z, hook, head=head, z_clean=z_clean):
                        z = z.clone()
                        z[:, head] = z_clean[:, head]
                        return z

                    h = attn.hook_z.add_hook(edit)
                    out.append(float(metric(model(corrupt))[0]))
                    h.remove()
            return out

        return step
    raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLS}")


def flops(case: dict) -> float:
    return 0.0


def run(
    *,
    model: str = "smollm2",
    lengths=None,
    impls=None,
    threads=None,
    out: Path | None = None,
    min_time: float = 0.0,
    progress: bool = True,
) -> dict:
    from tqdm import tqdm

    from ..loading import kind

    kind(model)  # the install line now, not a failure in every worker
    cases, results = [], []
    for length in lengths or LENGTHS:
        for impl in impls or IMPLS:
            cases.append({"impl": impl, "length": length, "model": model})
    for c in tqdm(cases, desc="bench patch", disable=not progress):
        limit = {"exact_baseline": BASELINE_MAX, "exact": EXACT_MAX}.get(c["impl"])
        if limit is not None and c["length"] > limit:
            results.append({**c, "error": f"skipped: measured up to {limit} tokens"})
            continue
        results.append(run_case(SUITE, c, threads=threads, min_time=min_time, min_repeats=1, timeout=3600))
    for r in results:
        if "error" in r:
            continue
        same = {x["impl"]: x for x in results if x["length"] == r["length"] and "error" not in x}
        if r["impl"] == "exact" and "exact_baseline" in same:
            r["speedup_vs_baseline"] = same["exact_baseline"]["seconds_min"] / r["seconds_min"]
        if r["impl"] == "attribution" and "forward_backward" in same:
            r["time_vs_forward_backward"] = r["seconds_min"] / same["forward_backward"]["seconds_min"]
            if same["forward_backward"].get("peak_mb"):
                r["memory_vs_forward_backward"] = (r.get("peak_mb") or 0) / same["forward_backward"]["peak_mb"]
    payload = {
        "suite": "patch",
        "config": {"model": model, "metric": "probability of one token, last position"},
        "machine": machine_info(threads),
        "results": results,
    }
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        f"torch {m['torch']}, {m['threads']} threads; model {payload['config']['model']}; every head patched "
        "clean -> corrupted",
        f"{'tokens':>7} {'impl':<17}{'seconds':>9}{'peak MiB':>10}  ratio",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['length']:>7} {r['impl']:<17} {r['error']}")
            continue
        ratio = ""
        if "speedup_vs_baseline" in r:
            ratio = f"{r['speedup_vs_baseline']:.1f}x faster than the one-head-per-pass baseline"
        if "time_vs_forward_backward" in r:
            ratio = f"{r['time_vs_forward_backward']:.2f}x the time of one forward+backward"
            if "memory_vs_forward_backward" in r:
                ratio += f", {r['memory_vs_forward_backward']:.2f}x its peak memory"
        lines.append(
            f"{r['length']:>7} {r['impl']:<17}{r['seconds_min']:>9.2f}{(r.get('peak_mb') or 0):>10.0f}  {ratio}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"patch-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench patch [--model LM] [--lengths ...] [--impls ...]``."""
    return run(
        model=getattr(args, "model", None) or "smollm2",
        lengths=args.lengths,
        impls=args.impls,
        threads=args.threads,
        out=out,
        min_time=args.min_time or 0.0,
    )
