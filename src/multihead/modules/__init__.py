"""Modules: they own parameters and reshapes and call the kernel seam; ``(B, H, L, D)`` inside."""

from .attention import MultiHeadAttention
from .capture import Cache, capture, run_with_cache
from .decoder import DecoderBlock, DecoderConfig, TransformerDecoder
from .encoder import EncoderBlock, EncoderConfig, TransformerEncoder
from .feedforward import FeedForward
from .hooks import HookPoint, hook_points
from .._moved import keep_old_names
from .kv import KV_POLICIES, KVCache, KVPolicy, LayerKV, make_policy
from .mla import MultiHeadLatentAttention
from .positional import LearnedPositionalEncoding, RotaryEmbedding, SinusoidalPositionalEncoding
from .variants import AttentionConfig, DifferentialAttention, TalkingHeadsAttention, build_attention

# The modules the KV package replaced -> where they live now. Importing an old name still works, with a warning, for
# one release.
MOVED = {"kv_cache": "kv", "kv_policy": "kv"}
keep_old_names(__name__, MOVED)

__all__ = [
    "AttentionConfig",
    "Cache",
    "DecoderBlock",
    "DecoderConfig",
    "DifferentialAttention",
    "KVCache",
    "KVPolicy",
    "KV_POLICIES",
    "LayerKV",
    "MultiHeadLatentAttention",
    "TransformerDecoder",
    "EncoderBlock",
    "EncoderConfig",
    "FeedForward",
    "HookPoint",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "TalkingHeadsAttention",
    "TransformerEncoder",
    "build_attention",
    "capture",
    "hook_points",
    "make_policy",
    "run_with_cache",
]
