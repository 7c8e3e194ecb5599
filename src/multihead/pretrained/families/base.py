"""What a model family is: how an HF-style config becomes ours, which module it builds, and, per file format it can
be read from, how that format's tensor names map to our parameters (:class:`Adapter`). Formats that cannot hold a
family say why in ``why_not``, so every (format, family) pair has an answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import SourceError, raised_as


def _same(name: str) -> str:
    return name


@dataclass(frozen=True)
class Adapter:
    """One format's view of a family. ``to_ours(tensors, config)`` renames (and splits, transposes) the format's
    tensors into our state dict; ``expected(config)`` gives the format's names and shapes of the model ``config``
    describes (computed on the meta device); ``canonical`` normalises a file's names first (a wrapper's prefix, old
    spellings); ``ignored`` matches tensors a file may carry that the model does not use (pooler, rotary caches);
    ``config(read)``, when given, makes the HF-style config from the file (formats that store no architecture)."""

    to_ours: Callable[[dict, Any], dict]
    expected: Callable[[Any], dict[str, tuple[int, ...]]]
    canonical: Callable[[str], str] = _same
    ignored: re.Pattern | None = None
    config: Callable[[Any], dict] | None = None
    optional: tuple[str, ...] = ()  # file names that may be absent (the parameter keeps its initial value)
    tolerated: tuple[str, ...] = ()  # file names dropped when the model has no such parameter (a tied copy)


@dataclass(frozen=True)
class Family:
    """One model family. ``kind`` is the bundle it loads as (``encoder``, ``lm``, ``vision``, ``speech``);
    ``model_types`` the HF ``model_type`` values it reads; ``config(hf, backend=)`` our config from an HF-style dict
    (sizes checked against the ceilings before anything is allocated); ``build(config)`` the module;
    ``adapters`` the formats it is read from; ``why_not`` why the other formats cannot hold it."""

    name: str
    kind: str
    title: str
    model_types: tuple[str, ...]
    config: Callable[..., Any]
    build: Callable[[Any], nn.Module]
    adapters: dict[str, Adapter]
    why_not: dict[str, str] = field(default_factory=dict)
    error: type[SourceError] = SourceError
    # "module:function" under multihead.pretrained that reads a source of this family (short name, file or folder)
    # into its bundle: function(source, *, backend, device, progress)
    loader: str = ""

    def load(self, source, *, backend: str = "auto", device: str = "cpu", progress: bool = False):
        """``source`` (a short name, file or folder of this family) read into the family's bundle (a
        ``PretrainedLM``, ``Pretrained``, ``Dinov2`` or ``Whisper``, each with its ``model`` in eval mode on
        ``device``). :func:`multihead.loading.load` calls this; the family says how it is read."""
        import importlib

        if not self.loader:
            raise self.error(f"{self.title} has no loader: multihead reads it inside other models only")
        module, name = self.loader.split(":")
        read = getattr(importlib.import_module(f"multihead.pretrained.{module}"), name)
        return read(source, backend=backend, device=device, progress=progress)

    def model_from(
        self, read, *, backend: str = "auto", progress: bool = False, config: Any = None
    ) -> tuple[nn.Module, Any]:
        """``(model, our config)`` from what a format reader found: the config read and checked (or ``config``, when
        the caller already made it from the same file), every tensor's shape checked against the model it describes
        (on the meta device), then the tensors fetched, renamed and copied. Raises this family's error class."""
        from tqdm import tqdm

        from ..state import check_state, check_weight, import_state

        with raised_as(self.error):
            adapter = self.adapter(read.format)
            if config is None:
                config = self.config(adapter.config(read) if adapter.config else read.config, backend=backend)
            found, read_name = {}, {}
            for name, t in read.tensors.items():
                n = adapter.canonical(name)
                if adapter.ignored is None or not adapter.ignored.search(n):
                    found[n], read_name[n] = t, name
            expected = adapter.expected(config)
            found = {k: v for k, v in found.items() if k in expected or k not in adapter.tolerated}
            check_state(expected, {k: v.shape for k, v in found.items()}, read.path, optional=adapter.optional)
            items = tqdm(found.items(), desc="read weights", disable=not progress, leave=False)
            tensors = {k: v.get() for k, v in items if k in expected}
            for k, t in tensors.items():  # as stored: an integer or non-finite weight is refused by its name
                check_weight(t, read_name.get(k, k), read.path)
            model = import_state(lambda: self.build(config), adapter.to_ours(tensors, config), read.path)
        return model, config

    def adapter(self, fmt: str) -> Adapter:
        """The adapter for format ``fmt``, or a refusal that says why this family is not read from it."""
        if fmt in self.adapters:
            return self.adapters[fmt]
        why = self.why_not.get(fmt, f"multihead has no reader of {self.title} from this format")
        raise self.error(
            f"{self.title} cannot be read from {fmt!r} files: {why}. It is read from: {', '.join(self.adapters)}"
        )


__all__ = ["Adapter", "Family"]
