"""Model families: one :class:`~.base.Family` each, in :data:`FAMILIES`, found from a config's ``model_type`` by
:func:`family_of`. A model type we do not read is refused with the reason (:data:`WHY_NOT`).

=====================  ========  ===========================================  ==================
family                 kind      model types                                  formats
=====================  ========  ===========================================  ==================
``bert``               encoder   bert (BERT, MiniLM, all-MiniLM-L6-v2)        hf
``multihead_encoder``  encoder   multihead_text_encoder (our own layout)      hf
``llama``              lm        llama, mistral, qwen2, qwen3                 hf, gguf
``gemma3``             lm        gemma3_text                                  hf, gguf
``gpt2``               lm        gpt2                                         hf
``dinov2``             vision    dinov2                                       hf, onnx
``whisper``            speech    whisper                                      hf, ct2
=====================  ========  ===========================================  ==================

A new family plugs in here: a module beside these with its config reader (HF dict -> our config), the module it
builds and, per format, an :class:`~.base.Adapter` (its name table); then one entry in :data:`FAMILIES`. Copy
:mod:`.dinov2` (a single name table, two formats) to start.
"""

from __future__ import annotations

from ..errors import SourceError
from . import bert, causal, dinov2, whisper
from .base import Adapter, Family

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        bert.FAMILY,
        bert.NATIVE_FAMILY,
        *(lm.as_family() for lm in causal.FAMILIES.values()),
        dinov2.FAMILY,
        whisper.FAMILY,
    )
}
WHY_NOT = {  # model types that are not read, and why
    **{k: v for k, v in bert._WHY_NOT.items() if k not in ("gpt2", "llama", "qwen2", "mistral")},
    **{k: v for k, v in causal._WHY_NOT.items() if k != "bert"},
    "vit": "HF ViT uses layernorm_before/after and no LayerScale; multihead reads DINOv2's layout (model_type dinov2)",
    "dinov2_with_registers": "DINOv2 with registers adds register tokens; not supported yet",
    "clip": "CLIP pairs a text and a vision tower with a projection; not supported yet",
    "t5": "T5 uses relative position buckets and an encoder-decoder of its own layout; not supported yet",
    "bart": "BART is an encoder-decoder with learned offset positions; not supported yet",
}


def family_of(config: dict, error: type[SourceError] = SourceError) -> Family:
    """The family that reads a config of this ``model_type``, or a refusal with the reason and what is read."""
    kind = config.get("model_type")
    for family in FAMILIES.values():
        if kind in family.model_types:
            return family
    known = sorted(t for f in FAMILIES.values() for t in f.model_types)
    why = WHY_NOT.get(kind) if isinstance(kind, str) else None
    raise error(
        f"model_type {kind!r} is not read by multihead" + (f" ({why})" if why else "") + f"; model types read: "
        f"{', '.join(known)}"
    )


__all__ = ["Adapter", "FAMILIES", "Family", "WHY_NOT", "family_of"]
