"""Weights into a model, one way for every family and format: the shapes the file declares are checked against the
model the config describes, built on the meta device (nothing allocated), before the real model is built and filled.

``import_state(build, tensors, where)`` is the whole of it: ``build()`` makes the model (called twice: once on the
meta device for the expected shapes, once for real), ``tensors`` maps our parameter names to tensors (or to anything
with a ``shape`` whose values are fetched only after the check, see :class:`Lazy`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from .._weights import CheckpointError, check_shapes, meta_shapes, unique_state
from .errors import SourceError


class Lazy:
    """A tensor known by its shape (from a file header) and read only when ``get()`` is called."""

    __slots__ = ("shape", "_read")

    def __init__(self, shape: tuple[int, ...], read: Callable[[], torch.Tensor]) -> None:
        self.shape = tuple(shape)
        self._read = read

    def get(self) -> torch.Tensor:
        return self._read()


def _value(t) -> torch.Tensor:
    return t.get() if isinstance(t, Lazy) else t


def check_state(
    expected: Mapping[str, tuple], found: Mapping[str, tuple], where: str | Path, *, names=None, optional=()
) -> None:
    """``found`` (our names -> shapes from the file) against ``expected`` (from :func:`meta_shapes`); parameters in
    ``optional`` may be absent (they keep their initial value: a token-type table BERT exports always write)."""
    expected = {k: v for k, v in expected.items() if not (k in optional and k not in found)}
    try:
        check_shapes(expected, dict(found), Path(str(where)), names=names)
    except CheckpointError as exc:
        raise SourceError(str(exc)) from None


def import_state(
    build: Callable[[], nn.Module],
    tensors: Mapping[str, object],
    where: str | Path,
    *,
    names=None,
    optional=(),
) -> nn.Module:
    """The model ``build()`` makes, filled with ``tensors`` (our parameter names; tied parameters once), after every
    shape was checked on the meta device. ``names`` maps our names to the file's for messages."""
    expected = meta_shapes(build)
    check_state(expected, {k: tuple(v.shape) for k, v in tensors.items()}, where, names=names, optional=optional)
    model = build()
    own = unique_state(model)
    with torch.no_grad():
        for k, t in own.items():
            if k in tensors:
                t.copy_(_value(tensors[k]).to(t.dtype))
    return model


def check_weight(value: torch.Tensor, name: str, where: str | Path) -> None:
    """Refuse, by name, a weight that would load as something other than what the file holds: an integer or
    boolean tensor where the model has a float parameter (a cast would invent a different model), or one with
    NaN or infinite values (the model would compute NaN, or an empty continuation, silently)."""
    if not value.is_floating_point():
        raise SourceError(
            f"{where}: {name} is stored as {str(value.dtype).removeprefix('torch.')}, but the model's parameter is a "
            "float; integer weights are packed or quantised values that a cast would turn into another model: "
            "export the weights in float32, float16 or bfloat16"
        )
    bad = ~torch.isfinite(value)
    if bool(bad.any()):
        n = int(bad.sum())
        raise SourceError(
            f"{where}: {name} holds {n:,} non-finite value{'s' if n != 1 else ''} (NaN or infinite) of "
            f"{value.numel():,}; the file is corrupt or was saved from a diverged model: export it again"
        )


__all__ = ["Lazy", "check_state", "check_weight", "import_state"]
