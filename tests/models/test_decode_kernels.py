"""The decoding kernel chosen by measurement (:mod:`multihead.models.kernels`): measured once per machine and kept in
the user's cache folder, read back by the next process, decoded with (the same tokens whichever wins), and a cache
file that is garbage or cannot be written changes nothing but the cost of measuring again, said once."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from multihead.models import fast_decode, kernels
from multihead.models.generation import generate

from test_decoding_layout import _decode, _model

INDUCTOR = kernels.why_not_inductor()


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """The default: no kernel asked for, and a cache folder of the test's own."""
    monkeypatch.setenv(kernels.ENV, "auto")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kernels._SAID.clear()
    return tmp_path / "cache" / "multihead" / kernels.FILE


def test_the_kernel_is_measured_once_per_machine_kept_and_read_back(auto):
    model = _model("llama")
    first = kernels.choose(model, budget=0.02)
    if INDUCTOR is not None:  # only the BLAS runs here: nothing to measure, nothing kept
        assert first.source == "only" and first.kernel == "blas" and "compiled" in first.cannot
        return
    assert first.source == "measured" and set(first.seconds) == {"blas", "compiled"}
    assert first.kernel == min(first.seconds, key=first.seconds.get)  # the faster one, whichever it is here
    kept = json.loads(auto.read_text())
    (entry,) = kept["choices"].values()
    assert entry["kernel"] == first.kernel and entry["seconds"] == first.seconds
    again = kernels.choose(_model("llama"), budget=0.02)
    assert again.source == "kept" and again.kernel == first.kernel and again.seconds == first.seconds
    assert again.key["cpu"] == first.key["cpu"] and again.key["torch"] == torch.__version__
    other = kernels.choose(_model("gpt2"), budget=0.02)  # other shapes: measured for themselves, kept beside
    assert other.source == "measured" and len(json.loads(auto.read_text())["choices"]) == 2
    assert "fastest here" in again.why() and "ms" in again.why()


@pytest.mark.skipif(INDUCTOR is not None, reason=f"torch.compile cannot build CPU code here: {INDUCTOR}")
@pytest.mark.parametrize("kernel", ["blas", "compiled"])
def test_decoding_takes_the_kernel_kept_for_this_machine_and_writes_the_same_tokens(auto, kernel, monkeypatch):
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    monkeypatch.setenv(kernels.ENV, "blas")
    want = _decode(_model("llama"), ids)[1]
    monkeypatch.setenv(kernels.ENV, "auto")  # from here the first step chooses: it reads the kept choice
    model = _model("llama")
    key = kernels.machine_key(kernels.linear_weights(model))
    entry = {"kernel": kernel, "seconds": {"blas": 0.002, "compiled": 0.001}, "measured_mb": 1.0}
    auto.parent.mkdir(parents=True)
    auto.write_text(json.dumps({"format": kernels.FORMAT, "choices": {kernels._id(key): entry}}))
    assert _decode(model, ids)[1] == want
    choice = fast_decode.chosen(model)
    assert choice is not None and choice.source == "kept" and choice.kernel == kernel
    assert fast_decode.compiled(model) == (kernel == "compiled")


def test_a_cache_file_holding_garbage_is_said_once_measured_again_and_replaced(auto):
    auto.parent.mkdir(parents=True)
    auto.write_text("{not json")
    with (
        pytest.warns(RuntimeWarning, match=f"{auto}.*measured again") if INDUCTOR is None else warnings.catch_warnings()
    ):
        choice = kernels.choose(_model("llama"), budget=0.02)
    if INDUCTOR is not None:
        assert choice.source == "only"
        return
    assert choice.source == "measured" and "measured again" in choice.note
    assert json.loads(auto.read_text())["format"] == kernels.FORMAT  # replaced by the choices
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read back now: nothing more to say
        assert kernels.choose(_model("llama"), budget=0.02).source == "kept"
    auto.write_text(json.dumps({"format": kernels.FORMAT, "choices": {"x": {"kernel": 3}}}))
    with pytest.warns(RuntimeWarning, match="does not hold multihead's decoding kernel choices"):
        assert kernels.choose(_model("llama"), budget=0.02).source == "measured"


