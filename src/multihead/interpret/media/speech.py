"""Whisper's cross-attention aligns text with time: which heads, and word timestamps from them.

* **Alignment score** of a cross-attention head: over the text tokens of a transcript (teacher-forced; the row of
  each token is the query that predicts it), the correlation between a token's index and the centre of mass (in
  frames) of the head's weights over the audio's frames. 1 = the head's focus walks forward through the audio as the words do.
* **Word timestamps** (the method of OpenAI's ``whisper/timing.py``, written here): the chosen heads' weights
  over the audio frames, standardised per frame over the tokens, median-filtered along time (width 7), averaged
  over heads; dynamic time warping on the negated matrix pairs every text token with a run of frames; a word
  starts at the first frame of its first token (20 ms per frame). One change: the prompt's first query keeps a row
  ahead of the text's, so the silence before the first word has somewhere to go (the path must start at frame 0).
* **Measured on speech whose word times are known**: each word of a sentence spoken separately by ``espeak-ng``,
  its silences trimmed, and the words joined with silences of seeded random length, so every word's start is known
  to the sample. The timestamps come from forced alignment of the reference text (the alignment itself is
  measured, not the recogniser); the word error rate of the free transcripts is reported beside it.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...modules.capture import capture

FRAME = 0.02  # seconds per encoder position (Whisper: 1,500 positions over 30 s)
MEDIAN = 7  # median filter width along time, as OpenAI's timing.py


@torch.no_grad()
def audio_frames(audio: np.ndarray, features: Tensor) -> int:
    """Encoder positions (20 ms each) that hold ``audio`` (the rest of the 30 s window is padding), at least 1."""
    return max(1, min(int(len(audio) / 16000 / FRAME + 0.5), features.shape[-1] // 2))


def cross_attention(w, features: Tensor, tokens: list[int]) -> Tensor:
    """Teacher-forced cross-attention ``(layers, H, T, S)`` of ``prompt + tokens + <|endoftext|>`` over
    ``features`` ``(1, 80, 3000)``."""
    model = w.model
    seq = torch.tensor([w.prompt + list(tokens) + [w.eot]])
    names = [n for n, _ in model.named_modules() if n.endswith("cross_attn")]
    with capture(model, ("pattern",)) as cache:
        model.decode(seq, model.encode(features))
    index = {n: i for i, n in enumerate(cache.attention_modules)}
    return torch.stack([cache.pattern(index[n])[0] for n in names])


def alignment_scores(cross: Tensor, first: int, last: int, frames: int) -> Tensor:
    """``(layers, H)``: correlation of token index and attention centre of mass over the audio's ``frames``, for
    the text tokens ``first:last``."""
    w = cross[:, :, first:last, :frames].double()
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    centre = (w * torch.arange(frames, dtype=torch.float64)).sum(-1)  # (layers, H, T)
    idx = torch.arange(centre.shape[-1], dtype=torch.float64)
    c = centre - centre.mean(-1, keepdim=True)
    i = idx - idx.mean()
    den = (c.pow(2).sum(-1) * i.pow(2).sum()).sqrt().clamp_min(1e-30)
    return ((c * i).sum(-1) / den).float()


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotone path through ``cost`` ``(T, S)`` from (0, 0) to (T-1, S-1), steps (1,0), (0,1), (1,1):
    ``(token indices, frame indices)`` along it."""
    t_n, s_n = cost.shape
    acc = np.full((t_n + 1, s_n + 1), np.inf)
    acc[0, 0] = 0.0
    move = np.zeros((t_n + 1, s_n + 1), dtype=np.int8)
    for i in range(1, t_n + 1):
        for j in range(1, s_n + 1):
            options = (acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])
            k = int(np.argmin(options))
            acc[i, j] = cost[i - 1, j - 1] + options[k]
            move[i, j] = k
    i, j, path = t_n, s_n, []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        k = move[i, j]
        i, j = (i - 1, j - 1) if k == 0 else (i - 1, j) if k == 1 else (i, j - 1)
    path.reverse()
    return np.array([p[0] for p in path]), np.array([p[1] for p in path])


