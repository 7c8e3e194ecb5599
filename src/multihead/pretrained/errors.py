"""One error base for every model source that cannot be read: :class:`SourceError`. The per-family classes are kept
(code that catches ``LMError`` or ``PretrainedError`` goes on working) and all derive from it, and from ``ValueError``,
so the command line answers each with its message and exit status 2, never a traceback.
"""

from __future__ import annotations

from contextlib import contextmanager


class SourceError(ValueError):
    """A model source (a short name, a file, an HF folder) that cannot be located, read or built; the message says
    why and what to do."""


class PretrainedError(SourceError):
    """A BERT-family encoder that cannot be imported or exported."""


class LMError(SourceError):
    """A pretrained causal LM that cannot be imported or exported."""


class Dinov2Error(SourceError):
    """A DINOv2 model that cannot be found or read."""


class WhisperError(SourceError):
    """A Whisper model that cannot be found or read."""


@contextmanager
def raised_as(cls: type[SourceError]):
    """Re-raise any :class:`SourceError` from the shared readers as ``cls`` (same message), so that a family's entry
    point raises its own class as it always did."""
    try:
        yield
    except SourceError as exc:
        if isinstance(exc, cls):
            raise
        raise cls(str(exc)) from None


__all__ = ["Dinov2Error", "LMError", "PretrainedError", "SourceError", "WhisperError", "raised_as"]
