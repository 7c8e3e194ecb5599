"""What every causal language model multihead analyses answers, whichever way it was read: multihead's own
:class:`~multihead.models.seq2seq.CausalLM` and an HF model attached (:class:`multihead.hf.folder.AttachedLM`)
both implement :class:`LanguageModel`, so an analysis asks the model instead of asking what it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class LanguageModel(Protocol):
    """A causal LM: ``model(ids (B, L), keep=None, head_mask=None, cache=None) -> logits (B, L, V)``, with
    ``config`` holding at least ``max_len``, ``pad_id``, ``vocab_size`` and ``positional``."""

    config: Any

    def __call__(
        self, ids: Tensor, keep: Tensor | None = None, head_mask: Tensor | None = None, cache=None
    ) -> Tensor: ...

    def new_cache(self, *, policy=None, budget: int | None = None, record=False, prompt_only: bool = False, **options):
        """An empty cache (every key; a streaming window; or a KV policy with its budget). ``extrapolate=True``:
        positions may run past the model's trained length (measuring what happens there)."""
        ...

    def prefill(self, ids: Tensor, keep: Tensor | None = None, cache=None) -> tuple[Tensor, Any]:
        """The prompt read once: the last position's logits ``(B, V)`` and the filled cache."""
        ...

    def step(self, tokens: Tensor, cache) -> Tensor:
        """One token per row ``(B,)`` in, its logits ``(B, V)`` out."""
        ...

    def check_policy(self) -> None:
        """Refuse, with the reason, a model whose layers a KV-policy cache cannot follow."""
        ...

    def head_layout(self) -> tuple[int, int, int]:
        """``(layers, query heads, key/value heads)``."""
        ...

    def pruned(self, heads: dict[int, list[int]]) -> LanguageModel:
        """A copy with ``heads`` (``{layer: [query heads]}``, whole key/value groups) removed from its weights."""
        ...

    def why_not_save_pruned(self) -> str | None:
        """Why :meth:`save_pruned` cannot write this model (None: it can), asked before any work."""
        ...

    def save_pruned(self, folder: Path, *, tokenizer_from: str | Path | None = None) -> dict:
        """Write this (pruned) model into ``folder`` as files its reader loads, checked; what was written."""
        ...


__all__ = ["LanguageModel"]
