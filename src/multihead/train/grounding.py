"""Text-image grounding: train and measure a :class:`~multihead.models.grounding.GroundedQA` on 2x2 canvases.

``multihead train --data fashion_mnist_qa --out runs/qa`` (or ``digits_qa``) lands here. Canvases and questions are
described in :mod:`multihead.data.grounding`: training canvases are drawn fresh every step from the training images
(seeded by step), validation canvases from the validation images and the held-out test canvases from the test
images (fixed seeds), so no test item is ever seen in training. The run folder is the image classifier's
(:mod:`multihead.train.vision`, same loop, checkpoint and resume), with::

    RUN/config.json        {"grounding": GroundingTrainConfig}
    RUN/labels.json        the answers' names (the four quadrants, then the classes)
    RUN/results.json       accuracy (all, where, what), the same with every cross-attention head masked, chance,
                           and the grounding share per cross-attention layer and head (best head, head mean)
    RUN/grounding.png      the share per layer and head against chance

The grounding share is what the question's cross-attention puts on the quadrant the question is about (where the
asked-for item is, or the place asked about), averaged over the question's tokens and the test canvases; chance
(uniform over the patches) is 0.25.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .._config import ConfigError, check_rules, flatten, from_fields, unflatten
from ..data import grounding as G
from ..data import images as I
from ..data.splits import Splits
from ..models.grounding import GroundedQA, GroundingConfig, grounding_share
from ..modules.capture import attention_modules, capture
from .checkpoint import load_task_weights, read_task_config
from .runfolder import atomic_write_json, is_task_run, read_json
from .harness import run_task
from .vision import VisionOptim, VisionRun, VisionTask, merge_overrides, optim_rules, plot_curves

QA_DATASETS = {"fashion_mnist_qa": "fashion_mnist", "digits_qa": "digits"}  # --data name -> the images it is built of
_SIZES = {
    "fashion_mnist": (7, 50_000, 2_000, 10_000),
    "digits": (4, 20_000, 1_000, 2_000),
}  # patch, canvases/epoch, val, test


def is_qa_dataset(name: str) -> bool:
    return name in QA_DATASETS


@dataclass
class GroundingData:
    name: str = "fashion_mnist_qa"  # fashion_mnist_qa | digits_qa
    path: str | None = None  # Fashion-MNIST's folder (see multihead.data.images)
    split_seed: int = 0
    canvases: int | None = None  # training canvases per epoch (default 50,000; digits 20,000)
    validation: int | None = None  # validation canvases (default 2,000; digits 1,000)
    test: int | None = None  # held-out test canvases (default 10,000; digits 2,000)
    limit: int | None = None  # at most N training images, seeded, stratified by class (quick runs)
    eval_limit: int | None = None  # at most N images of validation and of test (None: all of them)


def _default_optim() -> VisionOptim:
    return VisionOptim(epochs=20, batch_size=128, lr=2e-3, label_smoothing=0.0)


@dataclass
class GroundingTrainConfig:
    data: GroundingData = field(default_factory=GroundingData)
    model: GroundingConfig = field(default_factory=GroundingConfig)
    optim: VisionOptim = field(default_factory=_default_optim)
    run: VisionRun = field(default_factory=lambda: VisionRun(baseline=False))

    def __post_init__(self) -> None:
        d = self.data
        check_rules(
            [
                ("data.name", is_qa_dataset(d.name), f"one of {', '.join(QA_DATASETS)}"),
                ("data.canvases", d.canvases is None or 1 <= d.canvases <= 10_000_000, "in [1, 10000000]"),
                ("data.validation", d.validation is None or 1 <= d.validation <= 1_000_000, "in [1, 1000000]"),
                ("data.test", d.test is None or 1 <= d.test <= 1_000_000, "in [1, 1000000]"),
                ("data.limit", d.limit is None or d.limit >= 8, ">= 8"),
                ("data.eval_limit", d.eval_limit is None or d.eval_limit >= 8, ">= 8"),
                *optim_rules(self.optim),
            ]
        )

    @property
    def images(self) -> str:
        return QA_DATASETS[self.data.name]

    def sizes(self) -> tuple[int, int, int]:
        """(training canvases per epoch, validation canvases, test canvases)."""
        _, n, v, t = _SIZES[self.images]
        d = self.data
        return d.canvases or n, d.validation or v, d.test or t

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GroundingTrainConfig:
        return from_fields(cls, d)


def config_from_overrides(over: dict) -> GroundingTrainConfig:
    """A grounding config from ``multihead train``'s overrides. The shared model flags (``--d-model``, ``--heads``,
    ``--layers``...) set the question stack; the image encoder is set with ``--set model.vision.encoder.X=``."""
    flat = flatten(over)
    for k in [k for k in flat if k.startswith("model.encoder.")]:  # the shared flags name the text stack here
        flat["model.text." + k[len("model.encoder.") :]] = flat.pop(k)
    merged = merge_overrides(flat, GroundingTrainConfig(), "the grounding task")
    images = QA_DATASETS.get(merged["data.name"])
    if images:  # the canvas is two images a side; the default patch keeps 4x4 patches per item
        c, h, _ = I.IMAGE_SHAPES[images]
        merged["model.vision.channels"], merged["model.vision.image_size"] = c, 2 * h
        if "model.vision.patch_size" not in flat:
            merged["model.vision.patch_size"] = _SIZES[images][0]
    return GroundingTrainConfig.from_dict(unflatten(merged))


def _prepare(config: GroundingTrainConfig) -> Splits:
    splits = I.load_images(config.images, path=config.data.path, seed=config.data.split_seed)
    return splits.limit(config.data.limit, config.data.split_seed, eval_keep=config.data.eval_limit)


@dataclass
class HeldOut:
    """Fixed canvases over one split: specs, pixels (uint8), question ids and answers."""

    specs: G.Canvases
    canvases: torch.Tensor
    questions: torch.Tensor
    answers: torch.Tensor


def held_out(split: tuple[torch.Tensor, torch.Tensor], n: int, seed: int, vocab: G.QuestionVocab) -> HeldOut:
    images, labels = split
    specs = G.draw_canvases(labels, n, torch.Generator().manual_seed(seed), num_classes=len(vocab.class_names))
    q, a = vocab.batch(specs, labels)
    return HeldOut(specs, G.render(images, specs.items), q, a)


@torch.no_grad()
def answer(
    model: GroundedQA,
    canvases: torch.Tensor,
    questions: torch.Tensor,
    *,
    batch_size: int = 256,
    cross_head_mask=None,
    patterns: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Answer probabilities ``(N, answers)`` for uint8 canvases; with ``patterns``, also each cross-attention layer's
    weights ``(N, H, T, patches)``."""
    model.eval()
    probs, pats = [], []
    layers = [i for i, (n, _) in enumerate(attention_modules(model)) if ".cross_attn" in n]
    for i in range(0, len(canvases), batch_size):
        x, q = I.to_float(canvases[i : i + batch_size]), questions[i : i + batch_size]
        if patterns:
            with capture(model, ("pattern",), layers=layers) as cache:
                out = model(x, q, cross_head_mask=cross_head_mask)
            pats.append([cache.pattern(j) for j in layers])
        else:
            out = model(x, q, cross_head_mask=cross_head_mask)
        probs.append(torch.softmax(out.float(), -1))
    merged = [torch.cat([p[j] for p in pats]) for j in range(len(layers))] if patterns else None
    return torch.cat(probs), merged


