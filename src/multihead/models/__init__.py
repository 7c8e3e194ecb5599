"""Models built from the modules: a text encoder (BERT-like backbone) and the classifier on top of it; a decoder-only
language model and an encoder-decoder, with cached generation."""

from .classifier import ClassifierConfig, TransformerClassifier
from .generation import GenerationConfig, Generated, generate
from .seq2seq import CausalLM, CausalLMConfig, Seq2Seq, Seq2SeqConfig
from .text_encoder import TextEncoder, TextEncoderConfig

__all__ = [
    "CausalLM",
    "CausalLMConfig",
    "ClassifierConfig",
    "GenerationConfig",
    "Generated",
    "Seq2Seq",
    "Seq2SeqConfig",
    "TextEncoder",
    "TextEncoderConfig",
    "TransformerClassifier",
    "generate",
]