def _median_filter(x: Tensor, width: int) -> Tensor:
    """Median over a sliding window of ``width`` along the last axis (edges reflected)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    flat = x.reshape(-1, x.shape[-1])  # (N, L): reflect-padding takes 2-D or 3-D input
    padded = torch.nn.functional.pad(flat[:, None], (pad, pad), mode="reflect")[:, 0]
    return padded.unfold(-1, width, 1).median(-1).values.reshape(x.shape)


def word_timestamps(w, audio: np.ndarray, text: str, heads: list[tuple[int, int]]) -> list[dict]:
    """``[{"word", "start", "end"}]`` (seconds) for ``text`` spoken in ``audio`` (16 kHz), by forced alignment
    through the cross-attention ``heads`` (see the module docstring)."""
    tokens = w.tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids
    features = w.features(audio)
    frames = audio_frames(audio, features)
    return align(w, cross_attention(w, features, tokens), tokens, frames, heads)


def align(w, cross: Tensor, tokens: list[int], frames: int, heads: list[tuple[int, int]]) -> list[dict]:
    """Word times from a transcript's teacher-forced cross-attention ``cross`` ``(layers, H, T, S)`` (see
    :func:`cross_attention`) through ``heads``, over the audio's first ``frames`` frames."""
    p = len(w.prompt)
    weights = torch.stack([cross[l, h, :, :frames] for l, h in heads])  # (K, T, frames)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = _median_filter((weights - mean) / std.clamp_min(1e-10), MEDIAN)
    # the row of the query that predicts each text token, after one row for the prompt's first query: a path must
    # start at frame 0, and that row takes the silence before the first word (else the first word starts at 0)
    matrix = weights.mean(0)[p - 2 : p - 1 + len(tokens)]
    rows, cols = dtw(-matrix.double().numpy())
    rows = rows - 1  # text tokens from 0; -1: the leading row
    starts = [float(cols[np.argmax(rows == t)]) * FRAME for t in range(len(tokens))]
    ends = [float(cols[len(rows) - 1 - np.argmax(rows[::-1] == t)] + 1) * FRAME for t in range(len(tokens))]
    words, current = [], None
    for t, tok in enumerate(tokens):
        piece = w.tokenizer.decode([tok])
        if current is None or piece.startswith(" "):
            current = {"word": piece.strip(), "start": starts[t], "end": ends[t]}
            words.append(current)
        else:
            current["word"] += piece
            current["end"] = ends[t]
    return words


# ---------------------------------------------------------------------------------------------------- speech
def sentences(n: int = 50, *, low: int = 6, high: int = 14) -> list[str]:
    """``n`` sentences of ``low``-``high`` words of letters from the IMDB test split (punctuation removed), in the
    split's order."""
    from ... import data as D

    out = []
    for text in D.split(D.load("imdb"), seed=0).test.texts:
        for s in re.split(r"(?<=[.!?])\s+", text.replace("<br />", " ")):
            words = [re.sub(r"[^A-Za-z']", "", x) for x in s.split()]
            words = [x.strip("'") for x in words if x.strip("'")]
            if low <= len(words) <= high and all(x.isascii() for x in words):
                out.append(" ".join(words))
                if len(out) == n:
                    return out
    return out


