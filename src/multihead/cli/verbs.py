"""The verb x source table: which function of the command line serves each verb for each kind of source
(:data:`VERBS`), and the one way a command reaches it (:func:`dispatch`). What a source is, and what each kind
refuses, is the source registry's (:mod:`multihead.loading`); a new verb or a new kind of source plugs in here.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

from .._config import ConfigError
from ..loading import REFUSES, kind
from . import findings, inspect, interventions, lm, runs, speech
from .args import Route

Handler = Callable[[Namespace], int]

# What each verb does with each kind of source (the other half of multihead.loading.REFUSES): route -> its handler,
# a function of the command line taking the parsed arguments. "run:*": every run
# folder the verb does not name; "*": every source it does not name. Either way REFUSES and the run's task refuse
# first. A route a verb does not serve is refused
# with REFUSES' reason, or with the kinds the verb takes. ``matrix()`` writes the verb x kind table out.
_LM = ("lm", "attached")
VERBS: dict[str, dict[str, Handler]] = {
    "show": {
        "dinov2": inspect.show_dinov2,
        "whisper": inspect.show_whisper,
        "run:vision": inspect.show_vision,
        "run:grounding": inspect.show_grounding,
        "run:g2p": inspect.show_g2p,
        "attached-seq2seq": inspect.show_seq2seq,
        "attached-vision": inspect.show_attached_vision,
        "*": inspect.show_text,
    },
    "heads": {
        "lm": lm.heads_lm,
        "attached": inspect.heads_text,
        "dinov2": inspect.heads_dinov2,
        "whisper": speech.heads_whisper,
        "run:pretrain": inspect.heads_causal,
        "attached-seq2seq": inspect.heads_seq2seq,
        "*": inspect.heads_text,
    },
    "heads --kv": dict.fromkeys(_LM, lm.heads_lm),
    "importance": {
        **dict.fromkeys(_LM, lm.importance_lm),
        "dinov2": inspect.importance_media,
        "whisper": inspect.importance_media,
        "run:*": inspect.importance_run,
    },
    "prune": {**dict.fromkeys(_LM, lm.prune_lm), "run:*": inspect.prune_run},
    "explain": {"*": inspect.explain_text},
    "generate": {
        **dict.fromkeys(_LM, lm.generate_lm),
        "run:pretrain": lm.generate_run,
        "attached-seq2seq": lm.generate_seq2seq,
    },
    "sinks": {**dict.fromkeys(_LM, lm.sinks_lm), "run:pretrain": lm.sinks_run},
    "induction": dict.fromkeys(_LM, lm.induction_lm),
    "findings": {
        **dict.fromkeys(_LM, findings.findings_lm),
        "whisper": findings.findings_whisper,
        "dinov2": findings.findings_dinov2,
    },
    "kv": dict.fromkeys(_LM, lm.kv_lm),
    "patch": {
        **dict.fromkeys(_LM, interventions.patch),
        "run:pretrain": interventions.patch,
        **dict.fromkeys(("attached-encoder", "attached-seq2seq"), interventions.patch_attached),
    },
    "attribute": {**dict.fromkeys(_LM, interventions.attribute), "run:pretrain": interventions.attribute},
    "circuit": dict.fromkeys(_LM, interventions.circuit),
    "embed": {"encoder": runs.embed, "run:train": runs.embed},
    "export": {
        "lm": lm.export_lm,
        "attached": lm.export_attached,
        "encoder": runs.export_encoder,
        "run:train": runs.export_encoder,
    },
    "evaluate": {
        "run:train": runs.evaluate_text,
        "run:g2p": runs.evaluate_g2p,
        "run:vision": runs.evaluate_vision,
        "run:grounding": runs.evaluate_grounding,
        "run:pretrain": runs.evaluate_lm,
    },
    "predict": {"run:train": runs.predict_text, "run:g2p": runs.predict_g2p, "run:vision": runs.predict_vision},
}


def _served(verb: str, route: str) -> Handler | None:
    """The handler of ``verb`` for ``route`` (``run:*``: a run folder of no known task, a damaged one)."""
    table = VERBS[verb]
    if route in table:
        return table[route]
    if route.startswith("run:") and "run:*" in table:
        return table["run:*"]
    return table.get("*") or (_run_handler(verb) if route == "run:*" else None)


def _run_handler(verb: str) -> Handler | None:
    """The first run handler of ``verb`` (what a damaged run folder is given, so that its loader speaks)."""
    return next((h for r, h in VERBS[verb].items() if r.startswith("run:")), None)


def _takes(verb: str) -> str:
    """The sources ``verb`` serves, in words."""
    from ..train import tasks

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


def handler(verb: str, source: str | Path) -> Handler:
    """The handler (a function of :mod:`multihead.cli`) that serves ``verb`` for ``source``; a
    ConfigError with the reason when none does. ``verb``: a key of :data:`VERBS` (``"heads --kv"`` is ``heads``
    with its flag). A folder that is nothing multihead reads goes to the verb's run handler where it has one, so
    that a damaged run folder gets the run loader's message."""
    from .. import pretrained

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


def _run_fallback(verb: str, source: str | Path) -> Handler | None:
    """The run handler for a source :func:`kind` does not know, when it may be a damaged run folder or a folder
    meant as one (so that its message names what a run folder needs); None: the registry's message stands."""
    from .. import pretrained

    run_handler = _run_handler(verb)
    path = Path(str(source))
    if run_handler is None or pretrained.names.short_name(str(source)) is not None:
        return None
    if not any(r in _LM or r == "*" for r in VERBS[verb]):  # a verb of run folders only: the task registry
        from ..train import tasks  # names what a run folder needs, or the damaged run's task

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
    """Every verb x every kind of source: the handler that serves it (``module:function`` in :mod:`multihead.cli`),
    or ``refused: <reason>``. Generated from :data:`VERBS`, :data:`~multihead.loading.REFUSES` and the task registry,
    so it cannot disagree with what the commands do."""
    from ..train import tasks

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
            row[r] = f"refused: {why}" if why else _named(served) if served else f"refused: it takes {_takes(verb)}"
        out[verb] = row
    return out


def _named(fn: Handler) -> str:
    """``module:function`` of a handler, as the verb x source page shows it."""
    return f"{fn.__module__.rsplit('.', 1)[-1]}:{fn.__name__}"


def dispatch(route: Route, args: Namespace) -> int:
    """Run the handler the table names for ``route``'s verb and source; what the table does not serve is refused
    there, with the reason."""
    return handler(route.verb, route.source)(args)


__all__ = ["Handler", "ROUTES", "VERBS", "dispatch", "handler", "matrix"]
