"""Train a :class:`~multihead.TransformerClassifier` on a text dataset, read top to bottom.

``train(config, out)`` does: data -> fixed split -> tokenizer (train split only) -> model -> AdamW with warm-up and
linear decay -> epochs over length-bucketed batches (validation every epoch, best checkpoint, early stopping,
resumable checkpoints) -> test metrics, baseline, plots. It runs unchanged under ``torchrun`` (DDP).
"""
from __future__ import annotations

import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .. import data as D
from ..models.classifier import ClassifierConfig, TransformerClassifier
from .._config import ConfigError
from .._io import Publish, folder_kind, folder_lock
from .._proc import status_kib
from . import distributed
from .config import TrainConfig
from .checkpoint import EMA, keep_metrics, restore_checkpoint, save_checkpoint
from .embed_init import init_embeddings, svd_embeddings  # noqa: F401  (re-exported)
from .evaluation import evaluate_ids, predict_ids  # noqa: F401  (re-exported)
from .metrics import plot_confusion, plot_curves
from .runfolder import (
    CheckpointError,
    atomic_write_bytes,
    atomic_write_json,
    load_checked,
    read_json,
    save_checked,
)


class RunExistsError(FileExistsError):
    pass


@dataclass
class Prepared:
    splits: D.Splits
    tokenizer: object
    encoded: dict  # split name -> D.Encoded
    labels: list[str]


def _device(config: TrainConfig) -> torch.device:
    """The configured device, checked to exist (a clear message instead of a CUDA error deep inside torch)."""
    name = config.run.device
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"invalid config: run.device {name!r} is not a device; use auto, cpu, cuda or cuda:N") \
            from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"invalid config: run.device {name!r}: multihead trains on cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: CUDA is not available on this machine; use --device cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


@contextmanager
def _run_folder(out: Path, *, resume: bool, overwrite: bool, main: bool):
    """Where this run writes, as a :class:`multihead._io.Publish`-like object with ``path`` and ``commit()``.
    A new (or overwritten) run is built in ``.NAME.new`` beside ``out`` and swapped in once it is resumable (the
    old run stays whole until then); a resumed run is written in place. Rank 0 holds the folder's lock throughout;
    other ranks write nothing."""
    if not main:
        yield SimpleNamespace(path=out, commit=lambda: out)
    elif resume:
        with folder_lock(out):
            yield SimpleNamespace(path=out, commit=lambda: out)
    else:
        tx = Publish(out, "run", overwrite=overwrite)
        with tx:
            yield tx


def prepare(config: TrainConfig, out: Path | None = None, *, resume: bool = False) -> Prepared:
    """Data, split and tokenizer; on resume the recorded split and tokenizer are reused."""
    dc = config.data
    dataset = D.load(dc.name, text_column=dc.text_column, label_column=dc.label_column)
    if resume and out is not None and (out / "splits.json").exists():
        splits = D.apply_split(dataset, read_json(out / "splits.json"))
    else:
        splits = D.split(dataset, seed=dc.split_seed, validation=dc.validation, test=dc.test)
    if dc.limit:
        rng = random.Random(dc.split_seed)  # a seeded random subset keeps every class represented
        splits = D.Splits(*(s.subset(sorted(rng.sample(range(len(s)), min(dc.limit, len(s))))) for s in splits),
                          record=splits.record)
    if resume and out is not None and (out / "tokenizer.json").exists():
        tok = D.load_tokenizer(out / "tokenizer.json")
    elif config.pretrained.name:
        from .. import pretrained

        tok = pretrained.load_tokenizer(pretrained.resolve(config.pretrained.name))
    else:
        tok = D.train_tokenizer(splits.train.texts, dc.vocab_size, dc.min_frequency)
    encoded = {name: D.encode(tok, s.texts, dc.max_len) for name, s in zip(("train", "validation", "test"), splits)}
    return Prepared(splits, tok, encoded, dataset.label_names)


