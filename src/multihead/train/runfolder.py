"""The run folder: atomic writes, safetensors + JSON only (nothing is ever unpickled), checksums that catch a
truncated or tampered checkpoint with a clear message.

::

    RUN/config.json        TrainConfig (data, model, optim, run)
    RUN/model.safetensors  best weights (by validation score), with a digest of its tensors in the metadata
    RUN/tokenizer.json     HF tokenizers file
    RUN/labels.json        class names in output order
    RUN/splits.json        the fixed split (indices into the de-duplicated data)
    RUN/metrics.jsonl      one JSON object per evaluation / log event
    RUN/results.json       final test metrics, baseline, timings
    RUN/curves.png, RUN/confusion.png
    RUN/checkpoint/        state to --resume an interrupted run (weights, optimizer, RNG, position)

How it is written (see :mod:`multihead._io`): a new run (or ``--overwrite``) is built in ``.RUN.new`` beside it and
swapped in by one rename once it is resumable (config, tokenizer, labels, split and a step-0 checkpoint); from then
on files are replaced one by one, atomically, while ``.RUN.lock`` is held. Before a model is built from the folder,
``config.json`` is validated and the shapes it implies are compared with ``model.safetensors``'s header.
"""

from __future__ import annotations

from pathlib import Path

from types import SimpleNamespace

import torch

from .._config import ConfigError, flatten
from .._io import JSONFileError, read_json_file  # noqa: E402
from .._io import Publish, atomic_write_bytes, atomic_write_json, check_target, folder_kind, folder_lock  # noqa: F401
from .._weights import (  # noqa: F401  (re-exported: the run folder's weights are safetensors with a digest)
    CheckpointError,
    check_shapes,
    header_shapes,
    load_checked,
    load_tensors,
    meta_shapes,
    save_checked,
)