def score(model: GroundedQA, data: HeldOut, *, cross_head_mask=None, patterns: bool = False) -> dict:
    """Accuracy overall and per question kind, loss; with ``patterns`` the grounding share per layer and head."""
    probs, pats = answer(model, data.canvases, data.questions, cross_head_mask=cross_head_mask, patterns=patterns)
    right = probs.argmax(-1) == data.answers
    out = {
        "accuracy": right.float().mean().item(),
        "n": len(right),
        "loss": F.nll_loss(probs.clamp_min(1e-12).log(), data.answers).item(),
    }
    for k, kind in enumerate(G.KINDS):
        sel = data.specs.kind == k
        out[kind] = right[sel].float().mean().item() if sel.any() else float("nan")
    if patterns:
        share = grounding_share(pats, data.questions, data.specs.quadrant, model.config.vision)  # (layers, H)
        out["grounding_share"] = share.tolist()
        out["grounding_best"] = {
            "share": share.max().item(),
            "layer": int(share.max(1).values.argmax()),
            "head": int(share.flatten().argmax() % share.shape[1]),
        }
        out["grounding_mean"] = share.mean().item()
        out["grounding_by_kind"] = {
            kind: grounding_share(
                [p[data.specs.kind == k] for p in pats],
                data.questions[data.specs.kind == k],
                data.specs.quadrant[data.specs.kind == k],
                model.config.vision,
            ).tolist()
            for k, kind in enumerate(G.KINDS)
            if (data.specs.kind == k).any()
        }
    return out