def build_model(config: TrainConfig, prepared: Prepared) -> TransformerClassifier:
    """The classifier for ``config`` (its ``model`` section is completed and stored back). With
    ``pretrained.name`` the architecture comes from the checkpoint; its weights are loaded by :func:`train`."""
    if config.pretrained.name:
        from .. import pretrained

        hf = pretrained.read_hf_config(pretrained.resolve(config.pretrained.name))
        enc = pretrained.encoder_config(hf, backend=config.model.encoder.backend)
        enc.encoder.unpad = config.model.encoder.unpad
        if config.data.max_len > enc.max_len:
            raise ValueError(f"data.max_len={config.data.max_len} exceeds the pretrained model's "
                             f"{enc.max_len} positions; pass --max-len {enc.max_len} or less")
        mc = ClassifierConfig.from_dict({**enc.to_dict(), "pooling": config.model.pooling,
                                         "num_classes": len(prepared.labels)})
    else:
        mc = ClassifierConfig.from_dict({**config.model.to_dict(), "vocab_size": prepared.tokenizer.get_vocab_size(),
                                         "num_classes": len(prepared.labels), "max_len": config.data.max_len,
                                         "pad_id": 0})
    config.model = mc
    return TransformerClassifier.from_config(mc)


def _lr_scale(name: str, num_layers: int, layer_decay: float) -> float:
    """Layer-wise learning-rate factor: the head 1, block i ``decay^(N - i)``, embeddings ``decay^(N + 1)``."""
    if layer_decay == 1.0 or name.startswith("fc."):
        return 1.0
    if name.startswith("encoder.layers."):
        return layer_decay ** (num_layers - int(name.split(".")[2]))
    if name.startswith("encoder."):  # a pre-LN stack's final norm sits with the last block
        return 1.0
    return layer_decay ** (num_layers + 1)


def _optimizer(model: nn.Module, oc, layer_decay: float = 1.0) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and norms; optional layer-wise learning rates (one group per scale)."""
    num_layers = len(model.encoder.layers)
    groups: dict[tuple[float, bool], list] = {}
    for name, p in model.named_parameters():
        no_decay = p.dim() < 2 or "norm" in name
        groups.setdefault((_lr_scale(name, num_layers, layer_decay), no_decay), []).append(p)
    return torch.optim.AdamW([{"params": ps, "lr": oc.lr * scale, "weight_decay": 0.0 if nd else oc.weight_decay}
                              for (scale, nd), ps in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1]))],
                             lr=oc.lr)


def _schedule(opt, total_steps: int, warmup: float):
    warm = max(1, int(total_steps * warmup))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total_steps - step) / max(1, total_steps - warm))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _unwrap(model):
    model = getattr(model, "module", model)  # DDP
    return getattr(model, "_orig_mod", model)  # torch.compile


def start_task_run(out: Path, config, section: str, *, resume: bool, overwrite: bool):
    """What a task's ``train_*`` (G2P, vision) does before its run folder opens: with ``resume``, the recorded
    config (``config.json[section]``) replaces ``config``; otherwise an existing run at ``out`` is refused unless
    ``overwrite``; the thread count is applied (or recorded). Returns the config to run."""
    if resume:
        if not (out / "checkpoint" / "state.json").exists():
            raise CheckpointError(f"nothing to resume in {out}: it holds no checkpoint/state.json. Start a new run: "
                                  "drop --resume (add --overwrite to replace what is there)")
        recorded = read_json(out / "config.json", dict)
        if section not in recorded:
            raise CheckpointError(f"nothing to resume in {out}: it is not a {section} run folder (its config.json has "
                                  f"no {section!r} section); drop --resume to start one")
        config = type(config).from_dict(recorded[section])
    elif folder_kind(out) == "run" and not overwrite:
        raise RunExistsError(f"{out} already holds a run; pass --resume to continue it, --overwrite to replace it, "
                             "or choose another --out")
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    else:
        config.run.threads = torch.get_num_threads()
    return config


def train(config: TrainConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Train, evaluate and save a run folder; returns the results dict (also written to ``results.json``)."""
    out = Path(out)
    device = _device(config)
    dist_info = distributed.setup(device)
    main = dist_info.is_main
    if resume:
        if not (out / "checkpoint" / "state.json").exists():
            raise CheckpointError(f"nothing to resume in {out}: it holds no checkpoint/state.json (not a multihead "
                                  "run folder, or one written before checkpoints existed). Start a new run: drop "
                                  "--resume (add --overwrite to replace what is there)")
        config = TrainConfig.from_dict(read_json(out / "config.json")["train"])  # the run's own config wins
    elif folder_kind(out) == "run" and not overwrite:
        raise RunExistsError(f"{out} already holds a run; pass --resume to continue it, --overwrite to replace it, "
                             "or choose another --out")
    if config.run.threads:  # a resumed run gets the thread count it was started with: same reduction order
        torch.set_num_threads(config.run.threads)
    else:
        config.run.threads = torch.get_num_threads()
    config.data.name = D.canonical_name(config.data.name)  # a user file by absolute path: evaluate works anywhere
    distributed.barrier(dist_info)  # every rank has checked the folder before rank 0 writes to it
    with _run_folder(out, resume=resume, overwrite=overwrite, main=main) as folder:
        return _train(config, folder, device, dist_info, resume=resume)