def _espeak_wav(text: str, path: Path, rate: int | None = None) -> None:
    """``text`` spoken by espeak-ng into the WAV file ``path`` (its own rate: 22,050 Hz)."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise ValueError("speaking test sentences needs espeak-ng: apt-get install espeak-ng")
    try:
        subprocess.run(
            [espeak, *(["-s", str(rate)] if rate else []), "-w", str(path), text],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        said = (getattr(exc, "stderr", b"") or b"").decode(errors="replace").strip()
        raise ValueError(f"espeak-ng could not speak {text[:60]!r}: {said or exc}") from None


def speak(text: str, *, rate: int | None = None) -> np.ndarray:
    """``text`` spoken whole by espeak-ng, as 16 kHz mono float audio."""
    from ...whisper import read_wav

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        _espeak_wav(text, path, rate)
        return read_wav(path)


def _trim(x: np.ndarray, threshold: float = 0.02) -> np.ndarray:
    """``x`` without its leading and trailing silence (5 ms frames whose peak is under ``threshold`` of the
    loudest)."""
    hop = 80
    peaks = np.abs(x[: len(x) // hop * hop]).reshape(-1, hop).max(1)
    loud = np.nonzero(peaks >= threshold * peaks.max())[0]
    return x[loud[0] * hop : (loud[-1] + 1) * hop] if len(loud) else x


def speak_words(
    sentence: str, *, seed: int = 0, rate: int = 160, gaps: tuple[float, float] = (0.1, 0.4), lead: float = 0.3
) -> tuple[np.ndarray, list[dict]]:
    """``sentence`` spoken one word at a time by espeak-ng, words joined by silences drawn from ``gaps`` seconds
    (seeded), after ``lead`` seconds of silence: ``(16 kHz audio, [{"word", "start", "end"}])`` with every time
    exact to the sample."""
    from ...whisper import read_wav

    rng = random.Random(seed)
    parts, words, t = [np.zeros(int(lead * 16000), np.float32)], [], lead
    with tempfile.TemporaryDirectory() as tmp:
        for i, word in enumerate(sentence.split()):
            path = Path(tmp) / f"{i}.wav"
            _espeak_wav(word, path, rate)
            x = _trim(read_wav(path))
            words.append({"word": word, "start": t, "end": t + len(x) / 16000})
            gap = np.zeros(int(rng.uniform(*gaps) * 16000), np.float32)
            parts += [x, gap]
            t += (len(x) + len(gap)) / 16000
    return np.concatenate(parts), words


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """``(edits, reference words)``: the word-level Levenshtein distance after lowercasing and removing
    punctuation (substitutions, insertions and deletions each count 1)."""

    def norm(s: str) -> list[str]:
        return re.sub(r"[^a-z0-9' ]", " ", s.lower()).split()

    r, h = norm(reference), norm(hypothesis)
    row = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, row[0] = row[0], i
        for j in range(1, len(h) + 1):
            cur = min(row[j] + 1, row[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
            prev, row[j] = row[j], cur
    return row[len(h)], len(r)


def study(w, *, n: int = 50, top: int = 6, seed: int = 0, progress: bool = False) -> dict:
    """Word-start errors of forced alignment through each cross-attention head alone on the first half of ``n``
    synthesized sentences; then, on the second half, through the ``top`` heads of lowest error there (chosen on
    the first half), through the alignment heads OpenAI published for the model (``config.json``), and through
    every head. Also each head's alignment score and the WER of greedy transcripts over all sentences."""
    from tqdm import tqdm

    texts = sentences(n)
    items = []
    for i, text in enumerate(tqdm(texts, desc="speaking and transcribing", disable=not progress)):
        audio, truth = speak_words(text, seed=seed + i)
        hyp = w.transcribe(audio)["text"]
        tokens = w.tokenizer.encode(" " + text, add_special_tokens=False).ids
        feats = w.features(audio)
        frames = audio_frames(audio, feats)
        cross = cross_attention(w, feats, tokens)
        p = len(w.prompt)
        items.append(
            {
                "text": text,
                "hypothesis": hyp,
                "truth": truth,
                "tokens": tokens,
                "frames": frames,
                "cross": cross[..., :frames].clone(),
                "scores": alignment_scores(cross, p - 1, p - 1 + len(tokens), frames),
            }
        )

    def errors_of(group, heads) -> list[float]:
        out = []
        for it in group:
            got = align(w, it["cross"], it["tokens"], it["frames"], heads)
            if len(got) == len(it["truth"]):
                out += [g["start"] - t["start"] for g, t in zip(got, it["truth"])]  # signed: + late
        return out

    half = len(items) // 2
    scores = torch.stack([it["scores"] for it in items[:half]]).mean(0)  # (layers, H)
    layers, width = scores.shape
    every = [(l, h) for l in range(layers) for h in range(width)]
    per_head = torch.tensor(
        [
            float(np.mean(np.abs(errors_of(items[:half], [lh]))) if items else np.nan)
            for lh in tqdm(every, desc="each head alone", disable=not progress)
        ]
    ).view(layers, width)
    found = [every[int(i)] for i in per_head.nan_to_num(float("inf")).flatten().argsort()[:top]]
    choices = {
        "found here": found,
        "OpenAI's alignment heads": [tuple(h) for h in w.alignment_heads],
        "every head": every,
    }
    errors = {
        k: errors_of(items[half:], v) for k, v in tqdm(choices.items(), desc="aligning", disable=not progress) if v
    }
    edits = [word_errors(it["text"], it["hypothesis"]) for it in items]
    return {
        "sentences": len(items),
        "selected_on": half,
        "measured_on": len(items) - half,
        "alignment_scores": scores.tolist(),
        "head_start_error_ms": (1000 * per_head).tolist(),
        "heads": {k: [list(h) for h in v] for k, v in choices.items()},
        "start_error_ms": {
            k: {
                "mean": 1000 * float(np.mean(np.abs(v))),
                "median": 1000 * float(np.median(np.abs(v))),
                "p90": 1000 * float(np.percentile(np.abs(v), 90)),
                "bias": 1000 * float(np.mean(v)),
                "words": len(v),
            }
            for k, v in errors.items()
            if v
        },
        "wer": sum(e for e, _ in edits) / max(1, sum(r for _, r in edits)),
        "examples": [{"text": it["text"], "hypothesis": it["hypothesis"]} for it in items[:5]],
    }


