"""Kept importable from here: the causal-LM families live in :mod:`multihead.pretrained.families.causal`."""

from ..pretrained.families.causal import *  # noqa: F401,F403
from ..pretrained.families.causal import __all__  # noqa: F401