def _train(config: TrainConfig, folder, device, dist_info, *, resume: bool) -> dict:
    """The run, phase by phase: set up (data, model, run files), start or restore the loop, publish the folder,
    epochs, the replicas' agreement check (DDP), then :func:`finish`."""
    torch.manual_seed(config.run.seed)
    prepared = prepare(config, folder.path, resume=resume)
    model = _setup_model(config, prepared, device, resume)
    if dist_info.is_main:
        _write_run_files(folder.path, config, prepared, resume)
    loop = _Loop(config, prepared, model, device, dist_info, folder.path)
    loop.start(resume)
    loop.out = folder.commit()  # resumable from here: the run replaces what was at --out only now
    loop.wrap()
    t_start = time.perf_counter()
    stopped_early = False
    for epoch in range(loop.position["epoch"], config.optim.epochs):
        if loop.run_epoch(epoch):
            stopped_early = True
            break
    train_seconds = time.perf_counter() - t_start
    ddp_check = _replicas_agree(loop.model, dist_info) if dist_info.enabled else None
    distributed.barrier(dist_info)

    results = {}
    if dist_info.is_main:
        results = finish(loop.out, config, prepared, device, train_seconds=train_seconds, stopped_early=stopped_early)
        if ddp_check:
            results["distributed"] = ddp_check
            atomic_write_json(loop.out / "results.json", results)
    distributed.teardown(dist_info)
    return results


def _setup_model(config: TrainConfig, prepared: Prepared, device, resume: bool) -> TransformerClassifier:
    model = build_model(config, prepared)
    if config.pretrained.name and not resume:
        from .. import pretrained

        pretrained.load_weights_into(model, pretrained.resolve(config.pretrained.name))
    elif config.optim.embed_init == "svd" and not resume:
        init_embeddings(model, prepared, config.run.seed)
    return model.to(device)


def _write_run_files(out: Path, config: TrainConfig, prepared: Prepared, resume: bool) -> None:
    """config, tokenizer, labels and split of a new run (rank 0); truncation notes either way."""
    if not resume:
        atomic_write_json(out / "config.json", {"train": config.to_dict()})
        atomic_write_bytes(out / "tokenizer.json", prepared.tokenizer.to_str().encode())
        atomic_write_json(out / "labels.json", prepared.labels)
        atomic_write_json(out / "splits.json", prepared.splits.record)
    for name, enc in prepared.encoded.items():
        if enc.truncated:
            print(f"note: {enc.truncated} of {len(enc.ids)} {name} texts were longer than max_len="
                  f"{config.data.max_len} tokens and were truncated")