def format_study(r: dict) -> str:
    lines = [
        f"{r['sentences']} sentences spoken word by word by espeak-ng; heads chosen on {r['selected_on']}, "
        f"timestamps measured on {r['measured_on']}",
        "alignment heads found here (lowest word-start error alone, on the first half): "
        + ", ".join(f"L{l}H{h}" for l, h in r["heads"]["found here"]),
    ]
    for name, e in r["start_error_ms"].items():
        lines.append(
            f"  word-start error through {name:<26} mean {e['mean']:6.1f} ms, median {e['median']:6.1f} ms, "
            f"90th percentile {e['p90']:6.1f} ms, mean signed {e['bias']:+6.1f} ms ({e['words']} words)"
        )
    lines.append(f"word error rate of greedy transcripts: {r['wer']:.1%}")
    return "\n".join(lines)


def plot_heads(r: dict, stem, title: str) -> list:
    """Layers x heads: each cross-attention head's alignment score (left) and the word-start error of timestamps
    through it alone (right, ms); OpenAI's alignment heads outlined, the heads chosen here starred."""
    from ...plotting import plain, pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    panels = [
        (
            np.array(r["alignment_scores"]),
            "alignment score (token order vs attention centre in time)",
            "viridis",
            "correlation",
        ),
        (np.array(r["head_start_error_ms"]), "word-start error through the head alone (ms)", "magma_r", "ms"),
    ]
    openai = {tuple(h) for h in r["heads"].get("OpenAI's alignment heads", [])}
    found = {tuple(h) for h in r["heads"]["found here"]}
    for ax, (grid, what, cmap, unit) in zip(axes, panels):
        im = ax.imshow(grid, cmap=cmap, aspect="auto")
        for (l, h), v in np.ndenumerate(grid):
            mark = "*" if (l, h) in found else ""
            ax.text(
                h,
                l,
                f"{v:.2f}{mark}" if unit == "correlation" else f"{v:.0f}{mark}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if (grid[l, h] < np.nanmean(grid)) == (cmap == "viridis") else "black",
            )
            if (l, h) in openai:
                ax.add_patch(plt.Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, edgecolor="cyan", lw=2))
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(grid.shape[0]))
        ax.set_xlabel("head")
        ax.set_ylabel("decoder layer")
        ax.set_title(what, fontsize=9)
        fig.colorbar(im, ax=ax, label=unit)
    fig.suptitle(plain(title + " (cyan: OpenAI's alignment heads; *: the heads chosen here)"), fontsize=10)
    fig.tight_layout()
    return save(fig, stem)