def test_a_cache_folder_that_cannot_be_written_still_decodes_and_says_why_once(auto, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the cache folder would be inside a regular file
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    if INDUCTOR is not None:
        assert _decode(_model("llama"), ids)[1]
        return
    with pytest.warns(RuntimeWarning, match="could not be kept in") as said:
        tokens = generate(_model("llama"), ids, max_new_tokens=6).tokens
        generate(_model("llama"), ids, max_new_tokens=6)  # measured again, not said again
    assert len([w for w in said if "could not be kept" in str(w.message)]) == 1
    assert len(tokens[0]) == 6 and blocker.read_text() == "not a folder"


def test_an_unknown_kernel_asked_for_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "gpu")
    ids = torch.randint(3, 300, (1, 8), generator=torch.Generator().manual_seed(1))
    with pytest.raises(
        ValueError, match="MULTIHEAD_DECODE_KERNEL='gpu' names no decoding kernel; set it to one of auto"
    ):
        generate(_model("llama"), ids, max_new_tokens=2)


def test_a_measurement_that_fails_falls_back_to_the_blas_step_and_says_why(auto, monkeypatch):
    def broken(shapes, dtype):
        raise RuntimeError("inductor could not build the reduction")

    monkeypatch.setitem(kernels.KERNELS, "compiled", kernels.Kernel("compiled", "broken", broken))
    with pytest.warns(RuntimeWarning, match="could not be measured here .*inductor could not build"):
        choice = kernels.choose(_model("llama"), budget=0.02)
    assert choice.kernel == "blas" and choice.source == "only" and not auto.exists()


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_weights_stored_in_a_format_are_measured_between_its_own_products(auto, fmt):
    """A converted model's products are the format's: PyTorch's kernel for it and inductor's reduction over the
    stored bytes (int8 read as words of four), each timed on the model's own shapes, the faster kept and decoded
    with."""
    from multihead.models.precision import convert

    model = convert(_model("llama"), fmt)
    choice = kernels.choose(model, budget=0.02, fmt=fmt)
    if INDUCTOR is not None:
        assert choice.source == "only" and choice.kernel == "library" and "compiled" in choice.cannot
        return
    assert choice.source == "measured" and set(choice.seconds) == {"library", "compiled"}
    assert choice.kernel == min(choice.seconds, key=choice.seconds.get)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_a_converted_model_is_timed_as_whole_steps_and_decodes_with_the_faster(auto, fmt, monkeypatch):
    """Over weights stored in a format, the first row times each candidate as a whole decoding step of the model (the
    lean step with PyTorch's product, the compiled step), keeps the faster apart from product timings, and decodes
    with it: the library's tokens whichever wins."""
    import copy

    from multihead.models.precision import WeightOnlyLinear, convert

    model = _model("llama")
    ids = torch.randint(3, 300, (1, 24), generator=torch.Generator().manual_seed(3))
    q = convert(copy.deepcopy(model), fmt)
    logits, tokens = _decode(q, ids)
    choice = fast_decode.chosen(q)
    if INDUCTOR is not None:
        assert choice.source == "only" and choice.kernel == "library"
        return
    assert choice.source == "measured" and choice.key["timed"] == "steps"
    assert set(choice.seconds) == {"library", "compiled"} and "a decoding step" in choice.why()
    assert choice.kernel == min(choice.seconds, key=choice.seconds.get)
    assert fast_decode.compiled(q) == (choice.kernel == "compiled")  # compiled to be timed: dropped if slower
    assert {m.kernel for m in q.modules() if isinstance(m, WeightOnlyLinear)} == {choice.kernel}
    (entry,) = [v for k, v in json.loads(auto.read_text())["choices"].items() if '"timed": "steps"' in k]
    assert entry["kernel"] == choice.kernel
    monkeypatch.setenv(kernels.ENV, "blas")  # the library's product asked for
    library = _decode(convert(copy.deepcopy(model), fmt), ids)
    if fmt == "int8":
        assert tokens == library[1]
        torch.testing.assert_close(logits, library[0], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(INDUCTOR is not None, reason=f"torch.compile cannot build CPU code here: {INDUCTOR}")
def test_a_compiled_step_that_fails_while_timed_leaves_the_library_step_and_says_why(auto, monkeypatch):
    import copy

    from multihead.models.precision import convert

    def broken(model, **kw):
        raise ValueError("torch.compile could not build the decoding step here")

    model = _model("llama")
    ids = torch.randint(3, 300, (1, 24), generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv(kernels.ENV, "blas")
    want = _decode(convert(copy.deepcopy(model), "int8"), ids)
    monkeypatch.setenv(kernels.ENV, "auto")
    monkeypatch.setattr(fast_decode, "compile", broken)
    q = convert(copy.deepcopy(model), "int8")
    with pytest.warns(RuntimeWarning, match="could not be measured here .*could not build the decoding step"):
        got = _decode(q, ids)
    assert fast_decode.chosen(q).kernel == "library" and not fast_decode.compiled(q)
    assert got[1] == want[1]
