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
    AttentionConfig,
    DecoderBlock,
    DecoderConfig,
    KVCache,
    KVPolicy,
    KV_POLICIES,
    TransformerDecoder,
    EncoderBlock,
    EncoderConfig,
    FeedForward,
    HookPoint,
    LearnedPositionalEncoding,
    MultiHeadAttention,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    TransformerEncoder,
    hook_points,
    make_policy,
)

from .modules.capture import capture, run_with_cache
from ._version import __version__ as __version__


def __getattr__(name: str):
    """``multihead.load`` (:func:`multihead.loading.load`), imported when first asked for: loading reaches the
    training and reading code, which ``import multihead`` does not need."""
    if name == "load":
        from .loading import load

        return load
    raise AttributeError(f"module 'multihead' has no attribute {name!r}")


PositionalEncoding = SinusoidalPositionalEncoding  # the tutorial's name

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
