"""Heads, measured: how many (:mod:`.sweep`), which matter (:mod:`.scores`), and pruning (:mod:`.prune`)."""

from .scores import METHODS, importance
from .prune import mask_to_heads, prune_curve

__all__ = ["METHODS", "importance", "mask_to_heads", "prune_curve"]
