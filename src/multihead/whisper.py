"""Whisper in multihead's SpeechSeq2Seq (kept importable from here): the family, its audio front end, tokenizer and
decoding live in :mod:`multihead.pretrained.families.whisper`."""

from .pretrained.families.whisper import *  # noqa: F401,F403
from .pretrained.families.whisper import (  # noqa: F401
    CHUNK,
    HOP,
    N_FFT,
    PACKAGE,
    SAMPLE_RATE,
    SHORT_NAMES,
    __all__,
    config_from,
    read_ct2,
    state_from,
)
