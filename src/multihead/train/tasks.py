"""The task registry: what a run folder is, and what each command does with it, asked in one place.

A run folder says what it is in its ``config.json``: one section named for the task that wrote it (``train`` for
text classification, ``pretrain``, ``g2p``, ``vision``, ``grounding``). :func:`kind_of` reads that once and returns
the task's :class:`TaskKind`; every command (``train --resume``, ``evaluate``, ``predict``, ``show``, ``heads``,
``importance``, ``prune``, ``generate``, :func:`multihead.loading.load`) asks it instead of testing folders one task
at a time. A task that a command does not apply to answers with the reason and the command that does
(:meth:`TaskKind.check`).

A new task plugs in here: a :class:`~multihead.train.harness.Task` subclass in its own module, and one
``TaskKind`` entry in :data:`KINDS` (its section, the data it trains on, its loader, and the verbs it refuses).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from .._config import ConfigError
from .._io import read_json_file

VERBS = (
    "evaluate",
    "predict",
    "show",
    "explain",
    "heads",
    "importance",
    "prune",
    "generate",
    "sinks",
    "embed",
    "export",
)


@dataclass(frozen=True)
class TaskKind:
    """One registered task. ``module`` holds its ``task`` class (a harness Task), its ``train`` function and its
    ``load`` function (a run folder -> an object with ``.model`` and ``.config``); ``refuses`` maps the verbs that do
    not apply to the reason, naming the verb that does."""

    section: str
    title: str
    module: str
    task: str
    train: str
    load: str
    trains_on: Callable[[str], bool]
    refuses: dict[str, str] = field(default_factory=dict)

    def _module(self):
        return importlib.import_module(self.module)

    def task_class(self):
        return getattr(self._module(), self.task)

    def config_from_overrides(self, over: dict):
        return self.task_class().config_from_overrides(over)

    def run(self, config, out, **kwargs) -> dict:
        """Train ``config`` into the run folder ``out`` (``resume``, ``overwrite``, ``given`` as the harness)."""
        return getattr(self._module(), self.train)(config, out, **kwargs)

    def load_run(self, path, device: str = "cpu"):
        return getattr(self._module(), self.load)(path, device=device)

    def check(self, verb: str, path) -> TaskKind:
        """``self``, when ``verb`` applies to this task's runs; otherwise a ConfigError with the reason and the verb
        that does."""
        if verb in self.refuses:
            raise ConfigError(f"{verb} does not apply to {path}, a {self.title} run: {self.refuses[verb]}")
        return self


def _text_data(name: str) -> bool:
    return True  # the fallback: any other --data is a text dataset (a built-in name or a file)


def _g2p_data(name: str) -> bool:
    return name == "cmudict"


def _image_data(name: str) -> bool:
    from ..data.images import is_image_dataset

    return is_image_dataset(name)


def _qa_data(name: str) -> bool:
    from .grounding import is_qa_dataset

    return is_qa_dataset(name)


def _never(name: str) -> bool:
    return False


_NOT_LM = "it is not a causal language model; pretrain one with: multihead pretrain --objective clm --out RUN"
_NO_TEXT = (
    "heads reads text: a text classifier, a pretrained encoder or a language model; look at this run's "
    "attention with: multihead show RUN"
)
_NO_TEXT_IMAGES = _NO_TEXT.replace("RUN", "RUN --index N")
_NO_EXPORT = "export writes text encoders as HF folders; the run's weights are RUN/model.safetensors"
_NO_EXPLAIN = (
    "explain walks one text through a text model's self-attention (a classifier run, minilm, a language model); "
    "look at this run's attention with: multihead show RUN"
)

# Order matters for --data: the first kind whose trains_on accepts the name trains on it (text last: the fallback).
KINDS: dict[str, TaskKind] = {
    k.section: k
    for k in (
        TaskKind(
            "g2p",
            "grapheme-to-phoneme",
            "multihead.train.g2p",
            "G2PTask",
            "train_g2p",
            "load_g2p_run",
            _g2p_data,
            {
                "heads": _NO_TEXT,
                "importance": _NO_TEXT,
                "prune": _NO_TEXT,
                "generate": _NOT_LM,
                "sinks": _NOT_LM,
                "embed": "embed reads text classifiers and encoders; transcribe words with: multihead predict RUN WORD",
                "explain": _NO_EXPLAIN,
                "export": _NO_EXPORT,
            },
        ),
        TaskKind(
            "vision",
            "image classification",
            "multihead.train.vision",
            "VisionTask",
            "train_vision",
            "load_vision_run",
            _image_data,
            {
                "heads": _NO_TEXT_IMAGES,
                "generate": _NOT_LM,
                "sinks": _NOT_LM,
                "embed": "embed reads text; classify images with: multihead predict RUN --index N",
                "explain": _NO_EXPLAIN,
                "export": _NO_EXPORT,
            },
        ),
        TaskKind(
            "grounding",
            "text-image grounding",
            "multihead.train.grounding",
            "GroundingTask",
            "train_grounding",
            "load_grounding_run",
            _qa_data,
            {
                "predict": "its questions are about canvases of the test split: ask one with "
                'multihead show RUN --index N --question "where is the bag?"',
                "heads": _NO_TEXT_IMAGES,
                "importance": _NO_TEXT_IMAGES,
                "prune": _NO_TEXT_IMAGES,
                "generate": _NOT_LM,
                "sinks": _NOT_LM,
                "embed": 'embed reads text; ask a question with: multihead show RUN --index N --question "..."',
                "explain": _NO_EXPLAIN,
                "export": _NO_EXPORT,
            },
        ),
        TaskKind(
            "pretrain",
            "pretraining",
            "multihead.train.pretrain",
            "PretrainTask",
            "pretrain",
            "load_pretrain_run",
            _never,
            {
                "predict": "a pretrained language model has no classes; continue a prompt with: multihead generate "
                'RUN "text" (causal LM), or fine-tune the encoder with: multihead train --init RUN '
                "(masked LM)",
                "show": "show reads text classifiers and encoders; for a masked LM show its encoder: multihead show "
                'RUN/encoder "text" --out FOLDER; for a causal LM: multihead heads RUN',
                "explain": "explain reads text classifiers, encoders and pretrained LMs; for a masked LM explain its "
                'encoder: multihead explain "text" --model RUN/encoder',
                "importance": "importance scores a classifier's heads; for a language model: multihead heads RUN",
                "prune": "prune needs a classifier's score; fine-tune the encoder first: multihead train --init RUN",
                "embed": "embed reads sentence encoders; a masked LM's encoder is RUN/encoder: multihead embed "
                'RUN/encoder "text"',
                "export": "the masked LM's encoder is already an HF folder: RUN/encoder",
            },
        ),
        TaskKind(
            "train",
            "text classification",
            "multihead.train.trainer",
            "ClassifierTask",
            "train",
            "load_run",
            _text_data,
            {"generate": _NOT_LM, "sinks": _NOT_LM},
        ),
    )
}


def section_of(path: str | Path) -> str | None:
    """The task section of ``path``'s ``config.json`` (None for anything that is not a readable run folder)."""
    try:
        cfg = read_json_file(Path(path) / "config.json")
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    return next((s for s in KINDS if isinstance(cfg.get(s), dict)), None)