def _replicas_agree(model, dist_info) -> dict:
    """DDP keeps replicas in sync; verify it rather than assume it: the largest parameter difference across ranks."""
    flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in _unwrap(model).parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist_info.world_size)]
    torch.distributed.all_gather(gathered, flat)
    return {"world_size": dist_info.world_size, "backend": torch.distributed.get_backend(),
            "max_param_diff_across_ranks": max((g - gathered[0]).abs().max().item() for g in gathered)}


def _fresh_position() -> dict:
    """Where a run stands; saved in every checkpoint, so a resume continues mid-epoch with the same statistics."""
    return {"epoch": 0, "batch": 0, "step": 0, "best_score": -math.inf, "best_epoch": -1, "bad_epochs": 0,
            "metrics_lines": 0, "running": {"loss": 0.0, "correct": 0, "seen": 0, "tokens": 0},
            "window": {"loss": 0.0, "correct": 0, "seen": 0}}


class _Loop:
    """The moving parts of one training run -- model, optimiser, schedule, EMA, position, metrics log -- and its
    steps: :meth:`start` (restore or first checkpoint), :meth:`wrap` (compile, DDP), :meth:`run_epoch`
    (:meth:`train_step` per batch, then :meth:`end_epoch`: validation, best model, checkpoint, early stop)."""

    def __init__(self, config: TrainConfig, prepared: Prepared, model, device, dist_info, out: Path) -> None:
        oc = config.optim
        self.config, self.prepared, self.model, self.device, self.dist, self.out = (
            config, prepared, model, device, dist_info, out)
        self.main, self.world = dist_info.is_main, dist_info.world_size
        self.opt = _optimizer(model, oc, config.pretrained.layer_decay)
        self.train_ids = prepared.encoded["train"].ids
        self.labels_train = prepared.splits.train.label_ids()
        self.lengths = [len(x) for x in self.train_ids]
        n_batches = len(D.bucketed_batches(self.lengths, oc.batch_size, seed=config.run.seed, epoch=0))
        self.sched = _schedule(self.opt, oc.epochs * n_batches, oc.warmup)
        self.ema = EMA(model, oc.ema_decay) if oc.ema_decay > 0 else None
        self.eval_model = TransformerClassifier.from_config(config.model).to(device) if self.ema is not None else None
        self.position = _fresh_position()
        self.special_ids = torch.tensor([i for i in (prepared.tokenizer.token_to_id(t) for t in D.tokenizer.SPECIALS)
                                         if i is not None])

    def start(self, resume: bool) -> None:
        """Restore model, optimiser, schedule, EMA and position from the checkpoint (dropping metrics logged after
        it), or save a new run's step-0 checkpoint: its first resumable state."""
        out = self.out
        if not resume:
            if self.main:
                save_checkpoint(out, self.model, self.opt, self.sched, self.position, self.ema)
            return
        state = restore_checkpoint(out, self.model, self.opt, self.sched, self.ema)
        self.position = {k: state[k] for k in self.position}
        if self.main:
            keep_metrics(out / "metrics.jsonl", self.position["metrics_lines"])
        if self.main:
            print(f"resuming {out} at epoch {self.position['epoch'] + 1}, batch {self.position['batch']}")

    def wrap(self) -> None:
        if self.config.run.compile:
            self.model = torch.compile(self.model)
        if self.dist.enabled:
            self.model = nn.parallel.DistributedDataParallel(self.model)

    def log(self, event: dict) -> None:
        """Append to metrics.jsonl (rank 0); the count lets a resume drop events logged after its checkpoint."""
        if self.main:
            with (self.out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(event) + "\n")
            self.position["metrics_lines"] += 1

    def run_epoch(self, epoch: int) -> bool:
        """One epoch from the saved batch position; True when early stopping ends the run."""
        from tqdm import tqdm

        oc, pos = self.config.optim, self.position
        batches = D.bucketed_batches(self.lengths, oc.batch_size, seed=self.config.run.seed, epoch=epoch)
        if self.world > 1:
            batches = [b for b in batches if len(b) >= self.world]  # every rank needs at least one example
        self.model.train()
        bar = tqdm(total=len(batches), initial=pos["batch"], desc=f"epoch {epoch + 1}/{oc.epochs}",
                   disable=not (self.main and self.config.run.progress), leave=False)
        t_epoch = time.perf_counter()
        tokens = 0
        for bi in range(pos["batch"], len(batches)):
            tokens += self.train_step(batches[bi], epoch)
            run = pos["running"]
            bar.update(1)
            bar.set_postfix(loss=f"{run['loss'] / run['seen']:.3f}", acc=f"{run['correct'] / run['seen']:.3f}",
                            tok_s=f"{tokens * self.world / max(time.perf_counter() - t_epoch, 1e-9):.0f}")
            pos["batch"] = bi + 1
            save_every = self.config.run.save_every
            if save_every and pos["step"] % save_every == 0 and bi + 1 < len(batches) and self.main:
                save_checkpoint(self.out, _unwrap(self.model), self.opt, self.sched, pos, self.ema)
        bar.close()
        return self.end_epoch(epoch, time.perf_counter() - t_epoch, tokens)

    def train_step(self, batch: list[int], epoch: int) -> int:
        """Forward, backward and update on this rank's share of ``batch``; returns its real-token count."""
        oc, pos, tok = self.config.optim, self.position, self.prepared.tokenizer
        local = batch[self.dist.rank::self.world]
        x, mask = D.collate([self.train_ids[i] for i in local])
        y = torch.tensor([self.labels_train[i] for i in local])
        if oc.token_dropout > 0:  # word dropout: the model cannot lean on any single token
            drop = (torch.rand(x.shape) < oc.token_dropout) & mask & ~torch.isin(x, self.special_ids)
            x = x.masked_fill(drop, tok.token_to_id(D.tokenizer.UNK))
        x, mask, y = x.to(self.device), mask.to(self.device), y.to(self.device)
        logits = self.model(x, mask)
        # sum / global batch * world: DDP's gradient average then equals the global-batch mean exactly
        loss = F.cross_entropy(logits.float(), y, reduction="sum", label_smoothing=oc.label_smoothing)
        (loss * self.world / len(batch)).backward()
        if oc.clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), oc.clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(_unwrap(self.model), pos["step"])
        pos["step"] += 1
        correct = int((logits.argmax(-1) == y).sum())
        for acc in (pos["running"], pos["window"]):  # epoch-running and since-last-log statistics
            acc["loss"] += loss.item()
            acc["correct"] += correct
            acc["seen"] += len(local)
        ntok = int(mask.sum())
        pos["running"]["tokens"] += ntok
        if pos["step"] % 50 == 0:
            win = pos["window"]
            self.log({"event": "train", "epoch": epoch + 1, "step": pos["step"], "loss": win["loss"] / win["seen"],
                      "accuracy": win["correct"] / win["seen"], "lr": self.sched.get_last_lr()[0]})
            pos["window"] = {"loss": 0.0, "correct": 0, "seen": 0}
        return ntok

    def end_epoch(self, epoch: int, epoch_time: float, tokens: int) -> bool:
        """Validate (the EMA weights when averaging), keep the best model, log, checkpoint; True to stop early."""
        oc, pos, run = self.config.optim, self.position, self.position["running"]
        scored = _unwrap(self.model)
        if self.ema is not None:  # validation, and the saved best model, use the averaged weights
            self.ema.copy_to(self.eval_model)
            scored = self.eval_model
        val = evaluate_ids(scored, self.prepared.encoded["validation"].ids, self.prepared.splits.validation.label_ids(),
                           len(self.prepared.labels), self.device)
        score = val["accuracy"] if oc.select == "accuracy" else -val["loss"]
        improved = score > pos["best_score"]
        if improved:
            pos["best_score"], pos["best_epoch"], pos["bad_epochs"] = score, epoch + 1, 0
            if self.main:
                save_checked(self.out / "model.safetensors", scored.state_dict(),
                             {"format": "multihead.TransformerClassifier", "epoch": str(epoch + 1)})
        else:
            pos["bad_epochs"] += 1
        event = {"event": "eval", "epoch": epoch + 1, "step": pos["step"],
                 "train_loss": run["loss"] / max(run["seen"], 1), "train_accuracy": run["correct"] / max(run["seen"], 1),
                 "val_loss": val["loss"], "val_accuracy": val["accuracy"], "val_macro_f1": val["macro_f1"],
                 "epoch_seconds": epoch_time, "tokens_per_second": tokens * self.world / max(epoch_time, 1e-9),
                 "threads": torch.get_num_threads(), "best": improved}
        self.log(event)
        if self.main and self.config.run.progress:
            print(f"epoch {epoch + 1}: train loss {event['train_loss']:.4f} acc {event['train_accuracy']:.4f} | "
                  f"val loss {val['loss']:.4f} acc {val['accuracy']:.4f}{' *' if improved else ''} | "
                  f"{epoch_time:.1f}s, {event['tokens_per_second']:.0f} tok/s")
        pos.update(epoch=epoch + 1, batch=0, running={"loss": 0.0, "correct": 0, "seen": 0, "tokens": 0})
        stop = bool(oc.patience and pos["bad_epochs"] >= oc.patience)
        if self.main:
            save_checkpoint(self.out, _unwrap(self.model), self.opt, self.sched, {**pos, "stopped": stop}, self.ema)
        return stop


