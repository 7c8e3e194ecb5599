"""The source registry: what a source is, asked once, and one way to load it.

A *source* is anything a command takes as its model: a run folder of any task (``multihead train``, ``pretrain``,
``train-g2p``, ``train-vit``, ...), a short name (``minilm``, ``smollm2``, ``dinov2``, ``whisper``), a file (``.gguf``,
``.onnx``) or a folder (an HF model folder, a CTranslate2 folder); ``hf:FOLDER`` reads an HF folder with transformers
and attaches it even where multihead has a native family for it (to compare the two readings). :func:`kind` answers what it is -- a
:class:`SourceKind`: ``run`` (with the task that wrote it) or a foreign model's kind (``encoder``, ``lm``, ``vision``,
``speech``, with its family and format) -- and each kind lists the verbs it refuses with the reason, as the run
folders' task registry (:mod:`multihead.train.tasks`) does. :func:`load` returns a :class:`Loaded` bundle of one shape
for every kind. Commands ask :func:`kind` (or :func:`route`) instead of testing paths themselves.

Formats and families of foreign models plug in below this, in :mod:`multihead.pretrained`; tasks in
:mod:`multihead.train.tasks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

from ._config import ConfigError
from ._io import folder_kind

ATTACHED_PREFIX = "hf:"  # hf:FOLDER: read with transformers and attached, even where multihead has a native family
LM_READ = 512  # tokens a causal LM reads by default in show/heads (--max-len lifts it: rotary positions)

_ENCODER_ONLY = "it is an encoder, not a causal LM: generation and caches take smollm2, a .gguf file or an HF LM folder"
_TEXT_VERBS = (
    "explain",
    "generate",
    "sinks",
    "induction",
    "patch",
    "attribute",
    "circuit",
    "embed",
    "export",
    "evaluate",
    "predict",
    "prune",
)  # the verbs that read text: a model that does not refuses them all
# What each kind of foreign model refuses, and why (the verbs are those of multihead.train.tasks.VERBS and more).
REFUSES: dict[str, dict[str, str]] = {
    "encoder": {
        **{v: _ENCODER_ONLY for v in ("generate", "sinks", "induction", "patch", "attribute", "circuit")},
        "prune": "pruning with a recovery curve is for run folders; fine-tune it first (multihead train --init "
        "minilm), then importance and prune take the run",
        "importance": "head importance is measured on a task: fine-tune it first (multihead train --init minilm), "
        "then importance takes the run",
    },
    "lm": {
        "embed": "sentence embeddings take an encoder (minilm, an HF BERT folder, a classifier run)",
        "evaluate": "evaluate takes a classifier run; a causal LM is measured by `multihead sinks` (perplexity)",
        "predict": "predict takes a classifier run; continue text with `multihead generate`",
    },
    "vision": dict.fromkeys(
        _TEXT_VERBS, "it does not read text: DINOv2 looks at photographs (show/heads/importance --image)"
    ),
    "speech": dict.fromkeys(
        _TEXT_VERBS, "it does not read text as a prompt: Whisper transcribes audio (show/heads/importance, transcribe)"
    ),
}
REFUSES["attached"] = REFUSES["lm"]  # an HF causal LM read by transformers and attached: every verb of a causal LM
_ATTACHED_TEXT = ("show", "heads", "patch")  # what an HF encoder or sequence-to-sequence folder serves, and generate
REFUSES["attached-encoder"] = {
    **dict.fromkeys(
        (v for v in _TEXT_VERBS if v not in _ATTACHED_TEXT),
        "an HF encoder folder read attached is looked inside with show, heads and patch (a masked LM: the answer "
        "at its mask token); generation and caches take a causal LM, and fine-tuning, importance and pruning take "
        "the encoders multihead reads natively (minilm, HF BERT folders)",
    ),
    **dict.fromkeys(("importance", "kv"), "it is an encoder: show, heads and patch take it"),
}
REFUSES["attached-seq2seq"] = {
    **dict.fromkeys(
        (v for v in _TEXT_VERBS if v not in (*_ATTACHED_TEXT, "generate")),
        "an HF sequence-to-sequence folder is looked inside with show, heads and patch, and translates with "
        "generate; the causal-LM analyses (caches, circuits, pruning) take a decoder-only model",
    ),
    **dict.fromkeys(
        ("importance", "kv"), "it is a sequence-to-sequence model: show, heads, patch and generate take it"
    ),
}
REFUSES["attached-vision"] = {
    **dict.fromkeys(_TEXT_VERBS, "it does not read text: an HF vision folder is looked at with show --image"),
    **dict.fromkeys(
        ("heads", "importance", "kv"),
        "an HF vision folder read attached is looked at with show --image (every head's map of one image); the "
        "per-head studies over photographs take dinov2 and ViT runs",
    ),
}


@dataclass(frozen=True)
class SourceKind:
    """What a source is. ``name``: ``run``, ``encoder``, ``lm``, ``vision`` or ``speech``; ``task`` (runs): the
    :class:`~multihead.train.tasks.TaskKind` that wrote it; ``family``/``format`` (foreign models): how it is
    read; ``refuses``: verb -> why not."""

    source: str
    name: str
    path: Path | None
    task: object = None
    family: object = None
    format: str | None = None
    refuses: dict[str, str] = field(default_factory=dict)
    role: str | None = None  # an HF folder read attached: causal, encoder, seq2seq or vision (multihead.hf.folder)

    @property
    def route(self) -> str:
        """One key per way of handling a source: ``run:<task section>``, or the family's name (``dinov2``,
        ``whisper``, ``llama``, ``bert``...), so that a command picks its handler from one table."""
        if self.name == "run":
            return f"run:{self.task.section}" if self.task is not None else "run:train"
        if self.family is None:
            return "attached" if self.role in (None, "causal") else f"attached-{self.role}"
        return self.name if self.name in ("encoder", "lm") else self.family.name

    @property
    def title(self) -> str:
        if self.name == "run":
            return f"a {self.task.title} run" if self.task is not None else "a run folder"
        if self.family is None:
            from .hf.folder import ROLES

            return f"{ROLES[self.role or 'causal']} read by transformers and attached"
        return f"{self.family.title} ({self.format} format)"

    def check(self, verb: str) -> SourceKind:
        """``self`` when ``verb`` applies; otherwise a ConfigError with the reason."""
        if self.name == "run" and self.task is not None:
            self.task.check(verb, self.source)
        elif verb in self.refuses:
            raise ConfigError(f"`multihead {verb}` does not take {self.source} ({self.title}): {self.refuses[verb]}")
        return self


def is_run(path: str | Path) -> bool:
    """A run folder, even a damaged one (so that loading it gives the run folder's own messages)."""
    path = Path(str(path))
    return folder_kind(path) == "run" or (path / "labels.json").is_file()


def task_of(path: str | Path):
    """The :class:`~multihead.train.tasks.TaskKind` that wrote the run folder ``path`` (None: not a run folder)."""
    from .train import tasks

    return tasks.kind_of(path)


def kind(source: str | Path) -> SourceKind:
    """What ``source`` is (nothing but headers and config files is read). A source that is nothing we read is
    refused with what would be, and a near-miss short name with the name meant."""
    from . import pretrained
    from .train import tasks

    text = str(source)
    if text.startswith(ATTACHED_PREFIX):  # an HF folder read by transformers even where a native family exists
        return _attached_kind(text)
    task = tasks.kind_of(text)
    if task is not None or is_run(text):
        return SourceKind(text, "run", Path(text), task=task)
    found = pretrained.identify(text)
    if found is None:
        pretrained.names.resolve(text)  # the message for a path that is not there, with "did you mean"
        raise pretrained.SourceError(
            f"{text} is not a model multihead reads: pass a run folder, an HF model folder (config.json + "
            f"safetensors), a .gguf or .onnx file, a CTranslate2 folder, or one of {pretrained.names.listing()}"
        )
    if found.family is None and found.format.name == "hf" and found.path.is_dir():
        # no native family: attached, where transformers reads it as a causal LM
        return _attached(text, found.path, f"{found.path}: {found.why}; nor is it read attached")
    if found.family is None:
        raise pretrained.SourceError(f"{found.path}: {found.why}")
    family = found.family
    return SourceKind(
        text, family.kind, found.path, family=family, format=found.format.name, refuses=REFUSES.get(family.kind, {})
    )


def _attached_kind(text: str) -> SourceKind:
    from . import pretrained

    path = Path(text[len(ATTACHED_PREFIX) :])
    if not (path / "config.json").is_file():
        raise pretrained.SourceError(
            f"{text}: {ATTACHED_PREFIX}FOLDER reads an HF model folder with transformers, and {path} has no "
            "config.json; pass an HF folder (config.json + safetensors)"
        )
    return _attached(text, path, str(path))


_ROLE_KIND = {"causal": "lm", "encoder": "encoder", "seq2seq": "seq2seq", "vision": "vision"}


def _attached(text: str, path: Path, refused: str) -> SourceKind:
    """The kind of an HF folder read by transformers and attached, as what its config says it is (a causal LM, an
    encoder, a sequence-to-sequence or a vision model: :func:`multihead.hf.folder.role_of`); a SourceError
    ``refused: why`` where it is none that transformers reads."""
    from . import pretrained
    from .hf.folder import why_not_folder, role_of

    why = why_not_folder(path)
    if why is not None:
        raise pretrained.SourceError(f"{refused}: {why}")
    role = role_of(path)
    route = "attached" if role == "causal" else f"attached-{role}"
    return SourceKind(text, _ROLE_KIND[role], path, format="hf", refuses=REFUSES[route], role=role)


def route(source: str | Path, verb: str) -> str:
    """``kind(source).check(verb).route``: the one question a command asks about its source."""
    return kind(source).check(verb).route


@dataclass
class Loaded:
    """A model with what feeds it, one shape for every kind of source.

    ``kind``: ``run``, ``pretrained`` (an encoder), ``lm``, ``vision`` or ``speech``; ``tokenizer``: the text
    tokenizer (None for images and, for Whisper, inside ``detail``); ``max_len``: the most tokens it reads (a run's
    ``data.max_len``; a pretrained model's positions); ``sentence_max_len``: what sentence embeddings cut texts to
    (sentence-transformers' ``max_seq_length``, 256 for MiniLM; a run's ``data.max_len``); ``family``/``format``:
    how a foreign model was read; ``detail``: the bundle it came from (a train.Run, pretrained.Pretrained,
    PretrainedLM, Dinov2 or Whisper, with its preprocessing).
    """

    source: str
    kind: str
    model: nn.Module
    tokenizer: object
    max_len: int
    sentence_max_len: int
    detail: object
    family: str | None = None
    format: str | None = None


def load(
    source: str | Path,
    *,
    device: str = "cpu",
    backend: str = "auto",
    text: bool = False,
    progress: bool = False,
    dtype: str = "fp32",
) -> Loaded:
    """Any source, loaded for inference (eval mode): a run of any task, a text encoder, a causal LM, a vision or a
    speech model. A command refuses a source at its verb (:func:`route`); ``text=True`` is for callers that need a
    text model (a run of a task that does not read text, or a DINOv2/Whisper model, is then refused with the
    reason). ``progress``: a bar while a causal LM's weights are read. ``dtype``: ``bf16`` or ``int8`` stores a
    causal LM's linear weights in that format for decoding (:mod:`multihead.models.precision`; refused, with the
    reason, for a model the path cannot serve)."""
    from .models.precision import DTYPES

    if dtype not in DTYPES:  # before anything is read
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    loaded = _load(source, device=device, backend=backend, text=text, progress=progress)
    if dtype != "fp32":
        from .models.precision import convert

        convert(loaded.model, dtype)
    return loaded


def _load(source: str | Path, *, device: str, backend: str, text: bool, progress: bool) -> Loaded:
    k = kind(source)
    if k.name == "run":
        from .train import load_run

        if text and k.task is not None and k.task.section != "train":
            raise ConfigError(
                f"{source} is a {k.task.title} run; this reads text classifiers and pretrained "
                "encoders (run folders of `multihead train` on text, minilm, HF BERT folders)"
            )
        if k.task is not None and k.task.section != "train":
            run = k.task.load_run(str(source), device=device)
            return Loaded(str(source), "run", run.model, getattr(run, "tokenizer", None), 0, 0, run)
        run = load_run(source, device=device)
        return Loaded(
            str(source), "run", run.model, run.tokenizer, run.config.data.max_len, run.config.data.max_len, run
        )
    if k.family is None:  # an HF folder read attached: a causal LM, an encoder, a seq2seq or a vision model
        from .hf.folder import load_folder

        p = load_folder(k.path, backend=backend, device=device)
        if k.role == "causal":
            n = min(LM_READ, p.model.config.max_len)
            return Loaded(str(source), "lm", p.model, p.tokenizer, n, n, p, p.family, "hf")
        if text and k.role != "encoder":
            raise ConfigError(f"{source} is {k.title}; {REFUSES[k.route]['embed']}")
        return Loaded(str(source), k.route, p.model, p.tokenizer, p.max_len, p.max_len, p, p.family, "hf")
    if text and k.name in _NO_TEXT:
        raise ConfigError(f"{source} is {k.title}; {REFUSES[k.name]['embed']}")
    b = k.family.load(source, backend=backend, device=device, progress=progress)  # the family says how it is read
    tokenizer, n, sentence = _READS[k.name](b)
    return Loaded(
        str(source), _LOADED_KIND.get(k.name, k.name), b.model, tokenizer, n, sentence, b, k.family.name, k.format
    )


_NO_TEXT = ("vision", "speech")
# What each kind of foreign model's bundle reads, for :class:`Loaded`: (text tokenizer, most tokens, sentence length)
_READS = {
    "lm": lambda b: (b.tokenizer, LM_READ, LM_READ),
    "encoder": lambda b: (b.tokenizer, b.model.config.max_len, b.max_seq_length),
    "vision": lambda b: (None, 0, 0),
    "speech": lambda b: (b.tokenizer, b.model.config.max_target_positions, b.model.config.max_target_positions),
}
_LOADED_KIND = {"encoder": "pretrained"}  # the name Loaded has always given an encoder


_MOVED = {  # the verb x source table and its questions live with the commands now (their handlers are functions)
    "VERBS": "VERBS",
    "ROUTES": "ROUTES",
    "handler": "handler",
    "matrix": "matrix",
}


def __getattr__(name: str):
    if name in _MOVED:
        raise AttributeError(
            f"multihead.loading.{name} moved to multihead.cli.verbs.{_MOVED[name]}: the verb x source table names "
            "its handlers as functions of the command line, which the source registry below it does not import"
        )
    raise AttributeError(f"module 'multihead.loading' has no attribute {name!r}")


__all__ = [
    "ATTACHED_PREFIX",
    "LM_READ",
    "Loaded",
    "REFUSES",
    "SourceKind",
    "is_run",
    "kind",
    "load",
    "route",
    "task_of",
]
