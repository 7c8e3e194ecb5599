"""MHA's decoder roles as models: :class:`CausalLM` (decoder-only, GPT-style: causal self-attention) and
:class:`Seq2Seq` (Vaswani et al.'s encoder-decoder: the decoder's cross-attention reads the encoder's output).

Both decode incrementally with a :class:`~multihead.modules.kv.KVCache` through one small protocol that
:mod:`multihead.models.generation` drives: ``prefill(...) -> (logits of the last position (B, V), cache)`` then
``step(tokens (B,), cache) -> logits (B, V)``. Prompts of different lengths are **left-padded** (their last column
is real, so every row's next-token logits sit in one column); positions are counted per row over real tokens only,
so a padded row computes exactly what it would alone.

Shape legend: ``B`` batch, ``T`` target positions, ``S`` source positions, ``E`` d_model, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from .._config import check_size, from_fields
from ..modules.decoder import DecoderConfig, TransformerDecoder
from ..modules.encoder import EncoderConfig, TransformerEncoder
from ..modules import fastpath
from ..modules.kv import KVCache
from ..modules.positional import build_positional, check_positions

POSITIONALS = ("sinusoidal", "learned", "rope", "none")
CAUSAL_POSITIONALS = POSITIONALS + ("alibi",)  # a CausalLM also takes ALiBi (distance biases inside attention)


def _positions(keep: Tensor, before: Tensor | None) -> Tensor:
    """Per-row positions ``(B, T)`` of the new tokens: real tokens counted from 0 (``before`` real tokens already
    cached); padding sits at the position of the next real token (it is masked as a key and never read)."""
    pos = keep.long().cumsum(-1) - keep.long()  # real tokens before each column
    return pos if before is None else pos + before[:, None]


def _check_ids(ids: Tensor, vocab: int, name: str) -> None:
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be integer token ids, got {ids.dtype}")
    if ids.dim() != 2:
        raise ValueError(
            f"{name} must be (B, L), got shape {tuple(ids.shape)}"
            + (f" (add a batch axis: {name}.unsqueeze(0))" if ids.dim() == 1 else "")
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(
            f"{name} holds ids outside [0, {vocab}): {int(ids.min())}..{int(ids.max())}; the "
            "tokenizer and the model's vocab_size disagree"
        )


def _check_keep(keep: Tensor | None, ids: Tensor, name: str) -> Tensor:
    if keep is None:
        return torch.ones_like(ids, dtype=torch.bool)
    if keep.dtype != torch.bool or keep.shape != ids.shape:
        raise ValueError(
            f"{name} must be bool {tuple(ids.shape)} with True = real token, got {keep.dtype} {tuple(keep.shape)}"
        )
    return keep


@dataclass
class CausalLMConfig:
    """Everything that defines a :class:`CausalLM`; round-trips through JSON."""

    vocab_size: int = 10000
    max_len: int = 512  # positions the model has (prompt + generated)
    positional: str = "learned"
    pad_id: int = 0
    tie_embeddings: bool = True  # output projection = token embedding matrix (Press & Wolf 2017)
    embed_scale: bool = False  # token embeddings times sqrt(d_model) (Gemma)
    decoder: DecoderConfig = field(default_factory=lambda: DecoderConfig(cross_attention=False, norm_first=True))

    def __post_init__(self) -> None:
        if isinstance(self.decoder, dict):
            self.decoder = DecoderConfig.from_dict(self.decoder)
        if self.positional not in CAUSAL_POSITIONALS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; choose one of {CAUSAL_POSITIONALS}")
        if self.decoder.cross_attention:
            raise ValueError(
                "a CausalLM's decoder has no cross-attention; set decoder.cross_attention=False (or use Seq2Seq)"
            )
        self.decoder.rotary = self.positional == "rope"
        self.decoder.attention.alibi = self.positional == "alibi"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CausalLMConfig:
        return from_fields(cls, d)

    def parameter_estimate(self) -> int:
        e, dec = self.decoder.d_model, self.decoder
        kv = e // max(dec.num_heads, 1) * (dec.attention.num_kv_heads or dec.num_heads)  # key/value width (GQA)
        ffn_mats = 3 if dec.activation in ("swiglu", "geglu") else 2
        per_layer = 2 * e * e + 2 * e * kv + ffn_mats * e * (4 * e if dec.d_ff is None else dec.d_ff)
        positions = self.max_len * e if self.positional == "learned" else 0  # a table of max_len rows
        return self.vocab_size * e * (1 if self.tie_embeddings else 2) + dec.num_layers * per_layer + positions


class CausalLM(nn.Module):
    """Decoder-only language model: token + position embeddings -> causal decoder blocks -> next-token logits."""

    def __init__(self, config: CausalLMConfig | None = None, **overrides) -> None:
        super().__init__()
        config = CausalLMConfig(**overrides) if config is None else config
        check_size(config.parameter_estimate())
        self.config = config
        e = config.decoder.d_model
        self.embed = nn.Embedding(config.vocab_size, e)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = build_positional(
            "none" if config.positional == "alibi" else config.positional, e, config.max_len, config.decoder.dropout
        )
        self.drop = nn.Dropout(config.decoder.dropout) if self.pos is None else nn.Identity()
        self.decoder = TransformerDecoder(config.decoder)
        self.lm_head = nn.Linear(e, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(
        self,
        ids: Tensor,
        keep: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        head_mask: Tensor | None = None,
        resid: Tensor | None = None,
        start_at_layer: int = 0,
        logits_at: int | None = None,
    ) -> Tensor:
        """Logits ``(B, T, V)`` for every position of ``ids`` ``(B, T)`` (``keep``: True = real token). With a
        ``cache``, ``ids`` are the new tokens after the cached ones and the cache is extended.

        Interventions rerun part of the model: ``resid`` ``(B, T, E)`` is the residual stream entering layer
        ``start_at_layer`` (the embedding and the layers before it are skipped; ``ids`` still give the positions);
        ``logits_at`` projects only that position to the vocabulary, ``(B, 1, V)``."""
        if start_at_layer and resid is None:
            raise ValueError("start_at_layer= needs resid=: the residual stream entering that layer")
        _check_ids(ids, self.config.vocab_size, "ids")
        unpadded = keep is None  # every token real: no key padding to carry (decoding steps, unpadded prompts)
        keep = _check_keep(keep, ids, "keep")
        before = None if cache is None else cache.next_position
        positions = _positions(keep, before)
        rolling = cache is not None and cache.rolling
        if cache is not None and cache.policy is not None and not bool(keep.all()):
            raise ValueError(
                "a KV-policy cache evicts keys per row and takes unpadded rows (every prompt the same length): "
                "run padded prompts one at a time, or use the full cache"
            )
        if rolling or (cache is not None and cache.extrapolate):
            self._check_streaming(keep, rolling)
        elif self.config.positional != "alibi":  # ALiBi has no table: any length runs (max_len: the trained one)
            check_positions(positions, self.config.max_len)
        if resid is None:
            x = self.embed(ids)  # (B, T, E)
            if self.config.embed_scale:
                x = x * torch.tensor(self.config.decoder.d_model**0.5, dtype=x.dtype)
            x = self.drop(x) if self.pos is None else self.pos(x, positions=positions)
        else:
            if resid.shape[:2] != ids.shape:
                raise ValueError(f"resid {tuple(resid.shape)} must be (B, T, E) for ids {tuple(ids.shape)}")
            x = resid
        if rolling or (unpadded and (cache is None or cache.key_padding is None)):  # every key is a real token
            full_keep = None
        else:
            full_keep = keep if cache is None or cache.key_padding is None else torch.cat([cache.key_padding, keep], 1)
        x = self.decoder(
            x,
            key_padding_mask=full_keep,
            cache=cache,
            positions=positions,
            head_mask=head_mask,
            start_at_layer=start_at_layer,
        )
        if cache is not None:
            cache.key_padding = full_keep
            cache.next_position = keep.long().sum(-1) + (0 if before is None else before)
        if logits_at is not None:
            if not -x.shape[1] <= logits_at < x.shape[1]:
                raise ValueError(f"logits_at={logits_at} is outside the {x.shape[1]} positions of this call")
            x = x.narrow(1, logits_at % x.shape[1], 1)
        return fastpath.linear(x, self.lm_head.weight, None, self.lm_head)  # (B, T, V)

    def _check_streaming(self, keep: Tensor, rolling: bool) -> None:
        what = "a streaming (sinks + window) cache" if rolling else "running past max_len (extrapolate=True)"
        if rolling and self.config.decoder.sliding_window is not None:
            raise ValueError(
                "a streaming (sinks + window) cache cannot serve a model with sliding-window layers: "
                "their window is counted in cache slots; use the full cache"
            )
        # no table, any length: rotary (positions computed), ALiBi (distances), none (MLA's own rotary key, or none)
        if self.config.positional not in ("rope", "alibi", "none") or (rolling and self.config.positional != "rope"):
            raise ValueError(
                f"{what} needs rotary positions: a {self.config.positional!r} position table has no "
                f"entry beyond max_len={self.config.max_len}; build the model with positional='rope'"
                + ("" if rolling else " (or 'alibi')")
            )
        if rolling and not bool(keep.all()):
            raise ValueError(
                "a streaming cache takes unpadded rows (every row the same length): positions are "
                "slots in the cache, shared by the batch"
            )

    # ------------------------------------------------------------------ the decoding protocol
    def new_cache(
        self,
        *,
        sinks: int | None = None,
        window: int | None = None,
        policy=None,
        budget: int | None = None,
        record: bool | Sequence = False,
        extrapolate: bool = False,
        prompt_only: bool = False,
        **options,
    ) -> KVCache:
        """An empty cache. ``window``: a StreamingLLM cache of ``sinks`` (default 4) first tokens plus the last
        ``window`` ones, at positions within the cache (rotary models; the same as ``policy="streaming"`` with
        ``budget = sinks + window``).

        ``policy``: a :class:`~multihead.modules.kv.KVPolicy` or its name in
        :data:`~multihead.modules.kv.KV_POLICIES` (``full``, ``window``, ``h2o``, ``snapkv``, ``tova``,
        ``knorm``, ``pyramidkv``, ``adakv``, ``expected``, ``streaming``, ``head-aware``...) with its ``budget`` (keys kept per head) and ``options``
        (``full_heads=`` for ``head-aware``). ``record=True``: every key is kept and the prompt's scores recorded, so that
        :meth:`KVCache.compress` applies any policy to one prefill (a list of policies or their classes: what those
        read only, which spares the whole attention map where none of them needs it). ``prompt_only=True``: the policy evicts once,
        after the prompt, then keeps every new token (kvpress's protocol; by default it keeps its budget while
        decoding). ``extrapolate=True`` (every key): positions may run past ``max_len`` (rotary models; measuring what
        happens there)."""
        if policy is None and not record:
            if budget is not None or options:
                raise ValueError("budget= and policy options need policy= (a name in KV_POLICIES or a KVPolicy)")
            if window is None:
                cache = self.decoder.new_cache()
                cache.extrapolate = extrapolate
                return cache
            return KVCache.streaming(len(self.decoder.layers), sinks=4 if sinks is None else sinks, window=window)
        if window is not None:
            raise ValueError(
                "window= makes a StreamingLLM cache; with policy= use policy='streaming' (or 'window') and budget="
            )
        if sinks is not None:  # a policy option here (the window and streaming policies take it)
            options["sinks"] = sinks
        from ..modules.kv import make_policy, policy_cache

        self.check_policy()
        made = make_policy("full" if policy is None else policy, budget, **options)
        dec = self.decoder
        w = dec.config.sliding_window
        return policy_cache(
            made,
            [layer.self_attn.num_kv_heads for layer in dec.layers],
            [w if local else None for local in dec.local],
            record=record,
            prompt_only=prompt_only,
        )

    def check_policy(self) -> None:
        """Refuse, with the reason, a model whose layers a KV-policy cache cannot follow (ALiBi, latent
        attention)."""
        if self.config.positional == "alibi":
            raise ValueError(
                "KV policies keep keys at their original positions, and ALiBi's per-head distances are built into "
                "the mask of the whole call: use a rotary model, or the full cache"
            )
        from ..modules.attention import MultiHeadAttention

        other = sorted({type(x.self_attn).__name__ for x in self.decoder.layers} - {MultiHeadAttention.__name__})
        if any(not isinstance(layer.self_attn, MultiHeadAttention) for layer in self.decoder.layers):
            raise ValueError(
                f"KV policies evict cached keys per head; {', '.join(other)} caches a compressed latent "
                "instead (Multi-head Latent Attention): use the full cache"
            )

    def _check_policy(self) -> None:
        """Deprecated spelling of :meth:`check_policy`."""
        import warnings

        warnings.warn("CausalLM._check_policy is deprecated; use check_policy()", DeprecationWarning, 2)
        self.check_policy()

    def head_layout(self) -> tuple[int, int, int]:
        """``(layers, query heads, key/value heads)`` (the first layer's counts)."""
        attn = self.decoder.layers[0].self_attn
        return len(self.decoder.layers), attn.num_heads, attn.num_kv_heads

    def clone(self) -> CausalLM:
        """An independent copy (weights, buffers and layout)."""
        import copy

        return copy.deepcopy(self)

    def pruned(self, heads: dict[int, list[int]]) -> CausalLM:
        """A copy with ``heads`` (``{layer: [query heads]}``, whole key/value groups) removed from its weights;
        ``self`` is unchanged."""
        clone = self.clone()
        for layer, hs in heads.items():
            clone.decoder.layers[layer].self_attn.prune_heads(hs)
        return clone

    def why_not_save_pruned(self) -> str | None:
        """Why :meth:`save_pruned` cannot write this model (None: it can)."""
        return (
            "saving pruned models as HF folders is for HF models read by transformers (an HF folder with no "
            "native family); multihead's own decoders are pruned in memory (perplexity and speed are measured)"
        )

    def save_pruned(self, folder, *, tokenizer_from=None) -> dict:
        """Refused (:meth:`why_not_save_pruned`): multihead's own decoders are pruned in memory."""
        raise ValueError(self.why_not_save_pruned())

    def prefill(self, ids: Tensor, keep: Tensor | None = None, cache: KVCache | None = None) -> tuple[Tensor, KVCache]:
        """Run the (left-padded) prompt once: the last position's logits ``(B, V)`` and the filled cache (``cache``:
        an empty one to fill, e.g. :meth:`new_cache` with a window)."""
        checked = _check_keep(keep, ids, "keep")
        if ids.shape[1] == 0 or not bool(checked[:, -1].all()):
            raise ValueError(
                "prompts must be left-padded and non-empty: the last column of every row must be a "
                "real token (pad on the left, e.g. data.collate(..., left=True))"
            )
        if not torch.is_grad_enabled():
            fastpath.prepare(self)  # the weights laid out for decoding, once (a no-op off the CPU)
        cache = self.decoder.new_cache() if cache is None else cache
        room = cache.self_attn[0].capacity - cache.length if cache.rolling else ids.shape[1]
        if ids.shape[1] > max(room, 1):  # a streaming cache reads what fills it at once, then a token at a time
            head = max(room, 1)
            logits = self(ids[:, :head], None if keep is None else keep[:, :head], cache=cache)
            for t in range(head, ids.shape[1]):
                logits = self(ids[:, t : t + 1], cache=cache)
            return logits[:, -1], cache
        return self(ids, keep, cache=cache)[:, -1], cache  # keep None: no padding to carry through the cache

    def step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """Feed one token per row ``(B,)``; its logits ``(B, V)``. Where nothing needs the general path (no
        gradients, hooks, KV policy or padding, plain layers) the step runs its arithmetic alone
        (:mod:`multihead.models.fast_decode`)."""
        from . import fast_decode

        if fast_decode.why_not(self, cache) is None:
            return fast_decode.step(self, tokens, cache)
        return self(tokens[:, None], cache=cache)[:, -1]


@dataclass
class Seq2SeqConfig:
    """Everything that defines a :class:`Seq2Seq`; round-trips through JSON."""

    src_vocab_size: int = 10000
    tgt_vocab_size: int = 10000
    max_len: int = 256  # positions on each side
    positional: str = "sinusoidal"
    pad_id: int = 0
    bos_id: int = 1  # the decoder's start token
    share_embeddings: bool = False  # one embedding matrix for source and target (needs one vocabulary)
    tie_output: bool = True  # output projection = target embedding matrix
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        if isinstance(self.decoder, dict):
            self.decoder = DecoderConfig.from_dict(self.decoder)
        if self.positional not in POSITIONALS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; choose one of {POSITIONALS}")
        if self.encoder.d_model != self.decoder.d_model:
            raise ValueError(
                f"encoder d_model {self.encoder.d_model} != decoder d_model {self.decoder.d_model}; "
                "cross-attention needs one width"
            )
        if not self.decoder.cross_attention:
            raise ValueError("a Seq2Seq decoder needs cross-attention; set decoder.cross_attention=True")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size")
        self.encoder.rotary = self.decoder.rotary = self.positional == "rope"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Seq2SeqConfig:
        return from_fields(cls, d)

    def parameter_estimate(self) -> int:
        e = self.encoder.d_model
        enc = self.encoder.num_layers * (4 * e * e + 2 * e * (self.encoder.d_ff or 4 * e))
        dec = self.decoder.num_layers * (8 * e * e + 2 * e * (self.decoder.d_ff or 4 * e))
        emb = (self.src_vocab_size * (0 if self.share_embeddings else 1) + self.tgt_vocab_size) * e
        positions = 2 * self.max_len * e if self.positional == "learned" else 0  # a table on each side
        return emb + enc + dec + positions + (0 if self.tie_output else self.tgt_vocab_size * e)


class Seq2Seq(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017): ``encode(src)`` once, then the decoder attends causally to
    its own past and, through cross-attention, to every source position."""

    def __init__(self, config: Seq2SeqConfig | None = None, **overrides) -> None:
        super().__init__()
        config = Seq2SeqConfig(**overrides) if config is None else config
        check_size(config.parameter_estimate())
        self.config = config
        e = config.encoder.d_model
        self.scale = math.sqrt(e)  # embeddings times sqrt(d_model), as in the paper (section 3.4)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, e)
        self.src_embed = self.tgt_embed if config.share_embeddings else nn.Embedding(config.src_vocab_size, e)
        # in a fixed order (a set's order follows object addresses: the same seed gave different weights per process)
        for emb in dict.fromkeys((self.tgt_embed, self.src_embed)):
            nn.init.normal_(emb.weight, std=e**-0.5)
        self.src_pos = build_positional(config.positional, e, config.max_len, config.encoder.dropout)
        self.tgt_pos = build_positional(config.positional, e, config.max_len, config.decoder.dropout)
        self.encoder = TransformerEncoder(config.encoder)
        self.decoder = TransformerDecoder(config.decoder)
        self.out = nn.Linear(e, config.tgt_vocab_size, bias=False)
        if config.tie_output:
            self.out.weight = self.tgt_embed.weight

    def encode(self, src: Tensor, src_keep: Tensor | None = None) -> Tensor:
        """The encoder's output ``(B, S, E)`` (padded positions included; the decoder masks them)."""
        _check_ids(src, self.config.src_vocab_size, "src")
        src_keep = _check_keep(src_keep, src, "src_keep")
        check_positions(_positions(src_keep, None), self.config.max_len)
        x = self.src_embed(src) * self.scale
        if self.src_pos is not None:
            x = self.src_pos(x)
        return self.encoder(x, key_padding_mask=src_keep)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_keep: Tensor | None = None,
        tgt_keep: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        head_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(B, T, V)`` for target positions ``tgt`` (teacher forcing, or the new ones after ``cache``)."""
        _check_ids(tgt, self.config.tgt_vocab_size, "tgt")
        tgt_keep = _check_keep(tgt_keep, tgt, "tgt_keep")
        before = None if cache is None else cache.next_position
        positions = _positions(tgt_keep, before)
        check_positions(positions, self.config.max_len)
        x = self.tgt_embed(tgt) * self.scale
        if self.tgt_pos is not None:
            x = self.tgt_pos(x, positions=positions)
        full_keep = (
            tgt_keep if cache is None or cache.key_padding is None else torch.cat([cache.key_padding, tgt_keep], 1)
        )
        x = self.decoder(
            x,
            memory,
            key_padding_mask=full_keep,
            memory_key_padding_mask=src_keep,
            cache=cache,
            positions=positions,
            head_mask=head_mask,
        )
        if cache is not None:
            cache.key_padding = full_keep
            cache.next_position = tgt_keep.long().sum(-1) + (0 if before is None else before)
            cache.memory_keep = src_keep
        return self.out(x)

    def forward(
        self, src: Tensor, tgt: Tensor, src_keep: Tensor | None = None, tgt_keep: Tensor | None = None
    ) -> Tensor:
        """Teacher forcing: logits ``(B, T, V)`` predicting ``tgt[:, 1:]`` from ``tgt[:, :-1]`` when ``tgt``
        starts with BOS (the caller shifts)."""
        return self.decode(tgt, self.encode(src, src_keep), src_keep, tgt_keep)

    # ------------------------------------------------------------------ the decoding protocol
    def prefill(self, src: Tensor, src_keep: Tensor | None = None) -> tuple[Tensor, KVCache]:
        """Encode once, feed BOS: logits ``(B, V)`` of the first target token and the cache (cross-attention keys
        and values computed here, once)."""
        src_keep = _check_keep(src_keep, src, "src_keep")
        memory = self.encode(src, src_keep)
        cache = self.decoder.new_cache()
        bos = torch.full((src.shape[0], 1), self.config.bos_id, dtype=torch.long, device=src.device)
        return self.decode(bos, memory, src_keep, cache=cache)[:, -1], cache

    def step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        return self.decode(tokens[:, None], None, cache.memory_keep, cache=cache)[:, -1]


__all__ = ["CausalLM", "CausalLMConfig", "Seq2Seq", "Seq2SeqConfig"]