def kind_of(path: str | Path) -> TaskKind | None:
    """The task that wrote the run folder ``path``, or None when it is not one (a pretrained name, an HF folder)."""
    section = section_of(path)
    return KINDS[section] if section else None


def require(path: str | Path, verb: str) -> TaskKind:
    """The task of run folder ``path``, checked to take ``verb``; a message names what ``path`` is otherwise."""
    kind = kind_of(path)
    p = Path(path)
    if kind is None and ((p / "config.json").is_file() or (p / "labels.json").is_file()):
        kind = KINDS["train"]  # a damaged run folder: its loader says what is wrong with it
    if kind is None:
        what = (
            "does not exist"
            if not p.exists()
            else "is not a folder"
            if not p.is_dir()
            else f"is not a multihead run folder (its config.json has none of the sections {', '.join(KINDS)})"
        )
        raise ConfigError(f"{path} {what}; pass the --out folder of a training run")
    return kind.check(verb, path)


def builtin_data() -> dict[str, list[str]]:
    """Every built-in dataset name, by the task that trains on it."""
    from ..data.datasets import BUILTIN
    from ..data.images import IMAGE_DATASETS
    from .grounding import QA_DATASETS

    return {
        "text classification": list(BUILTIN),
        "grapheme-to-phoneme": ["cmudict"],
        "image classification (ViT)": list(IMAGE_DATASETS),
        "text-image grounding": list(QA_DATASETS),
    }


def for_data(name: str) -> TaskKind:
    """The task that trains on ``--data name`` (text classification for any file no other task claims). A name that
    is neither a built-in dataset nor a file path (no suffix, nothing there) is refused with the closest built-in
    names and the full list, before it could be read as a path."""
    import difflib

    kind = next(k for k in KINDS.values() if k.trains_on(name))
    if kind.section == "train":
        builtins = builtin_data()
        names = [n for group in builtins.values() for n in group]
        if name not in names and not Path(name).suffix and not Path(name).exists():
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
            listing = "; ".join(f"{task}: {', '.join(ns)}" for task, ns in builtins.items())
            raise ConfigError(
                f"unknown dataset {name!r}"
                + (f"; did you mean {' or '.join(close)}?" if close else "")
                + f" Built-ins: {listing}; or give a .csv/.tsv/.jsonl file"
            )
    return kind


__all__ = ["KINDS", "TaskKind", "VERBS", "builtin_data", "for_data", "kind_of", "require", "section_of"]
