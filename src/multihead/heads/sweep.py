"""How many heads: train one model per head count (and seed) at a fixed ``d_model``, so ``d_k = d_model / h``
shrinks as ``h`` grows (the tutorial's trade-off), and measure accuracy, time and size.

Vaswani et al. 2017, Table 3 (A), is the published reference: 1 head 24.9 BLEU, 4: 25.5, 8: 25.8, 16: 25.8,
32: 25.4 -- a rise and a fall. ``num_kv_heads`` can be swept instead (MHA vs GQA vs MQA at a fixed ``h``).
"""

from __future__ import annotations

from .._io import atomic_write_json

import copy
import statistics
from pathlib import Path


from ..train import TrainConfig, load_run, train
from ..train.inference import examples
from .prune import time_inference


def sweep(
    base: TrainConfig,
    out: Path,
    *,
    heads: list[int] | None = None,
    kv_heads: list[int] | None = None,
    seeds: int = 3,
    min_time: float = 2.0,
    overwrite: bool = False,
    log=print,
) -> dict:
    """Train ``base`` once per value and seed into ``out/<value>/seed<k>``; returns (and writes) the summary."""
    out = Path(out)
    e = base.model.encoder
    if (heads is None) == (kv_heads is None):
        raise ValueError("sweep either heads (h at fixed d_model) or kv_heads (key/value heads at fixed h)")
    axis, values = ("heads", heads) if heads is not None else ("kv_heads", kv_heads)
    for v in values:
        h = v if axis == "heads" else e.num_heads
        if e.d_model % h:
            raise ValueError(f"d_model={e.d_model} is not divisible by {h} heads; choose head counts dividing it")
        if axis == "kv_heads" and h % v:
            raise ValueError(f"num_heads={h} is not divisible by num_kv_heads={v}")
    from .._io import check_target, folder_lock

    check_target(out, "sweep", overwrite=overwrite)  # a folder of other files is never trained over
    with folder_lock(out):
        atomic_write_json(out / "sweep.json", {"axis": axis, "values": values, "status": "running"})  # marks its kind
        return _sweep(base, out, axis, values, seeds=seeds, min_time=min_time, log=log)


def _sweep(base: TrainConfig, out: Path, axis: str, values: list[int], *, seeds: int, min_time: float, log) -> dict:
    e = base.model.encoder
    rows = []
    for v in values:
        runs = []
        for seed in range(seeds):
            config = copy.deepcopy(base)
            if axis == "heads":
                config.model.encoder.num_heads = v
                config.model.encoder.attention.num_kv_heads = None
            else:
                config.model.encoder.attention.num_kv_heads = v
            config.run.seed = base.run.seed + seed
            folder = out / f"{axis}{v}" / f"seed{seed}"
            r = train(config, folder, overwrite=True)
            runs.append(
                {
                    "seed": config.run.seed,
                    "folder": str(folder),
                    "test_accuracy": r["test"]["accuracy"],
                    "validation_accuracy": r["validation"]["accuracy"],
                    "train_seconds": r["train_seconds"],
                    "parameters": r["parameters"],
                    "best_epoch": r["best_epoch"],
                }
            )
            log(f"{axis}={v} seed {seed}: test accuracy {r['test']['accuracy']:.4f}, {r['train_seconds']:.0f}s")
        acc = [x["test_accuracy"] for x in runs]
        h = v if axis == "heads" else e.num_heads
        rows.append(
            {
                axis: v,
                "num_heads": h,
                "d_k": e.d_model // h,
                "parameters": runs[0]["parameters"],
                "test_accuracy_mean": statistics.mean(acc),
                "test_accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "train_seconds_mean": statistics.mean(x["train_seconds"] for x in runs),
                "runs": runs,
            }
        )
    # Inference, side by side: each value's first-seed model over the test split, batch 32, interleaved.
    models, test_ids = {}, None
    for row in rows:
        run = load_run(row["runs"][0]["folder"])
        models[str(row[axis])] = run.model
        if test_ids is None:
            test_ids = examples(run)[1]["test"][0]
    speed = time_inference(models, test_ids, batch_size=32, min_time=min_time)
    for row in rows:
        row["inference_seconds"] = speed["seconds"][str(row[axis])]
    summary = {
        "axis": axis,
        "values": values,
        "seeds": seeds,
        "d_model": e.d_model,
        "data": base.data.name,
        "rows": rows,
        **curve_shape(rows, axis),
        "threads": speed["threads"],
        "vaswani_2017_table3a_bleu": {"1": 24.9, "4": 25.5, "8": 25.8, "16": 25.8, "32": 25.4},
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "sweep.json", summary)
    plot(summary, out / "sweep")
    return summary


