"""Seeing inside: capture attention through hook points, pictures, an offline web page, head statistics and roles.

* :mod:`.capture` -- ``capture(model)`` / ``run_with_cache``: every layer's per-head weights (and q, k, v, z);
* :mod:`.maps` -- ``load_subject(run_or_pretrained).maps(text)``: tokens + weights of one text;
* :mod:`.plots` -- grid, single head, layer mean, rollout (PNG + SVG);
* :mod:`.page` -- one self-contained HTML file (head view + model view), no CDN;
* :mod:`.roles` -- per-head statistics over a corpus and rule-based role labels;
* :mod:`.case_study` -- the tutorial's "The cat sat on the mat." links, searched over all heads.
"""

from ..modules.capture import Cache, capture, run_with_cache
from .maps import AttentionMaps, Subject, load_subject

__all__ = ["AttentionMaps", "Cache", "Subject", "capture", "load_subject", "run_with_cache"]
