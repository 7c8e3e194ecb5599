"""Models built from the modules: a text encoder (BERT-like backbone) and the classifier on top of it."""
from .classifier import ClassifierConfig, TransformerClassifier
from .text_encoder import TextEncoder, TextEncoderConfig

__all__ = ["ClassifierConfig", "TextEncoder", "TextEncoderConfig", "TransformerClassifier"]
