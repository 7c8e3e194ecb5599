"""Head findings of 2025-2026 as measurements on the models multihead reads: each a :class:`Finding` registered
in :data:`FINDINGS` (the one place a new finding plugs in), with the paper's claim, what it measures, a figure, a
JSON file and a page that puts the claim beside the number (:func:`report`).

Each finding says which kind of model it measures (``Finding.takes``: a causal LM, Whisper, DINOv2).
``multihead findings NAME MODEL`` runs one; :func:`run` is the same from Python. A finding reads the model through
its anatomy (:mod:`multihead.modules.anatomy`), so a native model and an attached HF model are measured alike.
"""

from __future__ import annotations

from . import registered  # noqa: F401  (the findings, registered)
from .registry import FINDINGS, Finding, Text, check_kind, check_name, page, register, report, run

__all__ = ["FINDINGS", "Finding", "Text", "check_kind", "check_name", "page", "register", "report", "run"]
