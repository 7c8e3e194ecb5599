"""The run harness: one run folder, one resume policy and one training loop under every task.

The resume policy and the run folder's staging live in :mod:`.runfolder`, DDP's helpers in :mod:`.distributed` and
experiment tracking in :mod:`.tracking`; this module is the :class:`Task` contract, :func:`run_task` and the loop.

A task (the text classifier, MLM/CLM pretraining, G2P, the ViT, grounding, ...) is a :class:`Task` subclass that
supplies only what differs: its data and model (built in ``__init__``), the batches of an epoch, the loss of a
batch, validation, the files it writes when a run starts and what it writes at the end. :func:`run_task` does the
rest, the same way for every task::

    run_task(MyTask, config, "runs/x")                 # a new run (refused if runs/x holds one)
    run_task(MyTask, config, "runs/x", overwrite=True) # replaces it, once the new one has trained and validated
    run_task(MyTask, config, "runs/x", resume=True, given={"optim": {"lr": 1e-3}})

The run folder is built beside ``out`` as ``.NAME.new``, locked, and swapped in only once the new run has trained:
after its first validation (so after at least one optimizer step) and the checkpoint that follows it
(:class:`multihead._io.Publish`). A setting that fails at the first step or at validation therefore leaves what was
at ``out`` byte-identical, for every task. A resume writes in place under the lock. **Resume policy** (one for every task):
the recorded ``config.json[section]`` is the run; options given again (``given``) that match it are accepted, options
that differ are refused by name (:data:`RESUME_MAY_CHANGE` lists the ones that change nothing computed). A resume
with another process count is refused: how a global batch is split across ranks, and each rank's random draws,
depend on it.

**The loop** (:class:`Loop`): AdamW with one weight-decay rule (:func:`param_groups`), linear warm-up then linear or
cosine decay, a position saved in every checkpoint (a resume continues mid-epoch, bit-identically), a tqdm bar,
``metrics.jsonl`` (train events every ``log_every`` steps over the steps since the previous one, eval events after
each validation), gradient clipping, an optional moving average of the weights (EMA) that validation and the best
checkpoint use, the best checkpoint by the task's validation score, early stopping, DDP under ``torchrun`` (the
global batch is the same for any process count; each rank takes ``batch[rank::world]``, its mean loss weighted so
that DDP's gradient average equals the global mean) and a check that the replicas agree at the end.

**Experiment tracking** (``run.log = "tensorboard"``, ``--log tensorboard``): every event of ``metrics.jsonl`` also
goes to TensorBoard event files in ``RUN/tensorboard/`` (``train/loss``, ``train/lr``, ``eval/val_accuracy``...), and
the pictures the task draws at the end (curves, confusion) as images; nothing leaves the machine. A resume purges the
events logged after its checkpoint, as ``metrics.jsonl`` drops its lines.

**Ctrl-C** (SIGINT, single process): the step under way finishes, a checkpoint of that step is saved and
:class:`RunInterrupted` says how to resume (``--resume`` continues bit-identically). A new run interrupted before its
first validation is published if ``--out`` held nothing (it is resumable); one that would replace an existing run
leaves that run untouched, as any run that has not validated yet. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence

import torch
from torch import nn

from .._config import ConfigError
from . import distributed, tracking
from .distributed import replicas_agree, unwrap
from .checkpoint import EMA, keep_metrics, model_tensors, restore_checkpoint, save_checkpoint
from .runfolder import (  # noqa: F401  (the resume policy is the run folder's; kept importable from here)
    INPUT_FIELDS,
    RESUME_MAY_CHANGE,
    CheckpointError,
    RunExistsError,
    absolute_inputs,
    atomic_write_json,
    check_inputs,
    read_json,
    recorded_config,
    resume_conflicts,
    run_folder,
    save_checked,
    start_config,
)


@dataclass
class Step:
    """What a task's :meth:`Task.loss` returns for its share of a batch.

    ``loss``: the mean loss over ``count`` items (examples, predicted tokens), a tensor to back-propagate;
    ``stats``: sums to accumulate for the logs: ``loss`` (summed loss), ``n`` (its denominator), optionally
    ``correct`` (right predictions among ``n``) and ``tokens`` (tokens processed by all ranks, for throughput)."""

    loss: torch.Tensor
    count: int
    stats: dict[str, float] = field(default_factory=dict)


class Task:
    """What a training task supplies to :class:`Loop`. Subclasses set ``section`` (their ``config.json`` section) and
    build ``self.model`` (and their data) in ``__init__``; everything else has a default.

    ``config`` needs ``optim.lr``, ``optim.weight_decay``, ``optim.warmup``, ``optim.clip`` and ``run.seed``,
    ``run.progress``; ``optim.epochs`` unless :meth:`total_steps` is overridden."""

    section: str = ""
    schedule: str = "linear"  # decay after warm-up: linear | cosine
    log_every: int = 50  # steps between train events
    validate_every: int = 0  # steps between validations; 0: at the end of every epoch
    keep_best: bool = True  # save model.safetensors whenever the validation score improves
    no_decay_names: tuple[str, ...] = ()  # parameters (by name) that get no weight decay besides biases and norms
    model_format: str = ""  # metadata of the saved weights (default: multihead.<model class>)
    reports_accuracy: bool = True  # its Step.stats count ``correct``: train events carry an accuracy

    def __init__(self, config, path: Path, resume: bool) -> None:
        self.config, self.resume = config, resume
        self.device = torch.device("cpu")
        self.model: nn.Module

    # what every task provides -------------------------------------------------------------------------------
    def batches(self, epoch: int) -> Sequence:
        """The global batches of ``epoch``, the same for any process count (seeded by the run's seed and epoch)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch, step: int, part: slice) -> Step:
        """The loss of this rank's share ``part`` of ``batch`` (``slice(rank, None, world)``) at optimizer step
        ``step``; ``model`` may be wrapped (DDP)."""
        raise NotImplementedError

    def validate(self, model: nn.Module) -> dict:
        """Validation of ``model`` (the EMA weights when averaging): a dict with ``score`` (higher is better) and
        whatever :meth:`eval_fields` reports."""
        raise NotImplementedError

    def eval_fields(self, val: dict) -> dict:
        """The validation numbers written to ``metrics.jsonl``."""
        return {f"val_{k}": v for k, v in val.items() if k != "score"}

    def write_start(self, path: Path) -> None:
        """Files of a new run (``config.json`` first), written once into the staging folder (rank 0)."""
        raise NotImplementedError

    def finish(self, path: Path, run: dict) -> dict:
        """Results of the finished run (``run``: ``seconds``, ``best_epoch``, ``stopped_early``, ``step``); written to
        ``results.json`` by the harness; ``run`` also has ``tokens`` and ``world_size``."""
        raise NotImplementedError

    @classmethod
    def inputs(cls, config) -> dict[str, str]:
        """What a run of this config reads, by config field: :data:`INPUT_FIELDS` (a path or a built-in dataset
        name). A task reading another default location adds it (the ViT: Fashion-MNIST's folder)."""
        found = {}
        for dotted in INPUT_FIELDS:
            section, _, name = dotted.partition(".")
            value = getattr(getattr(config, section, None), name, None)
            if isinstance(value, str) and value:
                found[dotted] = value
        return found

    @staticmethod
    def config_from_overrides(over: dict):
        """The task's config from the command line's nested overrides (flags, TOML, ``--set``), validated."""
        raise NotImplementedError

    @classmethod
    def config_from_dict(cls, d: dict):
        """The task's config from a run folder's recorded section."""
        return type(cls.config_from_overrides({})).from_dict(d)

    # optional --------------------------------------------------------------------------------------------------
    @property
    def epochs(self) -> int:
        return self.config.optim.epochs

    def total_steps(self) -> int:
        return self.epochs * len(self.batches(0))

    def lr_scale(self, name: str) -> float:
        """Learning-rate factor of parameter ``name`` (layer-wise decay when fine-tuning)."""
        return 1.0

    def new_model(self) -> nn.Module:
        """An untrained model of the same configuration (the EMA's evaluation copy)."""
        raise NotImplementedError

    ema_decay: float = 0.0
    patience: int = 0  # early stopping: epochs without a better validation score (0: off)
    compile: bool = False

    @staticmethod
    def summary(results: dict) -> list[str]:
        """Lines ``multihead train`` prints when the run has finished (beyond what :meth:`finish` printed)."""
        return []

    def epoch_message(self, epoch: int, event: dict) -> str:
        """The line printed after each validation (when ``run.progress``)."""
        vals = ", ".join(f"{k[4:]} {v:.4f}" for k, v in event.items() if k.startswith("val_") and isinstance(v, float))
        return (
            f"epoch {epoch + 1}: train loss {event.get('train_loss', float('nan')):.4f} | validation {vals}"
            f"{' *' if event.get('best') else ''} | {event['minutes']:.1f} min"
        )


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during training: the message says what was saved and how to continue."""


def run_task(
    task_cls: type[Task],
    config,
    out: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    given: dict | None = None,
    device: torch.device | None = None,
) -> dict:
    """Train ``task_cls`` on ``config`` into the run folder ``out`` (see the module docstring); returns the
    results (also ``results.json``; empty on ranks other than 0)."""
    out = Path(out)
    dist_info = distributed.setup(device or torch.device("cpu"))
    try:
        config = start_config(out, config, task_cls, resume=resume, overwrite=overwrite, given=given)
        task = task_cls(config, out, resume)  # data and model: their problems are reported before --out is touched
        distributed.barrier(dist_info)  # every rank has checked the folder before rank 0 writes to it
        with run_folder(out, resume=resume, overwrite=overwrite, main=dist_info.is_main) as folder:
            return Loop(task, folder, dist_info, resume).run()
    finally:
        distributed.teardown(dist_info)


# ------------------------------------------------------------------------------------------------------ the loop
def param_groups(model: nn.Module, lr: float, weight_decay: float, *, no_decay_names=(), lr_scale=None) -> list[dict]:
    """AdamW's parameter groups, one rule for every task: matrices decay; biases, norm weights (every parameter with
    fewer than two dimensions) and the task's ``no_decay_names`` (e.g. a class token, a position table) do not.
    ``lr_scale(name)`` gives per-parameter learning-rate factors (one group per factor)."""
    groups: dict[tuple[float, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.dim() < 2 or name in no_decay_names
        scale = lr_scale(name) if lr_scale else 1.0
        groups.setdefault((scale, no_decay), []).append(p)
    return [
        {"params": ps, "lr": lr * scale, "weight_decay": 0.0 if nd else weight_decay}
        for (scale, nd), ps in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1]))
    ]


def warmup_schedule(opt: torch.optim.Optimizer, total: int, warmup: float, decay: str = "linear"):
    """Linear warm-up over ``warmup`` of the ``total`` steps, then linear (to 0) or cosine decay."""
    warm = max(1, int(total * warmup))
    if decay not in ("linear", "cosine"):
        raise ValueError(f"schedule must be linear or cosine, got {decay!r}")

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if decay == "cosine":
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
        return max(0.0, (total - step) / max(1, total - warm))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _zero_stats() -> dict:
    return {"loss": 0.0, "n": 0, "correct": 0}


def fresh_position(world_size: int = 1) -> dict:
    """Where a run stands; saved in every checkpoint, so a resume continues mid-epoch with the same statistics."""
    return {
        "epoch": 0,
        "batch": 0,
        "step": 0,
        "best_score": -math.inf,
        "best_epoch": -1,
        "bad_epochs": 0,
        "seconds": 0.0,
        "tokens": 0,
        "metrics_lines": 0,
        "world_size": world_size,
        "stopped": False,
        "epoch_stats": _zero_stats(),
        "window": _zero_stats(),
    }


class Loop:
    """One run's moving parts -- the task's model, optimiser, schedule, EMA, position, metrics log -- and the loop
    over epochs and steps (:meth:`run`)."""

    def __init__(self, task: Task, folder, dist_info, resume: bool) -> None:
        oc = task.config.optim
        self.task, self.folder, self.dist = task, folder, dist_info
        self.main, self.world, self.rank = dist_info.is_main, dist_info.world_size, dist_info.rank
        self.model = task.model.to(task.device)
        self.opt = torch.optim.AdamW(
            param_groups(
                self.model, oc.lr, oc.weight_decay, no_decay_names=task.no_decay_names, lr_scale=task.lr_scale
            ),
            lr=oc.lr,
        )
        self.total = task.total_steps()
        self.sched = warmup_schedule(self.opt, self.total, oc.warmup, task.schedule)
        self.ema = EMA(self.model, task.ema_decay) if task.ema_decay > 0 else None
        self.eval_model = task.new_model().to(task.device) if self.ema is not None else None
        self.position = fresh_position(self.world)
        self.published = resume  # a new run is swapped in at --out only once it has trained and validated
        path = folder.path
        if resume:
            state = restore_checkpoint(path, self.model, self.opt, self.sched, self.ema)
            missing = set(self.position) - set(state)
            if missing:
                raise CheckpointError(
                    f"{path / 'checkpoint'} was written by an older multihead (its position lacks "
                    f"{', '.join(sorted(missing))}); it cannot be resumed: start a new run"
                )
            if state["world_size"] != self.world:
                raise ConfigError(
                    f"{path} was trained with {state['world_size']} process(es); resume it with the "
                    f"same count (torchrun --nproc_per_node {state['world_size']}): how each batch is "
                    "split across processes, and their random draws, depend on it"
                )
            self.position = {k: state[k] for k in self.position}
            if self.main:
                keep_metrics(path / "metrics.jsonl", self.position["metrics_lines"])
                print(f"resuming {path} at epoch {self.position['epoch'] + 1}, step {self.position['step']}")
        elif self.main:
            from ..data import provenance

            atomic_write_json(path / "inputs.json", provenance.record(type(task).inputs(task.config)))
            task.write_start(path)
            self.save()

    # ------------------------------------------------------------------------------------------------------------
    def save(self) -> None:
        if self.main:
            save_checkpoint(self.folder.path, unwrap(self.model), self.opt, self.sched, self.position, self.ema)

    def log(self, event: dict) -> None:
        """Append to metrics.jsonl (rank 0); the count lets a resume drop events logged after its checkpoint."""
        if self.main:
            path = self.folder.path / "metrics.jsonl"
            try:
                with path.open("a") as f:
                    f.write(json.dumps(event) + "\n")
            except OSError as exc:  # name the file (a full disk does not)
                raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
            self.position["metrics_lines"] += 1
            if self.tracker is not None:
                self.tracker.event(event)

    def _clock(self) -> float:
        return time.perf_counter() - self._t0

    def publish(self) -> None:
        """Save and swap the staged run in at ``--out`` (once): called after the first validation, so a setting that
        fails at the first step or at validation never replaces what was there."""
        if self.published:
            return
        self.save()
        if self.tracker is not None:  # its files move with the folder; the writer continues there
            self.tracker.close()
        self.folder.commit()
        self.published = True
        if self.tracker is not None:
            self.tracker.reopen(self.folder.path)

    def _on_sigint(self, signum, frame) -> None:
        if self.interrupted:  # a second Ctrl-C: stop now (the last checkpoint stays)
            raise KeyboardInterrupt
        self.interrupted = True
        print("\ninterrupted: finishing this step and saving a checkpoint (Ctrl-C again to stop at once)", flush=True)

    def _stop_here(self, bar) -> None:
        """Save the current step and raise :class:`RunInterrupted` with the way to continue."""
        bar.close()
        pos, out = self.position, getattr(self.folder, "out", self.folder.path)
        where = f"step {pos['step']} (epoch {pos['epoch'] + 1}, batch {pos['batch']})"
        if not self.published and getattr(self.folder, "overwrite", False) and Path(out).exists():
            raise RunInterrupted(
                f"interrupted at {where}, before the first validation: the run at {out} is unchanged (a new run "
                "replaces it only once it has trained and validated); nothing to resume"
            )
        if self.published:
            self.save()
        else:
            self.publish()  # saves, then swaps the staged run in: it is resumable where the user asked for it
        raise RunInterrupted(
            f"interrupted at {where}; its checkpoint is saved in {out}/checkpoint. Continue with the same command "
            "and --resume"
        )

    def run(self) -> dict:
        import signal
        import threading

        self.interrupted = False
        self.tracker = tracking.open(self.task.config, self.folder.path, self.position["step"] + 1, self.main)
        catch = self.world == 1 and threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, self._on_sigint) if catch else None
        try:
            return self._run()
        finally:
            if catch:
                signal.signal(signal.SIGINT, previous)
            if self.tracker is not None:
                self.tracker.close()

    def _run(self) -> dict:
        task, pos = self.task, self.position
        if task.compile:
            self.model = torch.compile(self.model)
        if self.dist.enabled:
            self.model = nn.parallel.DistributedDataParallel(self.model)
        self._t0 = time.perf_counter() - pos["seconds"]
        for epoch in range(pos["epoch"], task.epochs):
            if pos["stopped"]:
                break
            self.run_epoch(epoch)
        ddp = replicas_agree(self.model, self.dist) if self.dist.enabled else None
        distributed.barrier(self.dist)
        if not self.main:
            return {}
        self.publish()  # a run with nothing to validate (no batches) is published when it ends
        results = task.finish(
            self.folder.path,
            {
                "seconds": pos["seconds"],
                "best_epoch": pos["best_epoch"],
                "stopped_early": pos["stopped"],
                "step": pos["step"],
                "tokens": pos["tokens"],
                "world_size": self.world,
            },
        )
        if ddp:
            results["distributed"] = ddp
        atomic_write_json(self.folder.path / "results.json", results)
        if self.tracker is not None:
            self.tracker.pictures(self.folder.path, self.position["step"])
        return results

    def run_epoch(self, epoch: int) -> None:
        """One epoch from the saved batch position: steps, step-wise validation and checkpoints, then the epoch's
        validation (or the final one), its checkpoint and early stopping."""
        from tqdm import tqdm

        task, cfg, pos = self.task, self.task.config, self.position
        batches = task.batches(epoch)
        self.model.train()
        label = f"epoch {epoch + 1}/{task.epochs}" if task.epochs > 1 or not task.validate_every else task.section
        bar = tqdm(
            total=len(batches),
            initial=pos["batch"],
            desc=label,
            disable=not (self.main and cfg.run.progress),
            leave=False,
        )
        t_epoch, tokens_before = self._clock(), pos["tokens"]
        save_every = getattr(cfg.run, "save_every", 0)
        for bi in range(pos["batch"], len(batches)):
            if self.world > 1 and len(batches[bi]) < self.world:  # every rank needs at least one example
                pos["batch"] = bi + 1
                continue
            self.step(batches[bi], epoch)
            pos["batch"] = bi + 1
            win = pos["epoch_stats"]
            bar.update(1)
            bar.set_postfix(  # no refresh of its own: the bar redraws at its interval (every 30 s in a log)
                refresh=False,
                loss=f"{win['loss'] / max(win['n'], 1):.3f}",
                **({"acc": f"{win['correct'] / max(win['n'], 1):.3f}"} if task.reports_accuracy else {}),
                **(  # tasks that count tokens (text); others (G2P words, images) show no tokens/s
                    {"tok_s": f"{(pos['tokens'] - tokens_before) / max(self._clock() - t_epoch, 1e-9):.0f}"}
                    if pos["tokens"]
                    else {}
                ),
            )
            last = bi + 1 == len(batches)
            if task.validate_every and (pos["step"] % task.validate_every == 0 or last):
                self.validate(epoch, bar)
                self.model.train()
                if not last:
                    self.publish()
            if save_every and pos["step"] % save_every == 0 and not last:
                self.save()
            if self.interrupted and self.main:
                self._stop_here(bar)
        bar.close()
        if not task.validate_every:
            seconds = self._clock() - t_epoch
            self.validate(
                epoch,
                bar,
                {
                    "epoch_seconds": seconds,
                    **(
                        {"tokens_per_second": (pos["tokens"] - tokens_before) / max(seconds, 1e-9)}
                        if pos["tokens"]
                        else {}
                    ),
                },
            )
        pos.update(epoch=epoch + 1, batch=0, epoch_stats=_zero_stats())
        pos["stopped"] = bool(task.patience and pos["bad_epochs"] >= task.patience)
        self.save()
        self.publish()

    def step(self, batch, epoch: int) -> None:
        """Forward, backward and update on this rank's share of ``batch``; statistics and the train event."""
        task, oc, pos = self.task, self.task.config.optim, self.position
        out = task.loss(self.model, batch, pos["step"], slice(self.rank, None, self.world))
        # DDP averages gradients over ranks: weight each rank's mean by its share, so the average is the global mean
        total = self._global_sum(out.count)
        (out.loss * (out.count * self.world / max(total, 1))).backward()
        if oc.clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), oc.clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(unwrap(self.model), pos["step"])
        pos["step"] += 1
        for acc in (pos["epoch_stats"], pos["window"]):
            for k in ("loss", "n", "correct"):
                acc[k] += out.stats.get(k, 0)
        pos["tokens"] += int(out.stats.get("tokens", 0))
        pos["seconds"] = self._clock()
        if pos["step"] % task.log_every == 0 or pos["step"] == self.total:
            self.log(
                {
                    "event": "train",
                    **self._epoch_field(epoch),
                    "step": pos["step"],
                    **self._stats(pos["window"]),
                    "lr": self.sched.get_last_lr()[0],
                    **self._throughput(),
                    "minutes": pos["seconds"] / 60,
                }
            )
            pos["window"] = _zero_stats()

    def validate(self, epoch: int, bar, timing: dict | None = None) -> None:
        """Validate (the EMA weights when averaging), keep the best model, log the eval event."""
        task, pos = self.task, self.position
        scored = unwrap(self.model)
        if self.ema is not None:
            self.ema.copy_to(self.eval_model)
            scored = self.eval_model
        val = task.validate(scored) if self.main or not task.validate_every else None
        if val is None:  # step-wise validation runs on rank 0 only
            return
        improved = val["score"] > pos["best_score"]
        if improved:
            pos["best_score"], pos["best_epoch"], pos["bad_epochs"] = val["score"], epoch + 1, 0
            if self.main and task.keep_best:
                fmt = task.model_format or f"multihead.{type(scored).__name__}"
                save_checked(
                    self.folder.path / "model.safetensors",
                    model_tensors(scored),
                    {"format": fmt, "epoch": str(epoch + 1)},
                )
        else:
            pos["bad_epochs"] += 1
        train = {} if task.validate_every else {f"train_{k}": v for k, v in self._stats(pos["epoch_stats"]).items()}
        event = {
            "event": "eval",
            **self._epoch_field(epoch),
            "step": pos["step"],
            **train,
            **task.eval_fields(val),
            "minutes": pos["seconds"] / 60,
            **(timing or {}),
            "threads": torch.get_num_threads(),
            **({"best": improved} if task.keep_best else {}),
        }
        self.log(event)
        if self.main and task.config.run.progress:
            bar.write(task.epoch_message(epoch, event))

    # ------------------------------------------------------------------------------------------------------------
    def _epoch_field(self, epoch: int) -> dict:
        return {} if self.task.validate_every else {"epoch": epoch + 1}

    def _stats(self, acc: dict) -> dict:
        out = {"loss": acc["loss"] / max(acc["n"], 1)}
        if self.task.reports_accuracy:
            out["accuracy"] = acc["correct"] / max(acc["n"], 1)
        return out

    def _throughput(self) -> dict:
        pos = self.position
        if not pos["tokens"]:
            return {}
        return {"tokens": pos["tokens"], "tokens_per_second": pos["tokens"] / max(pos["seconds"], 1e-9)}

    def _global_sum(self, n: int) -> int:
        if not self.dist.enabled:
            return n
        t = torch.tensor([n], dtype=torch.long)
        torch.distributed.all_reduce(t)
        return int(t.item())


__all__ = [
    "Loop",
    "RESUME_MAY_CHANGE",
    "RunExistsError",
    "Step",
    "Task",
    "param_groups",
    "recorded_config",
    "replicas_agree",
    "resume_conflicts",
    "run_folder",
    "run_task",
    "start_config",
    "unwrap",
    "warmup_schedule",
]
