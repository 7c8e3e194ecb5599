"""File formats a foreign model is read from. Each reader opens the file's header first and returns tensor names
with their shapes (nothing read from the payload) and an HF-style config dict; tensors are fetched only after the
family has checked every shape against the model the config describes (:mod:`multihead.pretrained.state`).

========  ==========================================  =================================================
format    what it is                                  module
========  ==========================================  =================================================
``hf``    a folder: config.json + safetensors (shards  :mod:`.hf`
          too) or pytorch_model.bin (plain tensors)
``gguf``  llama.cpp's single file                      :mod:`.gguf`
``onnx``  an ONNX graph exported from an HF module     :mod:`.onnx`
``ct2``   a CTranslate2 folder (model.bin)             :mod:`.ct2`
========  ==========================================  =================================================

A new format plugs in here: a module with ``claims(path)`` (is this file mine?) and ``read(path)`` returning a
:class:`Read`, and one :class:`Format` entry in :data:`FORMATS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Read:
    """What a format reader found: ``config`` (an HF-style config dict: ``model_type`` names the family),
    ``tensors`` (file names -> :class:`~multihead.pretrained.state.Lazy`, shapes from the header), ``meta``
    (anything else the file carries: tokenizer, special tokens, chat template)."""

    path: Path
    format: str
    config: dict
    tensors: dict
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Format:
    name: str
    title: str
    module: str

    def _module(self):
        return importlib.import_module(self.module, __package__)

    def claims(self, path: Path) -> bool:
        return bool(self._module().claims(path))

    def read(self, path: Path) -> Read:
        return self._module().read(path)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("gguf", "a GGUF file", ".gguf"),
        Format("onnx", "an ONNX file", ".onnx"),
        Format("ct2", "a CTranslate2 folder", ".ct2"),
        Format("hf", "an HF model folder", ".hf"),  # last: any folder with config.json
    )
}


def format_of(path: Path) -> Format | None:
    """The format that claims ``path`` (checked in :data:`FORMATS` order), or None."""
    return next((f for f in FORMATS.values() if f.claims(Path(path))), None)


__all__ = ["FORMATS", "Format", "Read", "format_of"]
