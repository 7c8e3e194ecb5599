"""What heads are: per-head statistics and role labels (:mod:`.scores`), the tests that separate a role from the
simpler explanation (:mod:`.evidence`), induction heads (:mod:`.induction`) and the tutorial's case study
(:mod:`.case_study`)."""

from __future__ import annotations

import importlib
import warnings

_SCORES = ("ROLES", "STATS", "analyse", "format_table", "head_stats", "plot_roles", "role", "subject_head_stats")


def __getattr__(name: str):
    """``multihead.interpret.roles.<name>`` of the module this package replaced: its name in :mod:`.scores`, with a
    warning (the old spelling goes in the next release)."""
    if name in _SCORES:
        warnings.warn(
            f"multihead.interpret.roles.{name} moved to multihead.interpret.roles.scores.{name}; the old spelling "
            "goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(".scores", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