def masked_cross(model: GroundedQA) -> torch.Tensor:
    """A ``cross_head_mask`` of zeros: every cross-attention head of every layer off."""
    return torch.zeros(len(model.text.layers), max(model.cross_heads))


# ---------------------------------------------------------------------------------------------------- training
def train_grounding(
    config: GroundingTrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    given: dict | None = None,
) -> dict:
    return run_task(GroundingTask, config, out, resume=resume, overwrite=overwrite, given=given)


class GroundingTask(VisionTask):
    """The image classifier's task (:class:`multihead.train.vision.VisionTask`) on canvases and questions."""

    section = "grounding"
    config_from_overrides = staticmethod(config_from_overrides)

    def prepare(self) -> Splits:
        return _prepare(self.config)

    def build_model(self) -> nn.Module:
        cfg = self.config
        self.vocab = G.QuestionVocab(self.splits.label_names)
        cfg.model.vocab_size, cfg.model.num_answers = len(self.vocab), len(self.vocab.answers)
        cfg.model.max_question = self.vocab.max_len
        c, h, _ = self.splits.train.image_shape
        if (c, 2 * h) != (cfg.model.vision.channels, cfg.model.vision.image_size):
            raise ConfigError(
                f"the canvases are {c}x{2 * h}x{2 * h}; model.vision has channels "
                f"{cfg.model.vision.channels}, image_size {cfg.model.vision.image_size}"
            )
        n, v, t = cfg.sizes()
        self.n_train = n
        seed = cfg.run.seed
        self.val = held_out(self.splits.validation, v, 1_000_003 * seed + 1, self.vocab)
        self.test = held_out(self.splits.test, t, 1_000_003 * seed + 2, self.vocab)
        return GroundedQA(cfg.model)

    def label_names(self) -> list[str]:
        return self.vocab.answers

    def train_size(self) -> int:
        return self.n_train

    def train_batch(self, idx: torch.Tensor, g: torch.Generator) -> tuple[tuple, torch.Tensor]:
        images, labels = self.splits.train
        specs = G.draw_canvases(labels, len(idx), g, num_classes=len(self.vocab.class_names))
        q, a = self.vocab.batch(specs, labels)
        return (I.to_float(G.render(images, specs.items)), q), a

    def validate(self, model: nn.Module) -> dict:
        val = score(model, self.val)
        return {"score": val["accuracy"], "loss": val["loss"], "accuracy": val["accuracy"]}

    def finish(self, path: Path, done: dict) -> dict:
        cfg = self.config
        pos = {"best_epoch": done["best_epoch"], "minutes": done["seconds"] / 60}
        run = load_grounding_run(path)
        test = score(run.model, self.test, patterns=True)
        cut = score(run.model, self.test, cross_head_mask=masked_cross(run.model))
        results = {
            "task": "text-image grounding",
            "dataset": cfg.data.name,
            "best_epoch": pos["best_epoch"],
            "test": test,
            "cross_heads_masked": cut,
            "chance": {"where": 1 / 4, "what": 1 / len(self.vocab.class_names), "grounding_share": 0.25},
            "validation": score(run.model, self.val),
            "train_minutes": pos["minutes"],
            "threads": cfg.run.threads,
            "parameters": sum(p.numel() for p in run.model.parameters()),
            "canvases": {
                "train_per_epoch": self.n_train,
                "validation": len(self.val.answers),
                "test": len(self.test.answers),
                "patches": cfg.model.vision.num_patches,
            },
            "answers": self.vocab.answers,
        }
        atomic_write_json(path / "results.json", results)
        plot_curves(path)
        plot_share(test["grounding_share"], path / "grounding")
        if cfg.run.progress:
            print(
                f"test accuracy {test['accuracy']:.4f} (where {test['where']:.4f}, what {test['what']:.4f}; "
                f"{test['n']} canvases); cross-attention masked: {cut['accuracy']:.4f} (where {cut['where']:.4f}, "
                f"what {cut['what']:.4f}); grounding share best {test['grounding_best']['share']:.3f} (layer "
                f"{test['grounding_best']['layer']} head {test['grounding_best']['head']}), mean "
                f"{test['grounding_mean']:.3f} (chance 0.25); {pos['minutes']:.1f} min of training"
            )
        return results