def read_json(path: Path, kind: type | None = None):
    """A JSON file of the run folder; ``kind`` (dict or list) is checked, so a hand-edited file gets a message."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing; {path.parent} is not a complete multihead run folder")
    try:
        value = read_json_file(path)
    except JSONFileError as exc:
        raise CheckpointError(f"{exc}; it is corrupt") from None
    if kind is not None and not isinstance(value, kind):
        raise CheckpointError(
            f"{path} holds a JSON {type(value).__name__}, expected "
            f"{'an object' if kind is dict else 'a list'}; it is corrupt or not a multihead file"
        )
    return value


def is_task_run(path, section: str) -> bool:
    """Whether ``path`` is a run folder whose ``config.json`` has a ``section`` (``train``, ``g2p``, ``vision``,
    ``pretrain``): how each task recognises its own runs without raising on other folders."""
    p = Path(path) / "config.json"
    try:
        cfg = read_json_file(p)
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and section in cfg


class RunExistsError(FileExistsError):
    pass


# Options a resumed run may change: they do not alter what is computed.
RESUME_MAY_CHANGE = {"run.progress", "run.save_every", "run.log"}
# Config fields that may name a file or folder the run reads: recorded (absolute path, content digest) in
# inputs.json, never inside the folder an --overwrite replaces, and checked unchanged on --resume.
INPUT_FIELDS = ("data.name", "data.path", "pretrained.name")


# ----------------------------------------------------------------------------------------- the resume policy
def resume_conflicts(recorded: dict, given: dict, rebuild=None) -> list[str]:
    """The options given again on a resume (``given``, the command line's nested overrides) that differ from a run's
    ``recorded`` config section. With ``rebuild`` (the task's ``config_from_overrides``) the options are compared in
    the task's own terms: e.g. G2P's ``--d-model`` sets the encoder's and the decoder's width, and ``--data
    cmudict`` names the task rather than a field."""
    from ..data import canonical_name

    if rebuild is None:
        fields = flatten(given)
    else:
        built, base, named = flatten(rebuild(given).to_dict()), flatten(rebuild({}).to_dict()), set(flatten(given))
        fields = {p: v for p, v in built.items() if p in named or base.get(p) != v}
    have = flatten(recorded)
    found = []
    for path, value in fields.items():
        if path in RESUME_MAY_CHANGE:
            continue
        if path == "data.name" and isinstance(value, str) and canonical_name(value) == have.get(path):
            continue
        if path in INPUT_FIELDS and _same_path(value, have.get(path)):  # a relative path given from elsewhere
            continue
        if have.get(path) != value:
            found.append(f"{path}={value!r} (recorded: {have.get(path)!r})")
    return found


def _same_path(a, b) -> bool:
    return isinstance(a, str) and isinstance(b, str) and Path(a).exists() and Path(a).resolve() == Path(b).resolve()


def absolute_inputs(config, task_cls) -> None:
    """Input fields that name an existing relative path become absolute: a run resumes, and its analyses find the
    data, from any directory."""
    for dotted, value in task_cls.inputs(config).items():
        section, _, name = dotted.partition(".")
        if Path(value).exists() and not Path(value).is_absolute() and hasattr(getattr(config, section), name):
            setattr(getattr(config, section), name, str(Path(value).resolve()))


def check_inputs(out: Path, config, task_cls) -> None:
    """Refuse a resume whose inputs changed since the run started (``inputs.json``; runs written before it existed
    are not checked)."""
    from ..data import provenance

    path = out / "inputs.json"
    if not path.exists():
        return
    changed = provenance.changes(read_json(path, dict), provenance.record(task_cls.inputs(config)))
    if changed:
        raise ConfigError(
            f"--resume continues {out} on the inputs it started with, and they changed: "
            f"{'; '.join(changed)}. Restore them, or start a new run (another --out, or --overwrite)"
        )


def recorded_config(out: Path, task_cls, given: dict | None = None):
    """The config of the run at ``out`` to resume: ``config.json[section]``, validated; options in ``given`` that
    differ from it are refused by name, matching ones accepted."""
    section = task_cls.section
    if not (out / "checkpoint" / "state.json").exists():
        raise CheckpointError(
            f"nothing to resume in {out}: it holds no checkpoint/state.json. Start a new run: drop "
            "--resume (add --overwrite to replace what is there)"
        )
    recorded = read_json(out / "config.json", dict)
    if section not in recorded:
        raise CheckpointError(
            f"nothing to resume in {out}: it is not a {section} run folder (its config.json has no "
            f"{section!r} section); drop --resume to start one"
        )
    conflicts = resume_conflicts(recorded[section], given or {}, task_cls.config_from_overrides)
    if conflicts:
        raise ConfigError(
            f"--resume continues {out} exactly as it was started; these options differ from the "
            f"recorded run: {'; '.join(conflicts)}. Drop them to resume, or start a new run (another "
            "--out, or --overwrite)"
        )
    try:
        config = task_cls.config_from_dict(recorded[section])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{out / 'config.json'}: {exc}") from None
    flat = flatten(given or {})
    for key in RESUME_MAY_CHANGE:  # e.g. --no-progress on a resume
        section_name, name = key.split(".")
        if key in flat and hasattr(getattr(config, section_name, None), name):
            setattr(getattr(config, section_name), name, flat[key])
    return config


def start_config(out: Path, config, task_cls, *, resume: bool, overwrite: bool, given: dict | None = None):
    """The config a run at ``out`` runs with: the recorded one on ``resume`` (see :func:`recorded_config`);
    otherwise ``config``, after refusing to replace an existing run without ``overwrite``. Applies (or records) the
    thread count: a resumed run gets the count it was started with, so its reductions run in the same order."""
    if resume and overwrite:
        raise ConfigError("--resume continues the run in --out and --overwrite replaces it; pass one of them")
    if resume:
        config = recorded_config(out, task_cls, given)
        check_inputs(out, config, task_cls)
    elif folder_kind(out) == "run" and not overwrite:
        raise RunExistsError(
            f"{out} already holds a run; pass --resume to continue it, --overwrite to replace it, "
            "or choose another --out"
        )
    else:  # before any data is read: a folder of other files, or one holding an input, is refused
        check_target(out, "run", overwrite=overwrite, sources=tuple(task_cls.inputs(config).values()))
        absolute_inputs(config, task_cls)
    if config.run.threads:
        from .._proc import set_threads

        set_threads(config.run.threads)
    else:
        config.run.threads = torch.get_num_threads()
    return config


class run_folder:
    """Where a run writes, with ``path`` and ``commit()``: a new (or overwritten) run is built in ``.NAME.new``
    beside ``out`` and swapped in by :meth:`commit` (the old run stays whole until then); a resumed run is written
    in place. Rank 0 holds the folder's lock throughout; other ranks write nothing."""

    def __init__(self, out: Path, *, resume: bool, overwrite: bool, main: bool = True) -> None:
        self.out, self.resume, self.overwrite, self.main = out, resume, overwrite, main

    def __enter__(self):
        if not self.main:
            self._inner = None
            return SimpleNamespace(path=self.out, commit=lambda: self.out)
        if self.resume:
            self._inner = folder_lock(self.out)
            self._inner.__enter__()
            return SimpleNamespace(path=self.out, commit=lambda: self.out)
        self._inner = Publish(self.out, "run", overwrite=self.overwrite)
        self._inner.__enter__()
        return self._inner

    def __exit__(self, *exc) -> None:
        if self._inner is not None:
            self._inner.__exit__(*exc)


__all__ = [
    "INPUT_FIELDS",
    "RESUME_MAY_CHANGE",
    "RunExistsError",
    "absolute_inputs",
    "check_inputs",
    "recorded_config",
    "resume_conflicts",
    "run_folder",
    "start_config",
    "CheckpointError",
    "is_task_run",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_shapes",
    "header_shapes",
    "load_checked",
    "load_tensors",
    "meta_shapes",
    "read_json",
    "save_checked",
]
