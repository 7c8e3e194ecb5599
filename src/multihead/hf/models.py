"""HF encoders, sequence-to-sequence and vision models read from a folder and attached, behind the calling
conventions multihead's analyses use: an encoder as ``model(ids, keep) -> output`` (what ``show`` and ``heads``
call), a vision model as ``model(pixels) -> logits`` with ``config.patch_size`` and ``config.patch_offset`` (what
the image pictures read), and a sequence-to-sequence model with its three kinds of attention told apart.

Which of its layers is an encoder's self-attention, a decoder's self-attention or cross-attention is read off the
probe pass that attached the model (:func:`multihead.hf.attach.observe`): there the encoder reads 4 tokens and the
decoder 2, so a layer with 2 queries and 4 keys is cross-attention, one with 2 and 2 the decoder's self-attention,
one with 4 and 4 the encoder's.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from .attach import attached


def parts(model: nn.Module) -> dict[str, list[str]]:
    """The attached layers of an encoder-decoder ``model`` by kind: ``encoder``, ``decoder`` (causal
    self-attention) and ``cross``, each in the model's order. From the probe pass's shapes (see the module
    docstring); a layer the shapes do not place is refused by name."""
    att = attached(model)
    enc, dec = att.probe_lengths.get("input_ids"), att.probe_lengths.get("decoder_input_ids")
    if enc is None or dec is None or enc == dec:
        raise ValueError(
            f"{type(model).__name__}: the pass that attached it did not read an encoder and a decoder input of "
            "different lengths, so its layers cannot be told apart; attach it with the default probe"
        )
    out: dict[str, list[str]] = {"encoder": [], "decoder": [], "cross": []}
    for name, rec in att.layers.items():
        lq, lk = rec.probe_lengths
        if lq == dec and lk == enc:
            out["cross"].append(name)
        elif lq == lk == dec:
            out["decoder"].append(name)
        elif lq == lk == enc:
            out["encoder"].append(name)
        else:
            raise ValueError(
                f"{name}: its probe shapes ({lq} queries, {lk} keys) place it in neither the encoder nor the decoder"
            )
    return out


class AttachedEncoder(nn.Module):
    """An attached HF text encoder called as multihead's encoders are: ``model(ids, keep) -> tensor`` (the
    masked-LM or classifier logits where the model has a head, else the last hidden state)."""

    def __init__(self, model: nn.Module, max_len: int, pad_id: int):
        super().__init__()
        self.hf = model
        self.config = SimpleNamespace(max_len=max_len, pad_id=pad_id, positional="learned")

    def forward(self, ids: Tensor, keep: Tensor | None = None) -> Tensor:
        out = self.hf(input_ids=ids, attention_mask=keep)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state


class AttachedVision(nn.Module):
    """An attached HF vision transformer called as multihead's are: ``model(pixels (B, C, H, W)) -> logits``
    (None-classifier backbones return their last hidden state; ``fc`` is None for them)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.hf = model
        c = model.config
        patch = getattr(c, "patch_size", 16)
        patch = patch[0] if isinstance(patch, (list, tuple)) else patch
        size = getattr(c, "image_size", 224)
        size = size[0] if isinstance(size, (list, tuple)) else size
        offset = 1 + int(getattr(c, "num_register_tokens", 0) or 0)  # [CLS] and any register tokens
        self.config = SimpleNamespace(patch_size=int(patch), image_size=int(size), patch_offset=offset)
        self.fc = getattr(model, "classifier", None)
        labels = getattr(c, "id2label", None) or {}
        self.labels = [labels[i] for i in sorted(labels)] if self.fc is not None else None

    def forward(self, pixels: Tensor) -> Tensor:
        out = self.hf(pixel_values=pixels)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state


