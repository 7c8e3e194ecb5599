"""Subword tokenizer trained on the training split only, with HF ``tokenizers``; saved as ``tokenizer.json``.

BERT-style normalisation and pre-tokenisation (lower-cased, accents stripped, punctuation split, CJK split per
character), then a SentencePiece-style word-start marker ``▁`` and a **BPE** vocabulary: ``▁the ▁cat ▁sat``,
``▁unbeliev ably``. Not WordPiece: ``tokenizers``' WordPiece trainer creates its ``##`` continuation tokens in
hash-map order, so the same texts give a different vocabulary in every process (huggingface/tokenizers#1794; we
measured ~40 of 10,000 tokens differing on Rotten Tomatoes), which would make a seeded run irreproducible. With the
marker inside the alphabet, BPE training is deterministic (a test trains in two processes and compares).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

PAD, UNK, CLS, SEP = "[PAD]", "[UNK]", "[CLS]", "[SEP]"
SPECIALS = [PAD, UNK, CLS, SEP]  # PAD is id 0: the classifier's pad_id


def train_tokenizer(
    texts: list[str], vocab_size: int = 10000, min_frequency: int = 2, *, extra_specials: tuple[str, ...] = ()
) -> Tokenizer:
    """A BPE vocabulary of at most ``vocab_size`` tokens (specials included) learned from ``texts``;
    ``extra_specials`` (e.g. ``[MASK]`` for pretraining) get the ids after :data:`SPECIALS`."""
    specials = [*SPECIALS, *extra_specials]
    if vocab_size < len(specials) + 1:
        raise ValueError(f"vocab_size must be at least {len(specials) + 1}, got {vocab_size}")
    tok = Tokenizer(BPE(unk_token=UNK))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Metaspace(prepend_scheme="always")]
    )
    tok.decoder = decoders.Metaspace(prepend_scheme="always")
    trainer = BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def display_tokens(tok: Tokenizer, ids: list[int]) -> list[str]:
    """Tokens for people: the word-start marker dropped (``▁cat`` -> ``cat``), specials kept."""
    return [t[1:] if t.startswith("▁") and len(t) > 1 else t for t in (tok.id_to_token(i) for i in ids)]


TOKENIZER_MAX_BYTES = 256 << 20  # a tokenizer.json larger than this is not one of ours (they are a few MB)


def load_tokenizer(path: Path) -> Tokenizer:
    """A ``tokenizer.json`` (the tokenizers library's format); a missing, oversized or corrupt file is refused with
    the path and what to do (never a parser traceback)."""
    from .datasets import DataError

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist: the run folder is incomplete; train it again (--overwrite)")
    if path.stat().st_size > TOKENIZER_MAX_BYTES:
        raise DataError(f"{path} is {path.stat().st_size:,} bytes, far more than a tokenizer; it is not one we wrote")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust parser raises its own exception type
        raise DataError(
            f"{path} is not a readable tokenizer ({str(exc)[:120]}); the file is damaged: restore it from "
            "a copy or train the run again (--overwrite)"
        ) from None


@dataclass
class Encoded:
    ids: list[list[int]]
    truncated: int  # how many texts were longer than max_len and were cut


def encode(tok: Tokenizer, texts: list[str], max_len: int) -> Encoded:
    """``[CLS] tokens [SEP]`` per text, cut to ``max_len`` (the cut is counted, never silent)."""
    if max_len < 3:
        raise ValueError(f"max_len must be at least 3 ([CLS], one token, [SEP]), got {max_len}")
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    out, truncated = [], 0
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids = enc.ids
        if len(ids) > max_len - 2:
            truncated += 1
            ids = ids[: max_len - 2]
        out.append([cls_id, *ids, sep_id])
    return Encoded(out, truncated)
