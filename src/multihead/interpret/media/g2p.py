"""``multihead show RUN WORD`` for a grapheme-to-phoneme run: the three kinds of attention of an encoder-decoder.

* **encoder self-attention** -- letters attending to letters ``(H, S, S)``;
* **decoder causal self-attention** -- phonemes attending to the phonemes before them ``(H, T, T)``;
* **cross-attention** -- each phoneme attending to the letters ``(H, T, S)``: the alignment the model learned.

Rows are labelled with the phoneme each decoding step *produces* (the step reads the previous one). The same
pictures (:mod:`multihead.interpret.pages.plots`) and offline page (:mod:`multihead.interpret.pages.page`, letters on one side,
phonemes on the other for cross-attention) as the encoder's. Each cross-attention head also gets a
**monotonicity** score: the share of decoding steps whose most-attended letter does not move backwards, averaged
over a sample of held-out words (English spelling is read left to right, so alignment heads score near 1).

::

    OUT/encoder_grid, decoder_grid, cross_grid .{png,svg}   layers x heads
    OUT/alignment.{png,svg}        the most monotonic cross-attention head at full size
    OUT/monotonicity.{png,svg}     layers x heads heatmap of the score;  OUT/summary.json (scores, pronunciation)
    OUT/cross.html, encoder.html, decoder.html   offline pages
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from ..._io import Publish, atomic_write_json
from ...data import g2p as G
from ...plotting import plain, pyplot, save
from ..pages import plots
from ..maps import AttentionMaps
from ..pages.page import write_page


@contextmanager
def _recording(model):
    """Every attention's weights during one forward: ``{"encoder": [...], "decoder": [...], "cross": [...]}``,
    each a list over layers of ``(B, H, Lq, Lk)``."""
    got = {"encoder": [], "decoder": [], "cross": []}
    handles = []

    def keep(kind):
        return lambda w, hook: got[kind].append(w.detach().float().cpu())

    for layer in model.encoder.layers:
        handles.append(layer.attn.hook_pattern.add_hook(keep("encoder")))
    for layer in model.decoder.layers:
        handles.append(layer.self_attn.hook_pattern.add_hook(keep("decoder")))
        handles.append(layer.cross_attn.hook_pattern.add_hook(keep("cross")))
    try:
        yield got
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def attention_of(model, vocab: G.G2PVocab, word: str, phonemes: list[str]) -> dict[str, list[Tensor]]:
    """Teacher-forced attention of ``word`` -> ``phonemes``: per kind, per layer ``(H, Lq, Lk)``."""
    src = torch.tensor([vocab.encode_word(word)])
    tgt = torch.tensor([vocab.encode_phones(phonemes)[:-1]])  # <bos> p1 .. pn: predicts p1 .. pn <eos>
    with _recording(model) as got:
        model(src, tgt)
    return {k: [w[0] for w in v] for k, v in got.items()}


def monotonicity(cross: Tensor) -> float:
    """Share of decoding steps (after the first) whose most-attended letter is not left of the previous step's;
    ``cross`` ``(T, S)``."""
    peaks = cross.argmax(-1)
    if len(peaks) < 2:
        return 1.0
    return float((peaks[1:] >= peaks[:-1]).float().mean())


def head_monotonicity(model, vocab: G.G2PVocab, words: list[str], prons: list[list[str]]) -> Tensor:
    """``(layers, heads)`` mean monotonicity of each cross-attention head over ``words`` (with their phonemes)."""
    total = None
    for w, p in zip(words, prons):
        cross = attention_of(model, vocab, w, p)["cross"]
        scores = torch.tensor([[monotonicity(h) for h in layer] for layer in cross])
        total = scores if total is None else total + scores
    return total / max(1, len(words))


def show_g2p(run, word: str, out: Path, *, sample: int = 200, overwrite: bool = False, log=print) -> dict:
    """Pictures, pages and monotonicity scores for one word (see the module docstring), built aside and swapped in."""
    from ...train.g2p import transcribe

    t0 = time.perf_counter()
    word = G.check_word(word)
    phonemes = transcribe(run.model, run.vocab, [word])[0]
    kinds = attention_of(run.model, run.vocab, word, phonemes)
    letters = list(word) + ["<eos>"]
    produced = phonemes + ["<eos>"]
    name = f"G2P {run.path.name}"
    maps = {
        "encoder": AttentionMaps(word, letters, kinds["encoder"], f"{name} encoder self-attention"),
        "decoder": AttentionMaps(word, produced, kinds["decoder"], f"{name} decoder causal self-attention"),
        "cross": AttentionMaps(
            word, produced, kinds["cross"], f"{name} cross-attention (phoneme -> letters)", key_tokens=letters
        ),
    }
    from ...data.g2p import apply_split, load_cmudict
    from ...train.runfolder import read_json

    held_out = apply_split(load_cmudict(), read_json(run.path / "splits.json", dict))["test"]
    n = min(sample, len(held_out))
    scores = head_monotonicity(run.model, run.vocab, held_out.words[:n], [list(p[0]) for p in held_out.prons[:n]])
    word_scores = torch.tensor([[monotonicity(h) for h in layer] for layer in kinds["cross"]])
    best = divmod(int(scores.argmax()), scores.shape[1])
    target = Path(out)
    with Publish(target, "show", overwrite=overwrite, sources=(str(run.path),)) as folder:
        files = []
        for kind, m in maps.items():
            files += plots.plot_grid(m, folder / f"{kind}_grid")
            files.append(write_page(m, folder / f"{kind}.html"))
        files += plots.plot_head(
            maps["cross"],
            best[0],
            best[1],
            folder / "alignment",
            caption=f"monotonicity {scores[best].item():.2f} over {n} held-out words",
        )
        files += _plot_scores(scores, n, folder / "monotonicity")
        summary = {
            "word": word,
            "phonemes": " ".join(phonemes),
            "letters": letters,
            "monotonicity": {
                "held_out_words": n,
                "per_head": scores.tolist(),
                "this_word": word_scores.tolist(),
                "most_monotonic": {"layer": best[0], "head": best[1]},
            },
            "seconds": round(time.perf_counter() - t0, 2),
        }
        atomic_write_json(folder / "summary.json", summary)
    summary["files"] = [str(target / Path(f).name) for f in files]
    log(f"{word}: {' '.join(phonemes)}")
    log(
        "cross-attention monotonicity (share of steps whose strongest letter does not move back; "
        f"mean over {n} held-out words), layers x heads:"
    )
    for layer, row in enumerate(scores.tolist()):
        log(f"  layer {layer}: " + " ".join(f"{v:.2f}" for v in row))
    return summary


def _plot_scores(scores: Tensor, n: int, stem: Path) -> list[Path]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.2 * scores.shape[1] + 2, 0.9 * scores.shape[0] + 1.5))
    im = ax.imshow(scores.numpy(), cmap="viridis", vmin=0, vmax=1)
    for (l, h), v in zip(
        [(l, h) for l in range(scores.shape[0]) for h in range(scores.shape[1])], scores.flatten().tolist()
    ):
        ax.text(h, l, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=9)
    ax.set_xticks(range(scores.shape[1]), [f"H{h}" for h in range(scores.shape[1])])
    ax.set_yticks(range(scores.shape[0]), [f"L{l}" for l in range(scores.shape[0])])
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(plain(f"cross-attention monotonicity per head ({n} held-out words)"), fontsize=9)
    fig.tight_layout()
    return save(fig, stem)


__all__ = ["attention_of", "head_monotonicity", "monotonicity", "show_g2p"]
