"""Whisper's hallucinating heads (Wang et al. 2025, "Calm-Whisper", arXiv 2505.12969), measured through the model's
anatomy: which decoder self-attention heads make Whisper write text over audio that holds no speech.

* **Non-speech audio** (:func:`non_speech`), made here with numpy, seeded: white noise at two levels, brown noise, a
  melody of decaying harmonic notes, a held chord, mains hum, digital silence.
* **A hallucination** (:func:`hallucinates`): a transcript of non-speech audio with a word in it (letters or digits
  outside brackets: ``[music]`` or ``(wind)`` describe the audio and are not counted).
* **Masking a head**: its output ``z`` set to zero at every position (before the output projection).
* **The scan** (:func:`choose`): on the selection clips, each decoder self-attention head masked alone; its **net**
  effect is the share of hallucinations it removes minus the word error rate it adds on spoken sentences (a head
  whose masking silences the decoder removes every hallucination and every word, and nets nothing). The top heads
  by net effect are then masked together on **held-out** clips and sentences, beside as many random heads; and, on
  the selection clips, every self-attention head of one layer at once.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...modules.anatomy import anatomy

SAMPLE_RATE = 16000
KINDS = ("white-quiet", "white-loud", "brown", "melody", "chord", "hum", "silence")


def non_speech(kind: str, seed: int, seconds: float = 8.0) -> np.ndarray:
    """One clip of ``kind`` (one of :data:`KINDS`), 16 kHz mono float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    if kind.startswith("white"):
        x = rng.normal(0, 0.02 if kind == "white-quiet" else 0.1, t.size)
    elif kind == "brown":
        walk = np.cumsum(rng.normal(0, 1, t.size))
        walk -= np.convolve(walk, np.ones(4000) / 4000, mode="same")  # no slow drift
        x = 0.1 * walk / np.abs(walk).max()
    elif kind == "melody":
        notes = 220 * 2 ** (rng.choice([0, 2, 4, 5, 7, 9, 11, 12], int(seconds * 2)) / 12)
        x = np.zeros_like(t)
        for i, f in enumerate(notes):
            s = slice(i * SAMPLE_RATE // 2, (i + 1) * SAMPLE_RATE // 2)
            tt = t[s] - t[s][0]
            x[s] = sum(np.sin(2 * np.pi * f * k * tt) / k for k in (1, 2, 3)) * np.exp(-3 * tt)
        x = 0.3 * x / np.abs(x).max()
    elif kind == "chord":
        root = 220 * 2 ** (rng.integers(0, 12) / 12)
        x = 0.1 * sum(np.sin(2 * np.pi * root * r * t) for r in (1, 1.26, 1.5))
    elif kind == "hum":
        x = 0.05 * np.sin(2 * np.pi * 50 * t) + rng.normal(0, 0.005, t.size)
    elif kind == "silence":
        x = np.zeros_like(t)
    else:
        raise ValueError(f"no non-speech kind is called {kind!r}; choose from {', '.join(KINDS)}")
    return x.astype(np.float32)


def hallucinates(text: str) -> bool:
    """Whether a transcript of non-speech audio holds a word (letters or digits outside brackets)."""
    bare = re.sub(r"\[[^\]]*\]|\([^)]*\)", " ", text)
    return re.search(r"[A-Za-z0-9]", bare) is not None


@dataclass
class Clips:
    """Audio to transcribe: non-speech clips (``noise``, their ``kinds``) and spoken sentences (``speech``, their
    ``texts``)."""

    noise: list[np.ndarray]
    kinds: list[str]
    speech: list[np.ndarray]
    texts: list[str]


def rates(clips: Clips, transcripts: list[str]) -> dict:
    """The hallucination rate over the non-speech clips and the word error rate over the sentences, from the
    transcripts of ``clips.noise + clips.speech`` in that order."""
    from ..media.speech import word_errors

    noise, speech = transcripts[: len(clips.noise)], transcripts[len(clips.noise) :]
    edits = [word_errors(ref, hyp) for ref, hyp in zip(clips.texts, speech)]
    return {
        "hallucination": sum(map(hallucinates, noise)) / max(1, len(noise)),
        "wer": sum(e for e, _ in edits) / max(1, sum(n for _, n in edits)),
    }


def choose(
    transcribe: Callable[[Sequence[tuple[int, int]]], list[str]],
    heads: list[tuple[int, int]],
    clips: Clips,
    *,
    top: int,
    progress=None,
) -> dict:
    """Each head of ``heads`` masked alone (``transcribe(masked)`` -> the transcripts of ``clips``); the ``top`` by
    net effect (hallucinations removed minus word error rate added)."""
    base = rates(clips, transcribe(()))
    per_head = {}
    for head in heads:
        r = rates(clips, transcribe((head,)))
        per_head[head] = {**r, "net": (base["hallucination"] - r["hallucination"]) - (r["wer"] - base["wer"])}
        if progress is not None:
            progress.update(1)
    ranked = sorted(heads, key=lambda h: -per_head[h]["net"])
    return {"base": base, "per_head": per_head, "chosen": ranked[:top]}


# ------------------------------------------------------------------------------------------------ on a Whisper
def decoder_heads(model) -> list[tuple[int, int]]:
    """``(site, head)`` of every decoder self-attention head, sites numbered as in the anatomy."""
    return [(i, h) for i, s in enumerate(anatomy(model).sites) if s.role == "decoder" for h in range(s.num_heads)]


def transcriber(w, audio: list[np.ndarray], *, max_new_tokens: int) -> Callable[[Sequence[tuple[int, int]]], list]:
    """``transcribe(masked)``: greedy transcripts of ``audio`` (one batch, Whisper's suppressed tokens never
    chosen) with the ``(site, head)`` pairs of ``masked`` zeroed."""
    a = anatomy(w.model)
    feats = torch.cat([w.features(x) for x in audio])

    def transcribe(masked: Sequence[tuple[int, int]]) -> list[str]:
        by_site: dict[int, list[int]] = {}
        for i, h in masked:
            by_site.setdefault(i, []).append(h)

        def zero(heads: list[int]):
            def hook(z, _h):
                z = z.clone()
                z[:, heads] = 0
                return z

            return hook

        handles = [a.sites[i].module.hook_z.add_hook(zero(hs)) for i, hs in by_site.items()]
        try:
            with torch.no_grad():
                tokens = w.write(feats, max_new_tokens=max_new_tokens)
        finally:
            for handle in handles:
                handle.remove()
        return [w.tokenizer.decode(t, skip_special_tokens=True).strip() for t in tokens]

    return transcribe


def make_clips(per_kind: int, sentences: list[str], *, seed: int) -> Clips:
    """``per_kind`` non-speech clips of every kind (seeds from ``seed``) and the ``sentences`` spoken by
    espeak-ng."""
    from ..media.speech import speak

    noise = [(k, non_speech(k, seed + i)) for i in range(per_kind) for k in KINDS]
    return Clips([x for _, x in noise], [k for k, _ in noise], [speak(s) for s in sentences], list(sentences))


def hallucination_heads(w, *, per_kind: int, sentences: int, top: int, seed: int = 0, progress=None) -> dict:
    """The finding on a loaded Whisper ``w``: heads chosen on half of the clips and sentences, measured on the other
    half (module docstring)."""
    from ..media.speech import sentences as spoken

    texts = spoken(2 * sentences)
    chosen_on = make_clips(per_kind, texts[:sentences], seed=seed)
    held = make_clips(per_kind, texts[sentences:], seed=seed + 1000)
    heads = decoder_heads(w.model)
    a = anatomy(w.model)
    select = transcriber(w, chosen_on.noise + chosen_on.speech, max_new_tokens=64)
    scan = choose(select, heads, chosen_on, top=top, progress=progress)
    whole = {}  # every head of one layer masked at once: does any layer carry it, if no single head does?
    for i in sorted({i for i, _ in heads}):
        whole[a.sites[i].name] = rates(chosen_on, select([(j, h) for j, h in heads if j == i]))
        if progress is not None:
            progress.update(1)
    rng = random.Random(seed)
    groups = {"none": [], "chosen": scan["chosen"], "random": rng.sample(heads, min(top, len(heads)))}
    run = transcriber(w, held.noise + held.speech, max_new_tokens=64)
    measured, examples = {}, {}
    for name, group in groups.items():
        got = run(group)
        measured[name] = rates(held, got)
        examples[name] = {"noise": dict(zip(held.kinds, got)), "speech": got[len(held.noise) :][:3]}
        if progress is not None:
            progress.update(1)
    named = {g: [[a.sites[i].name, h] for i, h in hs] for g, hs in groups.items()}
    per_head = [{"site": a.sites[i].name, "head": h, **r} for (i, h), r in scan["per_head"].items()]
    payload = _payload(scan, per_head, measured, named, examples, top=top, held=held, chosen_on=chosen_on)
    return {**payload, "whole_layers": whole}


def _payload(scan, per_head, measured, named, examples, *, top: int, held: Clips, chosen_on: Clips) -> dict:
    heads = len(per_head)
    none, chosen, rand = measured["none"], measured["chosen"], measured["random"]
    reproduced = (
        chosen["hallucination"] <= none["hallucination"] / 2 and chosen["hallucination"] < rand["hallucination"]
    )
    verdict = (
        f"{none['hallucination']:.0%} of {len(held.noise)} held-out non-speech clips get words; masking the {top} "
        f"decoder self-attention heads (of {heads}) chosen on other clips: {chosen['hallucination']:.0%} "
        f"({top} random heads: {rand['hallucination']:.0%}); word error rate on {len(held.speech)} spoken sentences "
        f"{none['wer']:.3f} -> {chosen['wer']:.3f} (random: {rand['wer']:.3f})"
    )
    return {
        "per_head": per_head,
        "selection": {"base": scan["base"], "clips": len(chosen_on.noise), "sentences": len(chosen_on.speech)},
        "heads": named,
        "held_out": measured,
        "held_out_clips": len(held.noise),
        "held_out_sentences": len(held.speech),
        "examples": examples,
        "verdict": verdict,
        "reproduced": bool(reproduced),
    }


__all__ = [
    "KINDS",
    "Clips",
    "choose",
    "decoder_heads",
    "hallucinates",
    "hallucination_heads",
    "make_clips",
    "non_speech",
    "rates",
    "transcriber",
]
