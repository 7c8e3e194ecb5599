"""Kept importable from here: GGUF files are read by :mod:`multihead.pretrained.formats.gguf`."""

from ..pretrained.formats.gguf import (
    MAGIC,
    PRE_TOKENIZERS,
    GGUFFile,
    check_header,
    hf_config,
    hf_names,
    hf_shapes,
    hf_tensors,
    permute,
    tokenizer,
    unpermute,
)

__all__ = [
    "GGUFFile",
    "MAGIC",
    "PRE_TOKENIZERS",
    "check_header",
    "hf_config",
    "hf_names",
    "hf_shapes",
    "hf_tensors",
    "permute",
    "tokenizer",
    "unpermute",
]
