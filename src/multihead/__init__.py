"""multihead: multi-head attention from the equations to models you train, inspect, prune and run fast.

Layout (the architecture at a glance):

* :mod:`multihead.attention` -- the kernel seam: ``attention(q, k, v, ...)`` over registered backends (exact,
  memory-efficient, sparse, linear, FlexAttention), the mask convention (bool, True = may attend) and sparse
  patterns.
* :mod:`multihead.modules` -- ``MultiHeadAttention``, positional encodings, ``FeedForward``, ``EncoderBlock``,
  ``TransformerEncoder``; hook points for analysis.
* :mod:`multihead.models` -- ``TextEncoder`` (BERT-like backbone) and ``TransformerClassifier`` on it, dataclass configs.
* :mod:`multihead.data` -- datasets and readers (validated, read as written), splits, tokenizer, batching.
* :mod:`multihead.pretrained` -- foreign models into those modules: file formats (HF folders, GGUF, ONNX,
  CTranslate2) x model families (BERT, Llama/Mistral/Qwen2/Qwen3, Gemma 3, GPT-2, DINOv2, Whisper), one short-name
  table (``minilm``, ``smollm2``, ``dinov2``, ``whisper``); a new format plugs in at ``pretrained/formats``, a new
  family at ``pretrained/families``. ``multihead.lm``, ``multihead.dinov2`` and ``multihead.whisper`` are their
  per-family entry points.
* :mod:`multihead.train` -- configs and their layering, the trainer, evaluation, checkpoints, run folders.
* :mod:`multihead.loading` -- the source registry: ``kind(source)`` says what a source is (a run of any task or a
  foreign model) and what it refuses; ``load(source)`` (also ``multihead.load``) loads it.
* :mod:`multihead.interpret` -- capture attention through hook points, pictures, an offline page, head roles.
* :mod:`multihead.heads` -- head importance, iterative and physical pruning, the head-count sweep.
* :mod:`multihead.bench` -- one harness timing our backends and PyTorch peers in the same run.
* :mod:`multihead.cli` -- the ``multihead`` command; everything it does is callable from Python.
* Ground floor, under everything: :mod:`multihead._io` (atomic files, locks, folder swaps), :mod:`multihead._config`
  (config validation and size ceilings), :mod:`multihead._weights` (checked safetensors), :mod:`multihead.plotting`.

The layers are checked by ``lint-imports`` (``pyproject.toml``); docs/architecture.md says where new code goes.
"""

import sys
import types
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

# Each public name and the module it lives in: imported when first asked for (PEP 562), so that ``import
# multihead`` -- and the ``multihead`` command's --help and usage errors -- do not pay for torch.
_LAZY = {
    **dict.fromkeys(
        (
            "AttnMask",
            "attention",
            "attention_weights",
            "explain",
            "explain_choice",
            "list_backends",
            "masks",
            "register_backend",
        ),
        ".attention",
    ),
    **dict.fromkeys(
        (
            "CausalLM",
            "CausalLMConfig",
            "ClassifierConfig",
            "GenerationConfig",
            "Seq2Seq",
            "Seq2SeqConfig",
            "TextEncoder",
            "TextEncoderConfig",
            "TransformerClassifier",
            "generate",
        ),
        ".models",
    ),
    **dict.fromkeys(
        (
            "AttentionConfig",
            "DecoderBlock",
            "DecoderConfig",
            "KVCache",
            "KVPolicy",
            "KV_POLICIES",
            "TransformerDecoder",
            "EncoderBlock",
            "EncoderConfig",
            "FeedForward",
            "HookPoint",
            "LearnedPositionalEncoding",
            "MultiHeadAttention",
            "RotaryEmbedding",
            "SinusoidalPositionalEncoding",
            "TransformerEncoder",
            "hook_points",
            "make_policy",
        ),
        ".modules",
    ),
    "capture": ".modules.capture",
    "run_with_cache": ".modules.capture",
    "load": ".loading",
    "PositionalEncoding": ".modules",  # the tutorial's name for SinusoidalPositionalEncoding
}

if TYPE_CHECKING:
    from .attention import (
        AttnMask,
        attention,
        attention_weights,
        explain,
        explain_choice,
        list_backends,
        masks,
        register_backend,
    )
    from .loading import load
    from .models import (
        CausalLM,
        CausalLMConfig,
        ClassifierConfig,
        GenerationConfig,
        Seq2Seq,
        Seq2SeqConfig,
        TextEncoder,
        TextEncoderConfig,
        TransformerClassifier,
        generate,
    )
    from .modules import (
        KV_POLICIES,
        AttentionConfig,
        DecoderBlock,
        DecoderConfig,
        EncoderBlock,
        EncoderConfig,
        FeedForward,
        HookPoint,
        KVCache,
        KVPolicy,
        LearnedPositionalEncoding,
        MultiHeadAttention,
        RotaryEmbedding,
        SinusoidalPositionalEncoding,
        TransformerDecoder,
        TransformerEncoder,
        hook_points,
        make_policy,
    )
    from .modules import SinusoidalPositionalEncoding as PositionalEncoding
    from .modules.capture import capture, run_with_cache


def __getattr__(name: str):
    """The public names, imported when first asked for (see ``_LAZY``)."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'multihead' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(where, __name__)
    value = getattr(module, "SinusoidalPositionalEncoding" if name == "PositionalEncoding" else name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """``multihead.attention`` is the function (as the eager ``from .attention import attention`` always made it),
    also after the subpackage of the same name is imported -- which binds the module on its parent."""

    def __setattr__(self, name: str, value) -> None:
        if name == "attention" and isinstance(value, types.ModuleType):
            value = value.attention
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "AttnMask",
    "AttentionConfig",
    "CausalLM",
    "CausalLMConfig",
    "ClassifierConfig",
    "DecoderBlock",
    "DecoderConfig",
    "GenerationConfig",
    "KVCache",
    "KVPolicy",
    "KV_POLICIES",
    "Seq2Seq",
    "Seq2SeqConfig",
    "TransformerDecoder",
    "generate",
    "EncoderBlock",
    "EncoderConfig",
    "FeedForward",
    "HookPoint",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "PositionalEncoding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "TextEncoder",
    "TextEncoderConfig",
    "TransformerClassifier",
    "TransformerEncoder",
    "attention",
    "attention_weights",
    "explain",
    "capture",
    "explain_choice",
    "hook_points",
    "list_backends",
    "load",
    "make_policy",
    "masks",
    "register_backend",
    "run_with_cache",
]
