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

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import names
from .errors import Dinov2Error, LMError, PretrainedError, SourceError, WhisperError, raised_as
from .names import SHORT_NAMES, ShortName

if TYPE_CHECKING:
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
    from .state import import_state

# Names resolved when first asked for (PEP 562): the families and formats import torch, and telling what a source
# is (a missing path, a folder without weights, a near-miss short name) must not wait for it.
_LAZY = {
    **dict.fromkeys(("FAMILIES", "WHY_NOT", "Family", "family_of"), "families"),
    **dict.fromkeys(
        (
            "NATIVE",
            "Pretrained",
            "bert_layout_problems",
            "embed_texts",
            "encoder_config",
            "export",
            "load",
            "load_tokenizer",
            "load_weights_into",
            "read_hf_config",
            "read_weights",
            "resolve",
        ),
        "families.bert",
    ),
    **dict.fromkeys(("FORMATS", "Format", "Read", "format_of"), "formats"),
    "import_state": "state",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    path = Path(str(source))
    if entry is None and not path.exists():
        return None
    from .families import FAMILIES, family_of
    from .formats import FORMATS, format_of

    if entry is not None:
        return Identified(names.locate(entry), FORMATS[entry.format], FAMILIES[entry.family], entry)
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


def declared(source: str | Path) -> tuple[int, int] | None:
    """``(layers, heads)`` as a source's headers declare them, read without its weights (and without importing
    torch): an HF folder's ``config.json`` (``hf:FOLDER`` too) or a GGUF file's metadata; short names are located
    first. None where the headers do not say it plainly (a run folder, an encoder-decoder, another format), so that
    the command's own check, after loading, decides. A command asked for a layer or head these rule out refuses
    before anything is loaded."""
    import struct

    text = str(source)
    text = text[3:] if text.startswith("hf:") else text
    entry = names.short_name(text)
    try:
        path = names.locate(entry) if entry is not None else Path(text)
    except SourceError:
        return None
    if path.is_dir() and (path / "config.json").is_file():
        from .formats.hf import read_json

        try:
            config = read_json(path / "config.json")
        except SourceError:
            return None
        config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
        if config.get("is_encoder_decoder"):
            return None
        layers = config.get("num_hidden_layers", config.get("n_layer"))
        heads = config.get("num_attention_heads", config.get("n_head"))
    elif path.is_file() and path.suffix == ".gguf":
        from .formats.gguf_layout import SCALARS, scan

        try:
            fields = scan(path).fields
        except SourceError:
            return None

        def number(f, suffix: str):  # an integer scalar's value: the last bytes of its entry
            found = [
                e for k, e in fields.items() if k.endswith(suffix) and e.vtype in SCALARS and e.vtype not in (6, 7, 12)
            ]
            if len(found) != 1:
                return None
            size = SCALARS[found[0].vtype][1]
            f.seek(found[0].end - size)
            return struct.unpack({1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[size], f.read(size))[0]

        with open(path, "rb") as f:
            layers, heads = number(f, ".block_count"), number(f, ".attention.head_count")
    else:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (layers, heads)):
        return None
    return layers, heads


def read_source(source: str | Path, error: type[SourceError] = SourceError) -> Read:
    """A short name, file or folder opened by its format's reader (headers only)."""
    from .formats import FORMATS, format_of

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
    "declared",
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
