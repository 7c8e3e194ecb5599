"""`bench decode --model`'s cases on a small GGUF Llama: ours before the decoding layout (``cached_old``) and after
(``cached``) and compiled (``compiled``, batch 1) write the same tokens, and the limit cases (one product over
every weight: BLAS's, the compiled reduction's) build and run (timings: bench only)."""

from __future__ import annotations


import pytest
import torch

from multihead.bench import decode as suite
from multihead.models import fast_decode
from multihead.modules import fastpath

from hf_families import hf_model, write_gguf


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    return str(write_gguf(hf_model("llama", rope_scaling=None), tmp_path_factory.mktemp("g") / "tiny.gguf"))


def test_old_and_new_paths_write_the_same_tokens_and_the_limit_case_runs(gguf_model):
    shape = {"pretrained": gguf_model}
    case = {"batch": 2, "new_tokens": 8, "shape": shape, "max_new": 8}
    try:
        old = suite.build({**case, "impl": "cached_old"})().tokens
        assert not fastpath.LAYOUT and not fast_decode.ENABLED  # the old path, in this process
    finally:
        fastpath.LAYOUT = fast_decode.ENABLED = True
    suite._LOADED.clear()  # a fresh model: the old run left its weights as they were
    new = suite.build({**case, "impl": "cached"})().tokens
    assert new == old
    bound = suite.build({**case, "impl": "bound"})
    model = suite._pretrained(gguf_model, "cached")
    unique = {m.weight.data_ptr(): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert bound.weight_bytes == sum(w.numel() * w.element_size() for w in unique.values())  # tied weights once
    bound()
    if fast_decode.why_not_inductor() is None:  # torch.compile builds CPU code here
        reduced = suite.build({**case, "impl": "bound_compiled"})
        assert reduced.weight_bytes == bound.weight_bytes
        reduced()
        one = {**case, "batch": 1}
        suite._LOADED.clear()
        want = suite.build({**one, "impl": "cached"})().tokens
        suite._LOADED.clear()
        assert suite.build({**one, "impl": "compiled"})().tokens == want
    suite._LOADED.clear()
