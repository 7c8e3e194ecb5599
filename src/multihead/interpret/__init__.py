"""Seeing inside: capture attention through hook points, pictures, an offline web page, head statistics and roles.

* :mod:`.maps` -- ``load_subject(run_or_pretrained).maps(text)``: tokens + weights of one text, which every
  analysis below reads (``capture(model)`` / ``run_with_cache`` come from :mod:`multihead.modules.capture`);
* :mod:`.roles` -- what heads are: per-head statistics and role labels, the tests that separate a role from the
  simpler explanation, induction heads, the tutorial's case study;
* :mod:`.causal` -- what heads do, by intervening: ablation, activation / path / attribution patching, direct
  logit attribution, the logit lens, circuits, the TransformerLens-compatible layer;
* :mod:`.kv` -- KV studies: the head-aware cache's split, needle recall against bytes, attention sinks;
* :mod:`.pages` -- what a reader sees: pictures, the offline page, ``show``, ``explain`` and its server;
* :mod:`.media` -- each kind of model's own views: images, speech, spellings to phonemes, translation.

The order is one-way (import-linter): media and the causal and KV analyses over the pages, the pages over the roles,
everything over the maps.

Every model reaches these through :func:`multihead.loading.load`, whatever it was read from: run folders of any
task, and the families and formats of :mod:`multihead.pretrained` (BERT, Llama/Mistral/Qwen, Gemma 3, GPT-2, DINOv2,
Whisper from HF folders, GGUF, ONNX or CTranslate2). A new family or format plugs in there, never here.
"""

from .._moved import keep_old_names
from ..modules.capture import Cache, capture, run_with_cache
from .maps import AttentionMaps, Subject, load_subject

# The modules of the flat package this one replaced -> where they live now. Importing an old name still works, with
# a warning, for one release.
MOVED = {
    "patching": "causal.patching",
    "circuits": "causal.circuits",
    "lens": "causal.lens",
    "ablation": "causal.ablation",
    "patch_page": "causal.patch_page",
    "role_test": "roles.evidence",
    "induction": "roles.induction",
    "case_study": "roles.case_study",
    "kv_heads": "kv.heads",
    "kv_curves": "kv.curves",
    "streaming": "kv.streaming",
    "page": "pages.page",
    "plots": "pages.plots",
    "show": "pages.show",
    "explain": "pages.explain",
    "serve": "pages.serve",
    "vision": "media.vision",
    "dino": "media.dino",
    "speech": "media.speech",
    "g2p": "media.g2p",
    "seq2seq": "media.seq2seq",
}
keep_old_names(__name__, MOVED)

__all__ = ["AttentionMaps", "Cache", "Subject", "capture", "load_subject", "run_with_cache"]
