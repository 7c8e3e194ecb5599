"""Seeing inside: capture attention through hook points, pictures, an offline web page, head statistics and roles.

* :mod:`.capture` -- ``capture(model)`` / ``run_with_cache``: every layer's per-head weights (and q, k, v, z);
* :mod:`.maps` -- ``load_subject(run_or_pretrained).maps(text)``: tokens + weights of one text;
* :mod:`.plots` -- grid, single head, layer mean, rollout (PNG + SVG);
* :mod:`.page` -- one self-contained HTML file (head view + model view), no CDN;
* :mod:`.roles` -- per-head statistics over a corpus and rule-based role labels;
* :mod:`.case_study` -- the tutorial's "The cat sat on the mat." links, searched over all heads;
* :mod:`.patching` -- ablation, activation / path / attribution patching (``patch_pairs`` over prompt pairs), direct
  logit attribution, the logit lens; :mod:`.circuits` -- the induction and IOI circuits;
* :mod:`.ablation` -- importance by zero ablation and the pruning curve for DINOv2 and Whisper;
* :mod:`.dino`, :mod:`.speech`, :mod:`.vision`, :mod:`.g2p`, :mod:`.induction`, :mod:`.streaming` -- each kind of
  model's own views.

Every model reaches these through :func:`multihead.loading.load`, whatever it was read from: run folders of any
task, and the families and formats of :mod:`multihead.pretrained` (BERT, Llama/Mistral/Qwen, Gemma 3, GPT-2, DINOv2,
Whisper from HF folders, GGUF, ONNX or CTranslate2). A new family or format plugs in there, never here.
"""

from ..modules.capture import Cache, capture, run_with_cache
from .maps import AttentionMaps, Subject, load_subject

__all__ = ["AttentionMaps", "Cache", "Subject", "capture", "load_subject", "run_with_cache"]