def curve_shape(rows: list[dict], axis: str) -> dict:
    """Best value by mean accuracy, the curve's shape, and whether it is flat within seed noise (the range of the
    means is below twice the average seed standard deviation)."""
    means = [r["test_accuracy_mean"] for r in rows]
    best = rows[means.index(max(means))]
    shape = (
        "rise and fall"
        if rows[0] is not best and rows[-1] is not best
        else "highest at the smallest value"
        if rows[0] is best
        else "highest at the largest value"
    )
    spread = max(means) - min(means)
    noise = 2 * sum(r["test_accuracy_std"] for r in rows) / len(rows)
    return {
        "best": best[axis],
        "shape": shape,
        "range_of_means": spread,
        "twice_mean_seed_std": noise,
        "flat_within_noise": spread < noise,
    }


def format_table(s: dict) -> str:
    axis = s["axis"]
    lines = [
        f"{s['data']}, d_model {s['d_model']}, {s['seeds']} seeds per value; inference = one pass over the test "
        f"split, batch 32, {s['threads']} threads, measured side by side",
        f"{axis:>9}{'d_k':>5}{'params':>10}{'test acc':>10}{'± std':>8}{'train s':>9}{'infer s':>9}",
    ]
    for r in s["rows"]:
        lines.append(
            f"{r[axis]:>9}{r['d_k']:>5}{r['parameters']:>10}{r['test_accuracy_mean']:>10.4f}"
            f"{r['test_accuracy_std']:>8.4f}{r['train_seconds_mean']:>9.1f}{r['inference_seconds']:>9.3f}"
        )
    verdict = (
        f"flat within seed noise (range of means {100 * s['range_of_means']:.1f} points < twice the mean seed "
        f"std {100 * s['twice_mean_seed_std']:.1f})"
        if s["flat_within_noise"]
        else f"{s['shape']} (range of means {100 * s['range_of_means']:.1f} points, twice the mean seed std "
        f"{100 * s['twice_mean_seed_std']:.1f})"
    )
    lines.append(
        f"best by mean: {axis}={s['best']}; curve: {verdict}. Vaswani et al. 2017 Table 3A (BLEU): h=1 24.9, "
        "8 25.8, 16 25.8, 32 25.4, a rise and fall"
    )
    return "\n".join(lines)


def plot(s: dict, stem: Path) -> list[Path]:
    from ..plotting import pyplot

    plt = pyplot()

    from ..plotting import save as _save

    axis = s["axis"]
    x = [str(r[axis]) for r in s["rows"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.errorbar(
        x,
        [r["test_accuracy_mean"] for r in s["rows"]],
        yerr=[r["test_accuracy_std"] for r in s["rows"]],
        fmt="o-",
        capsize=4,
    )
    for r in s["rows"]:
        a1.scatter([str(r[axis])] * len(r["runs"]), [u["test_accuracy"] for u in r["runs"]], s=10, color="grey")
    a1.set_xlabel(axis)
    a1.set_ylabel("test accuracy (mean ± std over seeds)")
    a1.set_title(f"{s['data']}, d_model {s['d_model']}", fontsize=9)
    a2.plot(x, [r["train_seconds_mean"] for r in s["rows"]], "o-", label="training (s)")
    a2.plot(x, [r["inference_seconds"] * 10 for r in s["rows"]], "s-", label="inference x10 (s)")
    a2.set_xlabel(axis)
    a2.legend(fontsize=8)
    a2.set_title("time", fontsize=9)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    return _save(fig, stem)


__all__ = ["format_table", "plot", "sweep"]
