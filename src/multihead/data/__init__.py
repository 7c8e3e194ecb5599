"""Data: datasets and the one split type (:class:`Splits`, with the one meaning of ``limit``), the tokenizer,
length-bucketed batching."""

from .batching import bucketed_batches, collate, length_sorted
from .datasets import (
    BUILTIN,
    DataError,
    TextDataset,
    apply_split,
    canonical_name,
    card,
    format_card,
    load,
    load_texts,
    read_texts,
    split,
)
from .splits import Splits
from .tokenizer import encode, load_tokenizer, train_tokenizer

__all__ = [
    "BUILTIN",
    "DataError",
    "Splits",
    "TextDataset",
    "apply_split",
    "bucketed_batches",
    "canonical_name",
    "card",
    "collate",
    "encode",
    "format_card",
    "length_sorted",
    "load",
    "load_texts",
    "load_tokenizer",
    "read_texts",
    "split",
    "train_tokenizer",
]
