"""Iterative head pruning (Michel et al. 2019), then physical pruning into a new run folder.

Each round masks the least important ``step`` fraction of the remaining heads (at least one), re-scoring with the
current mask, and evaluates on the validation split (and, for the report, on the test split). Rounds continue while
validation accuracy stays within ``max_drop`` of the unpruned model; the last mask within it is kept and the model is
pruned physically (``encoder.prune_heads``), saved with ``pruned_heads`` in its config, and reloaded to check.
"""

from __future__ import annotations

from .._io import atomic_write_json

import copy
import math
import time
from pathlib import Path

import torch

from .scores import head_shape, importance, loss_with, model_mask, present


def prune_curve(
    model,
    val,
    test=None,
    *,
    method: str = "michel",
    step: float = 0.1,
    max_drop: float = 0.01,
    score_data=None,
    until: float = 0.0,
    log=print,
) -> dict:
    """Rounds of masking. ``val``/``test``/``score_data``: ``(ids, labels)``; scores come from ``score_data``
    (default ``val``). The curve continues past ``max_drop`` until ``until`` of the heads are pruned (1.0: all);
    the chosen mask always respects ``max_drop``. Returns ``{"rounds": [...], "mask": chosen mask, ...}``; each
    round also records its ``mask``."""
    layers, heads = head_shape(model)
    mask = present(model)  # heads already pruned away physically count as gone from the start
    total = int(mask.sum())
    score_ids, score_labels = score_data or val
    _, base_val = loss_with(model, *val, mask)
    base_test = loss_with(model, *test, mask)[1] if test else None
    rounds = [
        {
            "pruned": 0,
            "fraction": 0.0,
            "val_accuracy": base_val,
            "test_accuracy": base_test,
            "heads_pruned": [],
            "mask": mask.int().tolist(),
        }
    ]
    best = mask.clone()
    log(f"round 0: {total} heads, validation accuracy {base_val:.4f}" + (f", test {base_test:.4f}" if test else ""))
    within = True
    while mask.sum() > 0:
        scores = importance(model, score_ids, score_labels, method, mask)
        alive = int(mask.sum())
        k = max(1, math.ceil(step * alive))
        flat = scores.flatten().nan_to_num(float("inf"))
        drop = flat.argsort()[:k].tolist()
        for idx in drop:
            mask[idx // heads, idx % heads] = 0
        _, acc = loss_with(model, *val, mask)
        test_acc = loss_with(model, *test, mask)[1] if test else None
        pruned = total - int(mask.sum())
        rounds.append(
            {
                "pruned": pruned,
                "fraction": pruned / total,
                "val_accuracy": acc,
                "test_accuracy": test_acc,
                "heads_pruned": [[i // heads, i % heads] for i in drop],
                "mask": mask.int().tolist(),
            }
        )
        ok = acc >= base_val - max_drop
        log(
            f"round {len(rounds) - 1}: pruned {pruned}/{total} ({pruned / total:.0%}), validation accuracy "
            f"{acc:.4f}" + (f", test {test_acc:.4f}" if test else "") + ("" if ok else "  (beyond max-drop)")
        )
        if ok and within:
            best = mask.clone()
        else:
            within = False
            if pruned / total >= until:
                break
    chosen = total - int(best.sum())
    return {
        "method": method,
        "step": step,
        "max_drop": max_drop,
        "heads": total,
        "rounds": rounds,
        "mask": best.int().tolist(),
        "pruned": chosen,
        "fraction": chosen / total,
        "base_val_accuracy": base_val,
        "base_test_accuracy": base_test,
    }


def mask_to_heads(mask) -> dict[int, list[int]]:
    return {l: [h for h, v in enumerate(row) if not v] for l, row in enumerate(mask) if not all(row)}


def plot_curve(result: dict, stem: Path, title: str) -> list[Path]:
    from ..plotting import pyplot

    plt = pyplot()

    from ..plotting import plain, save as _save

    r = result["rounds"]
    x = [100 * e["fraction"] for e in r]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(x, [e["val_accuracy"] for e in r], "o-", label="validation")
    if r[0]["test_accuracy"] is not None:
        ax.plot(x, [e["test_accuracy"] for e in r], "s-", label="test")
    ax.axhline(
        result["base_val_accuracy"] - result["max_drop"],
        color="grey",
        ls="--",
        lw=1,
        label=f"validation - {result['max_drop']:g} (stop)",
    )
    ax.axvline(100 * result["fraction"], color="red", ls=":", lw=1, label=f"chosen: {100 * result['fraction']:.0f}%")
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel("accuracy")
    ax.set_title(plain(title), fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, stem)


def write_pruned_run(run, heads: dict[int, list[int]], out: Path, extra: dict) -> Path:
    """Write ``run``'s folder to ``out`` (a folder the caller owns: :func:`prune_run` builds it aside and swaps it
    in) with the model physically pruned (config records ``pruned_heads``)."""
    from .._io import atomic_write_bytes
    from ..train.runfolder import read_json, save_checked

    out = Path(out)
    if out.resolve() == Path(run.path).resolve():
        raise ValueError("--out must differ from the run folder: the unpruned run is kept")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "labels.json", "splits.json"):
        if (Path(run.path) / name).exists():  # an image run has no tokenizer
            atomic_write_bytes(out / name, (Path(run.path) / name).read_bytes())
    run.model.encoder.prune_heads(heads)
    cfg = read_json(Path(run.path) / "config.json")
    task = "vision" if "vision" in cfg else "train"
    cfg[task]["model"] = run.config.model.to_dict()  # now with encoder.pruned_heads
    cfg["pruned_from"] = {"run": str(run.path), **extra}
    save_checked(
        out / "model.safetensors", {k: v.detach().cpu().contiguous() for k, v in run.model.state_dict().items()}
    )
    atomic_write_json(out / "config.json", cfg)
    return out


def time_inference(models: dict, ids, *, batch_size: int = 32, min_time: float = 3.0) -> dict:
    """Seconds per pass over ``ids`` (token ids, or uint8 images) for each model, interleaved round by round (best of
    several rounds)."""
    from .scores import labelled_batches

    batches = [inputs for inputs, _, _ in labelled_batches(ids, [0] * len(ids), batch_size)]
    best = {k: math.inf for k in models}
    start = time.perf_counter()
    rounds = 0
    with torch.no_grad():
        for m in models.values():  # warm-up
            m.eval()
            m(*batches[0])
        while rounds < 3 or time.perf_counter() - start < min_time * len(models):
            for name, m in models.items():
                t0 = time.perf_counter()
                for inputs in batches:
                    m(*inputs)
                best[name] = min(best[name], time.perf_counter() - t0)
            rounds += 1
    return {
        "seconds": best,
        "rounds": rounds,
        "batch_size": batch_size,
        "examples": len(ids),
        "threads": torch.get_num_threads(),
    }


def prune_run(
    run_path,
    out: Path,
    *,
    data: str | None = None,
    method: str = "michel",
    step: float = 0.1,
    max_drop: float = 0.01,
    until: float = 0.0,
    speed_at: float | None = None,
    min_time: float = 3.0,
    overwrite: bool = False,
    log=print,
) -> dict:
    """The whole ``multihead prune``: curve on validation (test recorded), physically pruned run folder in ``out``
    (reloaded and checked against the masked model), inference timed side by side; ``out/pruning.{json,png}``.
    The new run is built beside ``out`` and swapped in when complete; an existing run at ``out`` is replaced only
    with ``overwrite``, and the source run never."""
    from .._io import Publish, check_target

    check_target(out, "run", overwrite=overwrite, sources=(run_path,))  # before the (slow) curve
    with Publish(out, "run", overwrite=overwrite, sources=(run_path,)) as folder:
        result = _prune_into(
            run_path,
            folder,
            data=data,
            method=method,
            step=step,
            max_drop=max_drop,
            until=until,
            speed_at=speed_at,
            min_time=min_time,
            log=log,
            target=out,
        )
    return result


def _prune_into(run_path, out: Path, *, data, method, step, max_drop, until, speed_at, min_time, log, target) -> dict:
    from ..train import tasks
    from .scores import labelled, labelled_batches

    run, _, parts, _ = labelled(run_path, data, ("validation", "test"))  # one read of the data
    (val_ids, val_y), (test_ids, test_y) = parts["validation"], parts["test"]
    curve = prune_curve(
        run.model,
        (val_ids, val_y),
        (test_ids, test_y),
        method=method,
        step=step,
        max_drop=max_drop,
        until=max(speed_at or 0.0, until),
        log=log,
    )
    chosen = mask_to_heads(curve["mask"])
    masked = torch.tensor(curve["mask"], dtype=torch.float32)
    unpruned = copy.deepcopy(run.model)  # write_pruned_run prunes run.model in place
    write_pruned_run(run, chosen, out, {"method": method, "max_drop": max_drop, "step": step})
    from ..loading import task_of

    kind = task_of(run_path) or tasks.KINDS["train"]
    if kind.section == "vision":  # reloaded from the new folder: shapes come from config.json
        pruned = kind.load_run(out)
    else:
        from ..train import load_run

        pruned = load_run(out)
    inputs, _, _ = next(labelled_batches(test_ids[:64], test_y[:64], 64))
    with torch.no_grad():
        diff = (pruned.model(*inputs) - unpruned(*inputs, head_mask=model_mask(unpruned, masked))).abs().max().item()
    acc = loss_with(pruned.model, test_ids, test_y, present(pruned.model))[1]
    curve.update(
        run=str(run_path),
        out=str(target),
        pruned_heads=chosen,
        test_accuracy_pruned=acc,
        max_abs_diff_pruned_vs_masked=diff,
        parameters={
            "unpruned": sum(p.numel() for p in unpruned.parameters()),
            "pruned": sum(p.numel() for p in pruned.model.parameters()),
        },
    )
    models = {"unpruned": unpruned, "pruned": pruned.model}
    if speed_at:
        target = min(curve["rounds"], key=lambda r: abs(r["fraction"] - speed_at))
        at = copy.deepcopy(unpruned)
        at.encoder.prune_heads(mask_to_heads(target["mask"]))
        models[f"pruned_{100 * target['fraction']:.0f}pct"] = at
        curve["speed_at"] = {"fraction": target["fraction"], "test_accuracy": target["test_accuracy"]}
    speed = time_inference(models, test_ids, batch_size=32, min_time=min_time)
    speed["speedup_vs_unpruned"] = {k: speed["seconds"]["unpruned"] / v for k, v in speed["seconds"].items()}
    curve["inference"] = speed
    atomic_write_json(Path(out) / "pruning.json", curve)
    plot_curve(
        curve,
        Path(out) / "pruning",
        f"{run_path}: iterative pruning ({method}; each round removes {step:.0%} of the remaining heads, at least one)",
    )
    return curve


__all__ = ["mask_to_heads", "plot_curve", "prune_curve", "prune_run", "time_inference", "write_pruned_run"]