def finish(out: Path, config: TrainConfig, prepared: Prepared, device, *, train_seconds: float,
           stopped_early: bool) -> dict:
    """Best weights -> test metrics, baseline, plots, results.json."""
    tensors, meta = load_checked(out / "model.safetensors")
    model = TransformerClassifier.from_config(config.model).to(device)
    model.load_state_dict(tensors)
    num_classes = len(prepared.labels)
    test = evaluate_ids(model, prepared.encoded["test"].ids, prepared.splits.test.label_ids(), num_classes, device)
    val = evaluate_ids(model, prepared.encoded["validation"].ids, prepared.splits.validation.label_ids(),
                       num_classes, device)
    from .baseline import tfidf_baseline

    try:
        baseline = tfidf_baseline(prepared.splits)
    except ImportError as exc:  # scikit-learn is a declared dependency; keep training results if it is missing
        baseline = {"error": str(exc)}
    results = {
        "dataset": config.data.name,
        "test": {k: test[k] for k in ("accuracy", "macro_f1", "per_class_f1", "loss", "n", "confusion")},
        "validation": {k: val[k] for k in ("accuracy", "macro_f1", "loss", "n")},
        "best_epoch": int(meta.get("epoch", 0)),
        "stopped_early": stopped_early,
        "train_seconds": train_seconds,
        "threads": torch.get_num_threads(),
        "peak_rss_mb": status_kib("VmHWM") / 1024 or None,  # this process's peak resident memory (Linux)
        "parameters": sum(p.numel() for p in model.parameters()),
        "truncated": {k: v.truncated for k, v in prepared.encoded.items()},
        "labels": prepared.labels,
        "baseline_tfidf_logreg": baseline,
    }
    atomic_write_json(out / "results.json", results)
    plot_confusion(test["confusion"], prepared.labels, out / "confusion.png",
                   f"{config.data.name} test: accuracy {test['accuracy']:.3f}")
    if (out / "metrics.jsonl").exists():
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    return results
