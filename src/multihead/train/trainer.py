"""Train a :class:`~multihead.TransformerClassifier` on a text dataset, read top to bottom.

``train(config, out)`` does: data -> fixed split -> tokenizer (train split only) -> model -> AdamW with warm-up and
linear decay -> epochs over length-bucketed batches (validation every epoch, best checkpoint, early stopping,
resumable checkpoints) -> test metrics, baseline, plots. It runs unchanged under ``torchrun`` (DDP).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import data as D
from ..models.classifier import ClassifierConfig, TransformerClassifier
from .._config import ConfigError
from .._proc import status_kib
from .config import TrainConfig, layered
from .harness import RunExistsError, Step, Task, run_task  # noqa: F401  (RunExistsError re-exported)
from .embed_init import init_embeddings, svd_embeddings  # noqa: F401  (re-exported)
from .evaluation import evaluate_ids, predict_ids  # noqa: F401  (re-exported)
from .metrics import plot_confusion, plot_curves
from .runfolder import atomic_write_bytes, atomic_write_json, load_checked, read_json


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
        raise ConfigError(
            f"invalid config: run.device {name!r} is not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"invalid config: run.device {name!r}: multihead trains on cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: CUDA is not available on this machine; use --device cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def prepare(config: TrainConfig, out: Path | None = None, *, resume: bool = False) -> Prepared:
    """Data, split and tokenizer; on resume the recorded split and tokenizer are reused."""
    dc = config.data
    dataset = D.load(dc.name, text_column=dc.text_column, label_column=dc.label_column)
    if resume and out is not None and (out / "splits.json").exists():
        splits = D.apply_split(dataset, read_json(out / "splits.json"))
    else:
        splits = D.split(dataset, seed=dc.split_seed, validation=dc.validation, test=dc.test)
    splits = splits.limit(dc.limit, dc.split_seed, eval_keep=dc.eval_limit)  # seeded, stratified by label
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
        enc = pretrained.encoder_config(hf, backend=config.model.encoder.attention.backend)
        enc.encoder.unpad = config.model.encoder.unpad
        if config.data.max_len > enc.max_len:
            raise ValueError(
                f"data.max_len={config.data.max_len} exceeds the pretrained model's "
                f"{enc.max_len} positions; pass --max-len {enc.max_len} or less"
            )
        mc = ClassifierConfig.from_dict(
            {**enc.to_dict(), "pooling": config.model.pooling, "num_classes": len(prepared.labels)}
        )
    else:
        mc = ClassifierConfig.from_dict(
            {
                **config.model.to_dict(),
                "vocab_size": prepared.tokenizer.get_vocab_size(),
                "num_classes": len(prepared.labels),
                "max_len": config.data.max_len,
                "pad_id": 0,
            }
        )
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
            print(
                f"note: {enc.truncated} of {len(enc.ids)} {name} texts were longer than max_len="
                f"{config.data.max_len} tokens and were truncated"
            )


def train(
    config: TrainConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False, given: dict | None = None
) -> dict:
    """Train, evaluate and save a run folder; returns the results dict (also written to ``results.json``)."""
    return run_task(
        ClassifierTask, config, out, resume=resume, overwrite=overwrite, given=given, device=_device(config)
    )


class ClassifierTask(Task):
    """Text classification on the run harness: length-bucketed batches, cross-entropy (word dropout optional), the
    validation accuracy (or loss) of the averaged weights as the score, early stopping; test metrics and the TF-IDF
    baseline at the end."""

    section = "train"
    config_from_overrides = staticmethod(layered)
    model_format = "multihead.TransformerClassifier"

    def __init__(self, config: TrainConfig, path: Path, resume: bool) -> None:
        super().__init__(config, path, resume)
        self.device = _device(config)
        config.data.name = D.canonical_name(config.data.name)  # a user file by absolute path: evaluate works anywhere
        oc = config.optim
        self.ema_decay, self.patience, self.compile = oc.ema_decay, oc.patience, config.run.compile
        torch.manual_seed(config.run.seed)
        self.prepared = prepare(config, path, resume=resume)
        self.model = _setup_model(config, self.prepared, self.device, resume)
        self.train_ids = self.prepared.encoded["train"].ids
        self.labels_train = self.prepared.splits.train.label_ids()
        self.lengths = [len(x) for x in self.train_ids]
        tok = self.prepared.tokenizer
        self.special_ids = torch.tensor(
            [i for i in (tok.token_to_id(t) for t in D.tokenizer.SPECIALS) if i is not None]
        )
        self.num_layers = len(self.model.encoder.layers)

    def lr_scale(self, name: str) -> float:
        return _lr_scale(name, self.num_layers, self.config.pretrained.layer_decay)

    def new_model(self) -> nn.Module:
        return TransformerClassifier.from_config(self.config.model)

    def write_start(self, path: Path) -> None:
        _write_run_files(path, self.config, self.prepared, False)

    def batches(self, epoch: int) -> list[list[int]]:
        return D.bucketed_batches(self.lengths, self.config.optim.batch_size, seed=self.config.run.seed, epoch=epoch)

    def loss(self, model: nn.Module, batch: list[int], step: int, part: slice) -> Step:
        oc = self.config.optim
        local = batch[part]
        x, mask = D.collate([self.train_ids[i] for i in local])
        y = torch.tensor([self.labels_train[i] for i in local])
        if oc.token_dropout > 0:  # word dropout: the model cannot lean on any single token
            drop = (torch.rand(x.shape) < oc.token_dropout) & mask & ~torch.isin(x, self.special_ids)
            x = x.masked_fill(drop, self.prepared.tokenizer.token_to_id(D.tokenizer.UNK))
        x, mask, y = x.to(self.device), mask.to(self.device), y.to(self.device)
        logits = model(x, mask)
        loss = F.cross_entropy(logits.float(), y, reduction="sum", label_smoothing=oc.label_smoothing)
        return Step(
            loss / len(local),
            len(local),
            {
                "loss": loss.item(),
                "n": len(local),
                "correct": int((logits.argmax(-1) == y).sum()),
                "tokens": int(mask.sum()) * part.step,
            },
        )  # this rank's real tokens, times the process count

    def validate(self, model: nn.Module) -> dict:
        p = self.prepared
        val = evaluate_ids(
            model, p.encoded["validation"].ids, p.splits.validation.label_ids(), len(p.labels), self.device
        )
        score = val["accuracy"] if self.config.optim.select == "accuracy" else -val["loss"]
        return {"score": score, "loss": val["loss"], "accuracy": val["accuracy"], "macro_f1": val["macro_f1"]}

    def epoch_message(self, epoch: int, event: dict) -> str:
        return (
            f"epoch {epoch + 1}: train loss {event['train_loss']:.4f} acc {event['train_accuracy']:.4f} | "
            f"val loss {event['val_loss']:.4f} acc {event['val_accuracy']:.4f}{' *' if event['best'] else ''} | "
            f"{event['minutes']:.1f} min"
        )

    @staticmethod
    def summary(results: dict) -> list[str]:
        t, b = results["test"], results["baseline_tfidf_logreg"]
        lines = [
            f"test accuracy {t['accuracy']:.4f}, macro-F1 {t['macro_f1']:.4f} (n={t['n']}, best epoch "
            f"{results['best_epoch']}, {results['train_seconds']:.0f}s on {results['threads']} threads)"
        ]
        if "test_accuracy" in b:
            lines.append(f"baseline TF-IDF + logistic regression on the same split: {b['test_accuracy']:.4f}")
        return lines

    def finish(self, path: Path, run: dict) -> dict:
        return finish(
            path,
            self.config,
            self.prepared,
            self.device,
            train_seconds=run["seconds"],
            stopped_early=run["stopped_early"],
        )


def finish(
    out: Path, config: TrainConfig, prepared: Prepared, device, *, train_seconds: float, stopped_early: bool
) -> dict:
    """Best weights -> test metrics, baseline, plots, results.json."""
    tensors, meta = load_checked(out / "model.safetensors")
    model = TransformerClassifier.from_config(config.model).to(device)
    model.load_state_dict(tensors)
    num_classes = len(prepared.labels)
    test = evaluate_ids(model, prepared.encoded["test"].ids, prepared.splits.test.label_ids(), num_classes, device)
    val = evaluate_ids(
        model, prepared.encoded["validation"].ids, prepared.splits.validation.label_ids(), num_classes, device
    )
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
    plot_confusion(
        test["confusion"],
        prepared.labels,
        out / "confusion.png",
        f"{config.data.name} test: accuracy {test['accuracy']:.3f}",
    )
    if (out / "metrics.jsonl").exists():
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    return results
