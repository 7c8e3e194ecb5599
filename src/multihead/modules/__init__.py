"""Modules: they own parameters and reshapes and call the kernel seam; ``(B, H, L, D)`` inside."""
from .attention import MultiHeadAttention
from .capture import Cache, capture, run_with_cache
from .encoder import EncoderBlock, EncoderConfig, TransformerEncoder
from .feedforward import FeedForward
from .hooks import HookPoint, hook_points
from .positional import LearnedPositionalEncoding, RotaryEmbedding, SinusoidalPositionalEncoding

__all__ = [
    "Cache",
    "EncoderBlock",
    "EncoderConfig",
    "FeedForward",
    "HookPoint",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "TransformerEncoder",
    "capture",
    "hook_points",
    "run_with_cache",
]
