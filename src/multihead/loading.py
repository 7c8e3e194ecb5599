"""One way to load anything multihead can run or look inside, by name: ``multihead.loading.load(source)``.

``source`` is a training run folder (its classifier, tokenizer and ``data.max_len``), a pretrained short name
(``minilm``) or an HF BERT-family folder (a :class:`~multihead.models.TextEncoder`), or a pretrained causal LM
(``smollm2``, a ``.gguf`` file, an HF Llama-family or GPT-2 folder: :mod:`multihead.lm`). ``interpret`` (pictures, roles),
``embed`` and ``export`` all load through here, so they sit beside each other above ``train`` and ``pretrained``
rather than on top of one another. Everything is validated before it is built (see :mod:`multihead._config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ._io import folder_kind


@dataclass
class Loaded:
    """A model with the tokenizer that feeds it.

    ``max_len``: the most tokens it reads (a run's ``data.max_len``; a pretrained model's positions).
    ``sentence_max_len``: what sentence embeddings cut texts to (sentence-transformers' ``max_seq_length``, 256 for
    MiniLM; a run's ``data.max_len``).
    """

    source: str
    kind: str  # "run" | "pretrained" | "lm" (a pretrained causal LM: multihead.lm)
    model: nn.Module
    tokenizer: object
    max_len: int
    sentence_max_len: int
    detail: object  # the train.Run or pretrained.Pretrained it came from


LM_READ = 512  # tokens a causal LM reads by default in show/heads (--max-len lifts it: rotary positions)


def is_run(path: str | Path) -> bool:
    """A run folder, even a damaged one (so that loading it gives the run folder's own messages)."""
    path = Path(str(path))
    return folder_kind(path) == "run" or (path / "labels.json").is_file()


def load(source: str | Path, *, device: str = "cpu", backend: str = "auto") -> Loaded:
    """A run folder, a pretrained short name or an HF BERT-family folder, loaded for inference (eval mode)."""
    if is_run(source):
        from .train import load_run, tasks

        kind = tasks.kind_of(source)
        if kind is not None and kind.section != "train":
            raise tasks.ConfigError(
                f"{source} is a {kind.title} run; this reads text classifiers and pretrained "
                "encoders (run folders of `multihead train` on text, minilm, HF BERT folders)"
            )

        run = load_run(source, device=device)
        return Loaded(
            str(source), "run", run.model, run.tokenizer, run.config.data.max_len, run.config.data.max_len, run
        )
    from . import lm

    if lm.is_lm_source(source):
        p = lm.load(source, backend=backend, device=device)
        return Loaded(str(source), "lm", p.model, p.tokenizer, LM_READ, LM_READ, p)
    from . import pretrained

    p = pretrained.load(source, backend=backend, device=device)
    return Loaded(str(source), "pretrained", p.model, p.tokenizer, p.model.config.max_len, p.max_seq_length, p)


__all__ = ["Loaded", "is_run", "load"]