@dataclass
class AttachedFolder:
    """An HF folder read by transformers and attached: ``role`` (``encoder``, ``seq2seq`` or ``vision``), the HF
    model ``hf``, its ``tokenizer`` (a ``tokenizers.Tokenizer`` whose post-processor adds the model's special tokens;
    None for images), ``family`` (``hf:<model_type>``) and the folder's ``config.json``."""

    path: Path
    role: str
    hf: nn.Module
    tokenizer: object
    family: str
    hf_config: dict

    @property
    def max_len(self) -> int:
        c = self.hf.config
        return int(getattr(c, "max_position_embeddings", 0) or getattr(c, "n_positions", 0) or 512)

    @property
    def pad_id(self) -> int:
        pad = getattr(self.hf.config, "pad_token_id", None)
        return pad if isinstance(pad, int) and pad >= 0 else 0

    @cached_property
    def model(self) -> nn.Module:
        """The model behind multihead's calling convention (the HF model itself for sequence-to-sequence)."""
        if self.role == "encoder":
            return AttachedEncoder(self.hf, self.max_len, self.pad_id)
        if self.role == "vision":
            return AttachedVision(self.hf)
        return self.hf

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with the special tokens the tokenizer adds (an encoder's [CLS]/[SEP], a translation
        model's end of sentence)."""
        ids = self.tokenizer.encode(text).ids
        if not ids:
            raise ValueError("the text encodes to no tokens; pass some text")
        return ids

    def tokens(self, ids) -> list[str]:
        """Each id as people read it (byte-level BPE's ``Ġ`` and SentencePiece's ``▁`` word marks dropped)."""
        out = []
        for i in ids:
            t = self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>"
            t = t[1:] if t[:1] in ("Ġ", "▁") and len(t) > 1 else t
            out.append(t)
        return out

    @property
    def decoder_start(self) -> int:
        """The token a sequence-to-sequence decoder starts from (a ValueError naming the fix where the config's is
        no token of the decoder's vocabulary)."""
        start = getattr(getattr(self.hf, "generation_config", None), "decoder_start_token_id", None)
        start = getattr(self.hf.config, "decoder_start_token_id", None) if start is None else start
        vocab = self.hf.get_output_embeddings().weight.shape[0]
        if not (isinstance(start, int) and 0 <= start < vocab):
            raise ValueError(
                f"{self.path / 'config.json'}: decoder_start_token_id is {start!r}, which is no token of the decoder's "
                f"{vocab:,}; set it to the id the decoder starts from (often the pad or the end-of-sentence id)"
            )
        return start

    def pixels(self, photo) -> tuple[Tensor, Tensor]:
        """A PIL photograph as the vision model reads it: the centre crop of its ``image_size`` (resized so the
        shorter side is ``size * 256 / 224``), normalised with the mean and standard deviation of the folder's
        ``preprocessor_config.json`` (0.5 and 0.5, ViT's, without one). Returns ``(uint8 (1, 3, S, S), float)``."""
        from ..pretrained.families.dinov2 import square
        from ..pretrained.formats.hf import read_json

        if self.role != "vision":
            raise ValueError(f"{self.path} is {self.role}; pixels are for an image model")
        size, patch = self.model.config.image_size, self.model.config.patch_size
        pre = self.path / "preprocessor_config.json"
        cfg = read_json(pre, "preprocessor config") if pre.is_file() else {}
        stats = []
        for key in ("image_mean", "image_std"):
            v = cfg.get(key, [0.5, 0.5, 0.5])
            numbers = isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
            if not (numbers and len(v) == 3):
                raise ValueError(f"{pre}: {key} is {v!r}; it must be three numbers (one per colour channel)")
            if not all(math.isfinite(x) and abs(x) < 1e6 for x in v):  # NaN, Infinity or 1e308 would fill the picture
                raise ValueError(
                    f"{pre}: {key} is {v!r}; it must be three finite numbers, such as ViT's 0.5, 0.5, 0.5 (fix or "
                    "remove the entry)"
                )
            stats.append(torch.tensor(v, dtype=torch.float32)[:, None, None])
        if not bool((stats[1] >= 1e-6).all()):  # dividing by 0 (or nearly) makes every pixel infinite
            raise ValueError(
                f"{pre}: image_std must be positive (one per colour channel, such as ViT's 0.5), got "
                f"{stats[1].flatten().tolist()}"
            )
        u8, _ = square(photo, size=size, patch=patch)
        return u8, (u8.float() / 255.0 - stats[0]) / stats[1]

    @torch.no_grad()
    def translate(self, ids: list[int], *, max_new_tokens: int = 64) -> list[int]:
        """Greedy decoding of a sequence-to-sequence model with HF's own ``generate`` (its cache, multihead's
        attention): the decoder's tokens, starting with its start token."""
        if self.role != "seq2seq":
            raise ValueError(f"{self.path} is {self.role}; translation needs a sequence-to-sequence model")
        start = self.decoder_start
        x = torch.tensor([ids], device=next(self.hf.parameters()).device)
        out = self.hf.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            decoder_input_ids=torch.tensor([[start]], device=x.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
        )
        return [int(t) for t in out[0]]


class NextToken(nn.Module):
    """A sequence-to-sequence model as a function of its encoder's input: ``model(ids (B, L)) -> logits (B, T, V)``
    of the decoder reading ``prefix`` (its start token and any tokens before the one asked about), so that patching
    the encoder's input compares what the decoder predicts next."""

    def __init__(self, model: nn.Module, prefix: list[int]):
        super().__init__()
        self.hf = model
        self.register_buffer("prefix", torch.tensor([prefix]), persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        return self.hf(input_ids=ids, decoder_input_ids=self.prefix.expand(ids.shape[0], -1)).logits


__all__ = ["AttachedEncoder", "AttachedFolder", "AttachedVision", "NextToken", "parts"]
