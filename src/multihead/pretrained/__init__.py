"""Foreign models into multihead's own modules: one seam, two orthogonal parts.

* **Formats** (:mod:`.formats`): HF folders (safetensors, shards, ``pytorch_model.bin`` as plain tensors), GGUF,
  ONNX, CTranslate2. Each reads headers first and returns tensor names with shapes and an HF-style config dict.
* **Families** (:mod:`.families`): BERT, Llama (+ Mistral, Qwen2, Qwen3), Gemma 3, GPT-2, DINOv2, Whisper. Each is a
  config reader, the module it builds, and per format a name table; any family reads from any format that can hold
  it, and every other pair is refused with the reason (``Family.adapter``).

Between them, :func:`~.state.import_state` checks every shape on the meta device before the model is built (the one
shape check, :func:`multihead._weights.check_shapes`), :mod:`.names` is the one table of short names (``minilm``,
``smollm2``, ``dinov2``, ``whisper`` and their packages) and :class:`~.errors.SourceError` the one error base.
:func:`identify` says what a path or name is without reading weights; :func:`multihead.loading.load` (above this
package, beside run folders) is where callers load anything.

For compatibility this package also exports the BERT-family API it had as a module (``pretrained.load("minilm")``,
``export``, ``encoder_config``, ...), now in :mod:`.families.bert`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import names
from .errors import Dinov2Error, LMError, PretrainedError, SourceError, WhisperError, raised_as
from .families import FAMILIES, WHY_NOT, Family, family_of
from .families.bert import (
    NATIVE,
    Pretrained,
    bert_layout_problems,
    embed_texts,
    encoder_config,
    export,
    load,
    load_tokenizer,
    load_weights_into,
    read_hf_config,
    read_weights,
    resolve,
)
from .formats import FORMATS, Format, Read, format_of
from .names import SHORT_NAMES, ShortName
from .state import import_state


@dataclass(frozen=True)
class Identified:
    """What a foreign source is, found without reading its weights: its path, format and family (None with
    ``why`` when the format is known but the family is not read)."""

    path: Path
    format: Format
    family: Family | None
    short_name: ShortName | None = None
    why: str = ""


def identify(source: str | Path) -> Identified | None:
    """The format and family of a short name, file or folder (None: nothing here is a foreign model; a missing
    package of a short name raises with the install line)."""
    entry = names.short_name(str(source))
    if entry is not None:
        return Identified(names.locate(entry), FORMATS[entry.format], FAMILIES[entry.family], entry)
    path = Path(str(source))
    if not path.exists():
        return None
    fmt = format_of(path)
    if fmt is None:
        return None
    if fmt.name == "gguf":
        return Identified(path, fmt, FAMILIES["llama"])  # every GGUF architecture read is a causal LM
    if fmt.name == "onnx":
        return Identified(path, fmt, FAMILIES["dinov2"])
    if fmt.name == "ct2":
        return Identified(path, fmt, FAMILIES["whisper"])
    from .formats.hf import read_config

    try:  # a config that cannot be read says why, as a model type that is not read does
        return Identified(path, fmt, family_of({"model_type": read_config(path).get("model_type")}))
    except SourceError as exc:
        return Identified(path, fmt, None, why=str(exc))


def read_source(source: str | Path, error: type[SourceError] = SourceError) -> Read:
    """A short name, file or folder opened by its format's reader (headers only)."""
    path = names.resolve(str(source), error)
    fmt = format_of(path)
    if fmt is None:
        raise error(
            f"{path} is not a model file multihead reads: " + "; ".join(f.title for f in FORMATS.values()) + " are"
        )
    with raised_as(error):
        return fmt.read(path)


__all__ = [
    "Dinov2Error",
    "FAMILIES",
    "FORMATS",
    "Family",
    "Format",
    "Identified",
    "LMError",
    "NATIVE",
    "Pretrained",
    "PretrainedError",
    "Read",
    "SHORT_NAMES",
    "ShortName",
    "SourceError",
    "WHY_NOT",
    "WhisperError",
    "bert_layout_problems",
    "embed_texts",
    "encoder_config",
    "export",
    "family_of",
    "format_of",
    "identify",
    "import_state",
    "load",
    "load_tokenizer",
    "load_weights_into",
    "names",
    "read_hf_config",
    "read_source",
    "read_weights",
    "resolve",
]
