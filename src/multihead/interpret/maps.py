"""Attention maps of one text: tokens and every layer's per-head weights, from a pretrained encoder or a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..modules.capture import capture

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")


@dataclass
class AttentionMaps:
    """``layers[l]`` is ``(H_l, L, L)`` for the ``L`` real tokens of ``text`` (rows: queries, columns: keys; each
    row sums to 1). Heads per layer may differ after pruning. Cross-attention maps are ``(H_l, Lq, Lk)`` with the
    keys' own ``key_tokens`` (e.g. phonemes attending to letters)."""

    text: str
    tokens: list[str]
    layers: list[Tensor]
    model: str = ""
    starts: list[bool] | None = None  # True where a token starts a word (None: WordPiece's "##" marks the rest)
    truncated: int = 0  # tokens of the text beyond the model's limit (not shown)
    key_tokens: list[str] | None = None  # cross-attention: the key sequence's tokens (None: the same tokens)

    @property
    def keys(self) -> list[str]:
        return self.tokens if self.key_tokens is None else self.key_tokens

    def word_starts(self) -> list[bool]:
        return self.starts if self.starts is not None else [not t.startswith("##") for t in self.tokens]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def heads(self) -> list[int]:
        return [w.shape[0] for w in self.layers]

    def head(self, layer: int, head: int) -> Tensor:
        return self.layers[layer][head]

    def to_dict(self, digits: int = 4) -> dict:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "model": self.model,
            "layers": [[[[round(v, digits) for v in row] for row in h] for h in w.tolist()] for w in self.layers],
        }


