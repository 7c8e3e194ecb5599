"""A speech encoder-decoder (Whisper's layout; Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak
Supervision") on our encoder and decoder blocks.

Log-mel features ``(B, n_mels, frames)`` -> two 1-D convolutions with GELU (the second with stride 2: 3,000 frames
of 10 ms -> 1,500 positions of 20 ms) -> + fixed position table -> pre-LN :class:`TransformerEncoder` (final
LayerNorm) = the memory. Text: token embeddings + learned positions -> pre-LN :class:`TransformerDecoder` with
causal self-attention and cross-attention to the memory (final LayerNorm) -> logits through the tied embedding
matrix. Every attention is a :class:`~multihead.MultiHeadAttention`: hooks, ``capture``, ``head_mask``, the
backends and the KV cache work unchanged, and the decoding protocol (``prefill``/``step``) lets
:func:`~multihead.models.generation.generate` run greedy and beam search with the cross-attention keys and values
computed once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._config import from_fields
from ..modules.decoder import DecoderConfig, TransformerDecoder
from ..modules.encoder import EncoderConfig, TransformerEncoder
from ..modules.kv import KVCache
from ..modules.positional import check_positions


def _encoder() -> EncoderConfig:
    return EncoderConfig(
        d_model=384, num_heads=6, num_layers=4, d_ff=1536, dropout=0.0, activation="gelu", norm_first=True
    )


def _decoder() -> DecoderConfig:
    return DecoderConfig(
        d_model=384,
        num_heads=6,
        num_layers=4,
        d_ff=1536,
        dropout=0.0,
        activation="gelu",
        norm_first=True,
        cross_attention=True,
    )


@dataclass
class SpeechConfig:
    """Everything that defines a :class:`SpeechSeq2Seq` (defaults: Whisper tiny)."""

    n_mels: int = 80
    vocab_size: int = 51864
    max_source_positions: int = 1500  # encoder positions (frames / 2)
    max_target_positions: int = 448
    encoder: EncoderConfig = field(default_factory=_encoder)
    decoder: DecoderConfig = field(default_factory=_decoder)

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        if isinstance(self.decoder, dict):
            self.decoder = DecoderConfig.from_dict(self.decoder)
        if not self.decoder.cross_attention or self.encoder.d_model != self.decoder.d_model:
            raise ValueError("a speech encoder-decoder needs a decoder with cross-attention, of the encoder's width")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SpeechConfig:
        return from_fields(cls, d)


class SpeechSeq2Seq(nn.Module):
    """Log-mel features -> text logits (see the module docstring). Hook points: those of every block under
    ``encoder.layers.{i}.`` and ``decoder.layers.{i}.`` (``decoder.layers.3.cross_attn.hook_pattern`` ``(B, H, T,
    S)``: which 20 ms frames each text token reads)."""

    def __init__(self, config: SpeechConfig | None = None) -> None:
        super().__init__()
        config = SpeechConfig() if config is None else config
        self.config = config
        e = config.encoder.d_model
        self.conv1 = nn.Conv1d(config.n_mels, e, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(e, e, kernel_size=3, stride=2, padding=1)
        self.register_buffer("enc_pos", torch.zeros(config.max_source_positions, e))  # loaded (Whisper: sinusoids)
        self.encoder = TransformerEncoder(config.encoder)
        self.embed = nn.Embedding(config.vocab_size, e)
        self.dec_pos = nn.Parameter(torch.zeros(config.max_target_positions, e))
        self.decoder = TransformerDecoder(config.decoder)

    @property
    def frames(self) -> int:
        """Input frames the encoder takes (Whisper: 3,000, 30 s of 10 ms hops)."""
        return 2 * self.config.max_source_positions

    def encode(self, features: Tensor) -> Tensor:
        """``features`` ``(B, n_mels, frames)`` -> memory ``(B, S, E)``."""
        c = self.config
        if features.dim() != 3 or features.shape[1] != c.n_mels or features.shape[2] != self.frames:
            raise ValueError(
                f"features must be (B, {c.n_mels}, {self.frames}) log-mel frames (30 s of audio; "
                f"shorter audio is padded with silence first); got {tuple(features.shape)}"
            )
        x = F.gelu(self.conv1(features))
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # (B, S, E)
        return self.encoder(x + self.enc_pos[: x.shape[1]].to(x.dtype))

    def decode(self, tokens: Tensor, memory: Tensor | None, *, cache: KVCache | None = None) -> Tensor:
        """Logits ``(B, T, V)`` for ``tokens`` ``(B, T)`` (all positions, or the new ones after ``cache``)."""
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids (B, T), got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must be in [0, {self.config.vocab_size}); got {int(tokens.min())}..{int(tokens.max())}"
            )
        before = 0 if cache is None or cache.next_position is None else int(cache.next_position[0])
        positions = torch.arange(before, before + tokens.shape[1], device=tokens.device)
        check_positions(positions[None], self.config.max_target_positions)
        x = self.embed(tokens) + self.dec_pos[positions]
        x = self.decoder(x, memory, cache=cache)
        if cache is not None:
            cache.next_position = torch.full((tokens.shape[0],), before + tokens.shape[1], device=tokens.device)
        return x @ self.embed.weight.t()

    def forward(self, features: Tensor, tokens: Tensor) -> Tensor:
        """Teacher forcing: logits ``(B, T, V)``."""
        return self.decode(tokens, self.encode(features))

    # ------------------------------------------------------------------ the decoding protocol
    def prefill(self, features: Tensor, prompt: Tensor) -> tuple[Tensor, KVCache]:
        """Encode once and read the prompt (e.g. Whisper's ``<|startoftranscript|><|notimestamps|>``): the logits
        ``(B, V)`` after it and the cache (cross-attention keys and values computed here, once)."""
        memory = self.encode(features)
        cache = self.decoder.new_cache()
        if prompt.shape[0] != features.shape[0]:
            prompt = prompt.expand(features.shape[0], -1)
        return self.decode(prompt, memory, cache=cache)[:, -1], cache

    def step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        return self.decode(tokens[:, None], None, cache=cache)[:, -1]


__all__ = ["SpeechConfig", "SpeechSeq2Seq"]
