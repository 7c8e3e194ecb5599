"""What ``--resume`` needs: the weights' moving average (EMA) and the full training state (model, EMA, optimizer,
RNG, scheduler, position) saved as one digest-checked safetensors file plus ``state.json`` in ``RUN/checkpoint/``."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .._weights import unique_state
from .runfolder import atomic_write_bytes, atomic_write_json, load_checked, read_json, save_checked


class EMA:
    """Exponential moving average of the parameters: ``avg = d * avg + (1 - d) * param`` after each step, with
    ``d = min(decay, (1 + step) / (10 + step))`` so that short runs are not dominated by the initial weights (the
    warm-up of TensorFlow's ExponentialMovingAverage). Small data sets overfit within a few epochs; the average is a
    smoother, better-generalising model."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                self.shadow[k].mul_(decay).add_(v.float(), alpha=1 - decay)
            else:
                self.shadow[k].copy_(v)

    def copy_to(self, model: nn.Module) -> None:
        model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in self.shadow.items()})


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as saved: tied parameters once (:func:`multihead._weights.unique_state`)."""
    return unique_state(model)


def load_model_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Load what :func:`model_tensors` saved: every parameter present except tied copies, nothing unexpected."""
    from .runfolder import CheckpointError

    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = set(model.state_dict()) - set(model_tensors(model))
    if unexpected or set(missing) - tied:
        raise CheckpointError(
            f"the weights do not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )


def read_task_config(path: Path, section: str, config_cls):
    """``config.json[section]`` of a task's run folder, validated by ``config_cls`` (errors name the file)."""
    from .runfolder import CheckpointError

    try:
        return config_cls.from_dict(read_json(path / "config.json", dict)[section])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path / 'config.json'}: {exc}") from None


def load_task_weights(path: Path, config, build) -> nn.Module:
    """The best model of a run folder: the shapes ``build(config.model)`` implies checked against
    ``model.safetensors``'s header before anything is allocated, then the weights (digest-checked); eval mode."""
    from .runfolder import check_shapes, header_shapes, meta_shapes

    weights = path / "model.safetensors"
    check_shapes(meta_shapes(lambda: build(config.model)), header_shapes(weights), weights)
    tensors, _ = load_checked(weights)
    model = build(config.model)
    load_model_tensors(model, tensors)
    return model.eval()


def state_tensors(model, opt, ema: EMA | None = None) -> dict[str, torch.Tensor]:
    tensors = {f"model.{k}": v for k, v in model_tensors(model).items()}
    if ema is not None:
        tensors.update({f"ema.{k}": v for k, v in ema.shadow.items()})
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        st = opt.state.get(p, {})
        for key, val in st.items():
            tensors[f"optim.{i}.{key}"] = val if torch.is_tensor(val) else torch.tensor(val)
    tensors["rng.torch"] = torch.get_rng_state()
    return tensors


def restore_state(model, opt, tensors: dict[str, torch.Tensor], ema: EMA | None = None) -> None:
    load_model_tensors(model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    if ema is not None:
        ema.shadow = {k[4:]: v.clone() for k, v in tensors.items() if k.startswith("ema.")}
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        st = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"optim.{i}.")}
        if st:
            opt.state[p] = {k: v.to(p.device) if k != "step" else v for k, v in st.items()}
    torch.set_rng_state(tensors["rng.torch"])


def save_checkpoint(out: Path, model, opt, sched, position: dict, ema: EMA | None = None) -> None:
    ckpt = out / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    name = f"state-{position['step']:08d}.safetensors"
    save_checked(ckpt / name, state_tensors(model, opt, ema))
    atomic_write_json(ckpt / "state.json", {**position, "file": name, "scheduler": sched.state_dict()})
    for old in ckpt.glob("state-*.safetensors"):
        if old.name != name:
            old.unlink()


def restore_checkpoint(out: Path, model, opt, sched, ema: EMA | None = None) -> dict:
    """Load ``out/checkpoint`` into model, optimizer, RNG, EMA and schedule (the lr set from the schedule, which
    ``load_state_dict`` leaves stale); returns the saved ``state.json`` (the run's position)."""
    state = read_json(out / "checkpoint" / "state.json", dict)
    tensors, _ = load_checked(out / "checkpoint" / state["file"])
    restore_state(model, opt, tensors, ema)
    sched.load_state_dict(state["scheduler"])
    for group, lr in zip(opt.param_groups, sched.get_last_lr()):
        group["lr"] = lr
    return state


def keep_metrics(path: Path, lines: int) -> None:
    """Drop the events a killed run logged after its checkpoint: keep the first ``lines`` lines of ``path``."""
    if path.exists():
        kept = path.read_text().splitlines(keepends=True)[:lines]
        atomic_write_bytes(path, "".join(kept).encode())


__all__ = [
    "EMA",
    "keep_metrics",
    "load_task_weights",
    "read_task_config",
    "restore_checkpoint",
    "load_model_tensors",
    "model_tensors",
    "restore_state",
    "save_checkpoint",
    "state_tensors",
]
