"""Models built from the modules."""
from .classifier import ClassifierConfig, TransformerClassifier

__all__ = ["ClassifierConfig", "TransformerClassifier"]
