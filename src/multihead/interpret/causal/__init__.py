"""Causal analyses: what heads do to the output, measured by intervening on them.

* :mod:`.patching` -- ablation, activation / path / attribution patching over prompt pairs, direct logit
  attribution, the logit lens;
* :mod:`.circuits` -- the induction and IOI circuits, found and drawn;
* :mod:`.lens` -- a TransformerLens-compatible layer (``HookedTransformer``, ``run_with_cache``, hook names), and
  :mod:`.tl_patching`, TransformerLens's ``patching`` helpers on it;
* :mod:`.ablation` -- importance by zero ablation and the pruning curve for DINOv2 and Whisper;
* :mod:`.patch_page` -- the patching result as a page.
"""
