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


# What each verb does with each kind of source (the other half of REFUSES): route -> its handler, named as
# "module:function" in multihead.cli and imported when called (multihead.cli.args.dispatch). "run:*": every run
# folder the verb does not name; "*": every source it does not name. Either way REFUSES and the run's task refuse
# first. A route a verb does not serve is refused
# with REFUSES' reason, or with the kinds the verb takes. ``matrix()`` writes the verb x kind table out.
_LM = ("lm", "attached")
VERBS: dict[str, dict[str, str]] = {
    "show": {
        "dinov2": "inspect:show_dinov2",
        "whisper": "inspect:show_whisper",
        "run:vision": "inspect:show_vision",
        "run:grounding": "inspect:show_grounding",
        "run:g2p": "inspect:show_g2p",
        "attached-seq2seq": "inspect:show_seq2seq",
        "attached-vision": "inspect:show_attached_vision",
        "*": "inspect:show_text",
    },
    "heads": {
        "lm": "lm:heads_lm",
        "attached": "inspect:heads_text",
        "dinov2": "inspect:heads_dinov2",
        "whisper": "speech:heads_whisper",
        "run:pretrain": "inspect:heads_causal",
        "attached-seq2seq": "inspect:heads_seq2seq",
        "*": "inspect:heads_text",
    },
    "heads --kv": dict.fromkeys(_LM, "lm:heads_lm"),
    "importance": {
        **dict.fromkeys(_LM, "lm:importance_lm"),
        "dinov2": "inspect:importance_media",
        "whisper": "inspect:importance_media",
        "run:*": "inspect:importance_run",
    },
    "prune": {**dict.fromkeys(_LM, "lm:prune_lm"), "run:*": "inspect:prune_run"},
    "explain": {"*": "inspect:explain_text"},
    "generate": {
        **dict.fromkeys(_LM, "lm:generate_lm"),
        "run:pretrain": "lm:generate_run",
        "attached-seq2seq": "lm:generate_seq2seq",
    },
    "sinks": {**dict.fromkeys(_LM, "lm:sinks_lm"), "run:pretrain": "lm:sinks_run"},
    "induction": dict.fromkeys(_LM, "lm:induction_lm"),
    "kv": dict.fromkeys(_LM, "lm:kv_lm"),
    "patch": {
        **dict.fromkeys(_LM, "interventions:patch"),
        "run:pretrain": "interventions:patch",
        **dict.fromkeys(("attached-encoder", "attached-seq2seq"), "interventions:patch_attached"),
    },
    "attribute": {**dict.fromkeys(_LM, "interventions:attribute"), "run:pretrain": "interventions:attribute"},
    "circuit": dict.fromkeys(_LM, "interventions:circuit"),
    "embed": {"encoder": "runs:embed", "run:train": "runs:embed"},
    "export": {
        "lm": "lm:export_lm",
        "attached": "lm:export_attached",
        "encoder": "runs:export_encoder",
        "run:train": "runs:export_encoder",
    },
    "evaluate": {
        "run:train": "runs:evaluate_text",
        "run:g2p": "runs:evaluate_g2p",
        "run:vision": "runs:evaluate_vision",
        "run:grounding": "runs:evaluate_grounding",
        "run:pretrain": "runs:evaluate_lm",
    },
    "predict": {"run:train": "runs:predict_text", "run:g2p": "runs:predict_g2p", "run:vision": "runs:predict_vision"},
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


def _served(verb: str, route: str) -> str | None:
    """The handler of ``verb`` for ``route`` (``run:*``: a run folder of no known task, a damaged one)."""
    table = VERBS[verb]
    if route in table:
        return table[route]
    if route.startswith("run:") and "run:*" in table:
        return table["run:*"]
    return table.get("*") or (_run_handler(verb) if route == "run:*" else None)


def _run_handler(verb: str) -> str | None:
    """The first run handler of ``verb`` (what a damaged run folder is given, so that its loader speaks)."""
    return next((h for r, h in VERBS[verb].items() if r.startswith("run:")), None)


def _takes(verb: str) -> str:
    """The sources ``verb`` serves, in words."""
    from .train import tasks

    def words(r: str) -> str:
        if r == "run:*":
            return "run folders"
        if r.startswith("run:"):
            return f"{tasks.KINDS[r[4:]].title} runs"
        return {
            "lm": "pretrained LMs",
            "attached": "HF LM folders",
            "encoder": "text encoders",
            "attached-encoder": "HF encoder folders",
            "attached-seq2seq": "HF sequence-to-sequence folders",
            "attached-vision": "HF vision folders",
        }.get(r, r)

    named = list(dict.fromkeys(words(r) for r in VERBS[verb] if r != "*"))
    return ", ".join(named) if named else "text models"


def handler(verb: str, source: str | Path) -> str:
    """The handler (``"module:function"`` in :mod:`multihead.cli`) that serves ``verb`` for ``source``; a
    ConfigError with the reason when none does. ``verb``: a key of :data:`VERBS` (``"heads --kv"`` is ``heads``
    with its flag). A folder that is nothing multihead reads goes to the verb's run handler where it has one, so
    that a damaged run folder gets the run loader's message."""
    from . import pretrained

    base = verb.split(" ")[0]
    try:
        k = kind(source)
    except pretrained.SourceError:
        fallback = _run_fallback(verb, source)
        if fallback is None:
            raise
        return fallback
    k.check(base)
    route = k.route if k.name != "run" or k.task is not None else "run:*"  # a damaged run: the run handler
    served = _served(verb, route)
    if served is None:
        flag = f"; without {verb.split(' ', 1)[1]}, `multihead {base}` takes it" if " " in verb else ""
        raise ConfigError(f"`multihead {verb}` does not take {source} ({k.title}); it takes {_takes(verb)}{flag}")
    return served


def _run_fallback(verb: str, source: str | Path) -> str | None:
    """The run handler for a source :func:`kind` does not know, when it may be a damaged run folder or a folder
    meant as one (so that its message names what a run folder needs); None: the registry's message stands."""
    from . import pretrained

    run_handler = _run_handler(verb)
    path = Path(str(source))
    if run_handler is None or pretrained.names.short_name(str(source)) is not None:
        return None
    if not any(r in _LM or r == "*" for r in VERBS[verb]):  # a verb of run folders only: the task registry
        from .train import tasks  # names what a run folder needs, or the damaged run's task

        task = tasks.require(source, verb.split(" ")[0])
        return _served(verb, f"run:{task.section}") or run_handler
    if path.is_file() or (path / "config.json").exists():  # a model file or folder it cannot read: its reason
        return None
    if "*" in VERBS[verb]:
        return None  # a verb of every kind of source: the registry's message names them all
    if not path.exists():
        if "/" in str(source):
            raise pretrained.SourceError(
                f"{source} does not exist; pass a pretrained LM (smollm2, a .gguf file, an HF model folder) or a "
                "pretraining run folder"
            )
        return None  # a short name, perhaps misspelt: the registry says "did you mean"
    raise pretrained.SourceError(
        f"{source} is not an HF model folder (no config.json) and not a pretraining run folder; pass a pretrained "
        "LM (smollm2, a .gguf file, an HF model folder with config.json and safetensors) or a pretraining run "
        "(multihead pretrain --objective clm --out RUN)"
    )


_KIND_OF_ROUTE = {"dinov2": "vision", "whisper": "speech"}  # a family's route -> its kind in REFUSES
ROUTES = (
    *("run:train", "run:pretrain", "run:g2p", "run:vision", "run:grounding"),
    *("encoder", "lm", "attached", "attached-encoder", "attached-seq2seq", "attached-vision", "dinov2", "whisper"),
)


def matrix() -> dict[str, dict[str, str]]:
    """Every verb x every kind of source: the handler that serves it, or ``refused: <reason>``. Generated from
    :data:`VERBS`, :data:`REFUSES` and the task registry, so it cannot disagree with what the commands do."""
    from .train import tasks

    out: dict[str, dict[str, str]] = {}
    for verb in VERBS:
        base = verb.split(" ")[0]
        row = {}
        for r in ROUTES:
            if r.startswith("run:"):
                why = tasks.KINDS[r[4:]].refuses.get(base)
            else:
                why = REFUSES[_KIND_OF_ROUTE.get(r, r)].get(base)
            served = _served(verb, r)
            row[r] = f"refused: {why}" if why else served or f"refused: it takes {_takes(verb)}"
        out[verb] = row
    return out


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
    source: str | Path, *, device: str = "cpu", backend: str = "auto", text: bool = False, progress: bool = False
) -> Loaded:
    """Any source, loaded for inference (eval mode): a run of any task, a text encoder, a causal LM, a vision or a
    speech model. A command refuses a source at its verb (:func:`route`); ``text=True`` is for callers that need a
    text model (a run of a task that does not read text, or a DINOv2/Whisper model, is then refused with the
    reason). ``progress``: a bar while a causal LM's weights are read."""
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