@dataclass
class Subject:
    """A model to look inside, with the tokenizer that feeds it."""

    name: str
    model: nn.Module
    tokenizer: object
    max_len: int

    def encode(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        from ..data import collate, encode

        enc = encode(self.tokenizer, list(texts), self.max_len)
        return collate(enc.ids, pad_id=self.tokenizer.token_to_id("[PAD]") or 0)

    def display(self, ids: list[int]) -> tuple[list[str], list[bool] | None]:
        """Tokens for people and word starts: BPE's word-start marker dropped (``▁cat`` -> ``cat``, a start;
        ``at`` without it continues a word); WordPiece's ``##`` kept (starts: None, the ``##`` says it)."""
        toks = [self.tokenizer.id_to_token(i) for i in ids]
        if not any(t.startswith("▁") for t in toks):
            return toks, None
        starts = [t.startswith("▁") or is_special(t) for t in toks]
        return [t[1:] if t.startswith("▁") and len(t) > 1 else t for t in toks], starts

    def length(self, text: str) -> int:
        """How many tokens the model would read for ``text`` without a limit (special tokens included)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids) + 2  # [CLS] ... [SEP]

    @torch.no_grad()
    def maps(self, texts: list[str] | str, batch_size: int = 32) -> list[AttentionMaps] | AttentionMaps:
        """Attention maps of each text (one :class:`AttentionMaps` for a single string)."""
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        self.model.eval()
        out = []
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            ids, keep = self.encode(chunk)
            with capture(self.model) as cache:
                self.model(ids, keep)
            patterns = cache.patterns()  # each (B, H, L, L)
            for row, text in enumerate(chunk):
                n = int(keep[row].sum())
                tokens, starts = self.display(ids[row, :n].tolist())
                cut = max(0, self.length(text) - n)
                out.append(
                    AttentionMaps(text, tokens, [p[row, :, :n, :n].float() for p in patterns], self.name, starts, cut)
                )
        return out[0] if single else out


@dataclass
class LMSubject(Subject):
    """A pretrained causal LM (:class:`multihead.lm.PretrainedLM`): texts encoded as the model reads them (BOS where
    it adds one), right-padded; tokens shown as the text they decode to (byte-level BPE's ``Ġ`` as a space)."""

    lm: object = None

    def encode(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        from ..data import collate

        rows = [self.lm.encode(t)[: self.max_len] for t in texts]
        if any(not r for r in rows):
            raise ValueError("a text encodes to no tokens; pass non-empty text")
        pad = self.lm.model.config.pad_id
        return collate(rows, pad_id=pad)

    def length(self, text: str) -> int:
        return len(self.lm.encode(text))

    def display(self, ids: list[int]) -> tuple[list[str], list[bool] | None]:
        texts = self.lm.token_texts(ids)
        starts = [i == 0 or t[:1].isspace() or not t for i, t in enumerate(texts)]
        return [t.strip() or t.replace("\n", "\\n") or "∅" for t in texts], starts


@dataclass
class FolderSubject(Subject):
    """An HF encoder folder read by transformers and attached (:class:`multihead.hf.models.AttachedFolder`): texts
    encoded with the special tokens its tokenizer adds ([CLS]/[SEP], <s>/</s>...), right-padded."""

    folder: object = None

    def encode(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        from ..data import collate

        rows = [self.folder.encode(t)[: self.max_len] for t in texts]
        return collate(rows, pad_id=self.folder.pad_id)

    def length(self, text: str) -> int:
        return len(self.folder.encode(text))

    def display(self, ids: list[int]) -> tuple[list[str], list[bool] | None]:
        raw = [self.tokenizer.id_to_token(int(i)) or "" for i in ids]
        if any(t.startswith("##") for t in raw):
            return raw, None
        marked = any(t[:1] in ("Ġ", "▁") for t in raw)
        starts = [i == 0 or not marked or t[:1] in ("Ġ", "▁") or is_special(t) for i, t in enumerate(raw)]
        return self.folder.tokens(ids), starts


LONG = 1024  # tokens above which show and heads work from statistics (no L x L map)


def load_subject(source: str | Path, *, sentence_embeddings: bool = False) -> Subject:
    """A run folder (its trained classifier) or a pretrained name / BERT-family folder. A pretrained model reads up
    to all its positions, or with ``sentence_embeddings`` up to sentence-transformers' ``max_seq_length`` (256 for
    MiniLM), as its embeddings were trained; a run reads up to its ``data.max_len``."""
    from ..loading import load

    loaded = load(source, text=True)
    if loaded.kind == "lm":
        return LMSubject(loaded.source, loaded.model, loaded.tokenizer, loaded.max_len, lm=loaded.detail)
    if loaded.kind == "attached-encoder":
        return FolderSubject(loaded.source, loaded.model, loaded.tokenizer, loaded.max_len, folder=loaded.detail)
    return Subject(
        loaded.source,
        loaded.model,
        loaded.tokenizer,
        loaded.sentence_max_len if sentence_embeddings else loaded.max_len,
    )


def is_special(token: str) -> bool:
    return token in SPECIAL_TOKENS


def is_punctuation(token: str) -> bool:
    import unicodedata

    t = token[2:] if token.startswith("##") else token
    return bool(t) and not is_special(token) and all(unicodedata.category(c).startswith("P") for c in t)


def lift_max_len(subject, max_len: int) -> None:
    """Let ``subject`` read ``max_len`` tokens (``show``/``heads --max-len``). A learned position table cannot grow (refused with the fix);
    rotary or no positions read any length (beyond the trained length: the analysis says so in its data)."""
    config = getattr(subject.model, "config", None)
    positional = getattr(config, "positional", "learned")
    table = getattr(config, "max_len", subject.max_len)
    if max_len > table and positional == "learned":
        raise ValueError(
            f"{subject.name} has learned positions for {table} tokens; --max-len {max_len} needs a model "
            "with rotary positions (e.g. a pretrain run's encoder) or at most " + str(table)
        )
    if config is not None and max_len > table:
        config.max_len = max_len
    subject.max_len = max_len


def concatenated(subject, texts: list[str], n: int) -> list[str]:
    """``n`` inputs for ``heads --concat``: each consecutive texts joined until the model's ``max_len`` tokens."""
    out, cur, count = [], [], 0
    for t in texts:
        cur.append(t)
        count += len(subject.tokenizer.encode(t, add_special_tokens=False).ids)
        if count >= subject.max_len:
            out.append(" ".join(cur))
            cur, count = [], 0
            if len(out) == n:
                break
    if len(out) < n:
        raise ValueError(
            f"the data holds {len(out)} inputs of {subject.max_len} tokens; pass a smaller --n or --max-len"
        )
    return out


__all__ = [
    "AttentionMaps",
    "FolderSubject",
    "LMSubject",
    "Subject",
    "is_punctuation",
    "is_special",
    "concatenated",
    "lift_max_len",
    "load_subject",
]