def plot_share(share: list[list[float]], stem: Path) -> list[Path]:
    from ..plotting import pyplot, save

    plt = pyplot()
    t = torch.tensor(share)
    fig, ax = plt.subplots(figsize=(1.1 * t.shape[1] + 2, 0.8 * t.shape[0] + 1.6))
    im = ax.imshow(t.numpy(), cmap="viridis", vmin=0, vmax=1)
    for (i, j), v in zip([(i, j) for i in range(t.shape[0]) for j in range(t.shape[1])], t.flatten().tolist()):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=9)
    ax.set_xticks(range(t.shape[1]), [f"head {h}" for h in range(t.shape[1])])
    ax.set_yticks(range(t.shape[0]), [f"layer {l}" for l in range(t.shape[0])])
    ax.set_title("cross-attention on the asked quadrant (chance 0.25)")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    files = save(fig, stem)
    plt.close(fig)
    return files


# ---------------------------------------------------------------------------------------------------- loading
@dataclass
class GroundingRunFolder:
    path: Path
    config: GroundingTrainConfig
    answers: list[str]
    model: GroundedQA

    @property
    def vocab(self) -> G.QuestionVocab:
        return G.QuestionVocab(self.answers[len(G.QUADRANTS) :])


def is_grounding_run(path: str | Path) -> bool:
    return is_task_run(path, "grounding")


def load_grounding_run(path: str | Path, device: str = "cpu") -> GroundingRunFolder:
    path = Path(path)
    config = read_task_config(path, "grounding", GroundingTrainConfig)
    answers = read_json(path / "labels.json", list)
    return GroundingRunFolder(path, config, answers, load_task_weights(path, config, GroundedQA).to(device))


def test_canvases(run: GroundingRunFolder) -> HeldOut:
    """The run's held-out test canvases (the same seeds as at training)."""
    cfg = run.config
    return held_out(_prepare(cfg).test, cfg.sizes()[2], 1_000_003 * cfg.run.seed + 2, run.vocab)


def evaluate_run(run: GroundingRunFolder) -> dict:
    """Accuracy and loss on the run's held-out test canvases, overall and per question kind."""
    r = score(run.model, test_canvases(run))
    return {
        "dataset": run.config.data.name,
        "split": "test",
        "accuracy": r["accuracy"],
        "loss": r["loss"],
        "n": r["n"],
        "by_kind": {k: r[k] for k in G.KINDS},
    }


__all__ = [
    "GroundingTrainConfig",
    "QA_DATASETS",
    "answer",
    "config_from_overrides",
    "evaluate_run",
    "held_out",
    "is_grounding_run",
    "is_qa_dataset",
    "load_grounding_run",
    "masked_cross",
    "score",
    "test_canvases",
    "train_grounding",
]