@torch.no_grad()
def show_speech(w, audio: np.ndarray, out: Path, *, name: str = "speech") -> dict:
    """Whisper on one clip, into ``out``: the transcript with word times; ``cross_grid`` (decoder layers x heads:
    each head's cross-attention, text tokens x the audio's 20 ms frames, over the log-mel spectrogram);
    ``cross.html`` (the page's head view: hover a token to see the frames it reads, or a frame to see which
    tokens read it) and ``attention.html`` (the decoder's self-attention over the transcript)."""
    from ..._io import atomic_write_json
    from ...plotting import plain, pyplot, save
    from ..maps import AttentionMaps
    from ..pages.page import write_page

    out.mkdir(parents=True, exist_ok=True)
    r = w.transcribe(audio)
    tokens = r["tokens"]
    features = w.features(audio)
    frames = audio_frames(audio, features)
    heads = w.timing_heads
    words = align(w, cross_attention(w, features, tokens), tokens, frames, heads) if tokens else []
    seq = torch.tensor([w.prompt + tokens + [w.eot]])
    with capture(w.model, ("pattern",)) as cache:
        w.model.decode(seq, w.model.encode(features))
    names = cache.attention_modules
    cross = [cache.pattern(i)[0, :, :, :frames] for i, n in enumerate(names) if n.endswith("cross_attn")]
    selfs = [cache.pattern(i)[0] for i, n in enumerate(names) if n.endswith("self_attn") and n.startswith("decoder")]
    labels = [w.tokenizer.decode([t]) for t in seq[0].tolist()]
    plt = pyplot()
    rows, cols = len(cross), cross[0].shape[0]
    fig, axes = plt.subplots(rows + 1, cols, figsize=(2.6 * cols, 1.9 * (rows + 1) + 0.6), squeeze=False)
    mel = features[0, :, : 2 * frames].numpy()
    for ax in axes[0]:
        ax.axis("off")
    axes[0][0].imshow(mel, origin="lower", aspect="auto", cmap="magma", extent=(0, frames * FRAME, 0, mel.shape[0]))
    axes[0][0].axis("on")
    axes[0][0].set_title(plain(f"log-mel, words: {' '.join(x['word'] for x in words)[:60]}"), fontsize=7)
    for x in words:
        axes[0][0].axvline(x["start"], color="cyan", lw=0.6)
    for l, layer in enumerate(cross):
        for h in range(cols):
            ax = axes[l + 1][h]
            im = ax.imshow(layer[h].numpy(), aspect="auto", cmap="viridis", extent=(0, frames * FRAME, len(labels), 0))
            ax.set_yticks([])
            if l == rows - 1:
                ax.set_xlabel("time (s)", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=8)
            if l == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if (l, h) in {tuple(x) for x in heads}:
                for spine in ax.spines.values():
                    spine.set_edgecolor("cyan")
                    spine.set_linewidth(2.5)
    fig.colorbar(im, ax=axes[1:, :].ravel().tolist(), fraction=0.02, label="cross-attention weight")
    fig.suptitle(
        plain(f"{name}: {r['text']!r}: each head's text tokens (rows) over time (cyan: alignment heads)"), fontsize=9
    )
    files = save(fig, out / "cross_grid")
    keys = [f"{i * FRAME:.2f}s" for i in range(frames)]
    files.append(
        write_page(
            AttentionMaps(
                r["text"],
                labels,
                [c.float() for c in cross],
                "Whisper cross-attention",
                starts=[True] * len(labels),
                key_tokens=keys,
            ),
            out / "cross.html",
        )
    )
    files.append(
        write_page(
            AttentionMaps(
                r["text"], labels, [s.float() for s in selfs], "Whisper decoder", starts=[True] * len(labels)
            ),
            out / "attention.html",
        )
    )
    summary = {
        "audio": name,
        "text": r["text"],
        "tokens": tokens,
        "words": words,
        "alignment_heads": heads,
        "files": [str(f.relative_to(out)) for f in files],
    }
    atomic_write_json(out / "speech.json", summary)
    return summary


__all__ = [
    "align",
    "alignment_scores",
    "cross_attention",
    "dtw",
    "format_study",
    "plot_heads",
    "sentences",
    "audio_frames",
    "show_speech",
    "speak",
    "speak_words",
    "study",
    "word_errors",
    "word_timestamps",
]
