"""``auto``'s routing by device (issue 18): on CUDA sparse patterns go to FlexAttention with the pattern's block mask,
dense calls to SDPA; on CPU the window kernels stay first. Checked on CPU through the call description ``auto``
ranks (CallInfo), so the CUDA routes are tested without a GPU; explain_choice says why."""

from dataclasses import replace

import pytest
import torch

import multihead as mh
from multihead.attention import registry
from multihead.attention.patterns import SparsePattern

FLEX_OK = mh.list_backends()["flex"].available() is None


def call(device="cpu", pattern=None, **kw):
    base = dict(
        device=device,
        dtype=torch.bfloat16 if device == "cuda" else torch.float32,
        need_weights=False,
        mask_parts=frozenset({pattern} if pattern else ()),
        dropout_p=0.0,
        gqa=False,
        pattern=pattern,
        sizes=(4096, 4096, 64),
    )
    return registry.CallInfo(**{**base, **kw})


@pytest.mark.parametrize("kind", ["window", "block"])
@pytest.mark.parametrize("grad", [False, True])
def test_patterns_on_cuda_go_to_flex_and_on_cpu_to_the_sparse_kernels(kind, grad):
    sparse = {"window": "window", "block": "block_sparse"}[kind]
    cuda = registry.resolve("auto", call("cuda", kind, needs_grad=grad)).name
    assert cuda == ("flex" if FLEX_OK else sparse)
    assert registry.resolve("auto", call("cpu", kind, needs_grad=grad)).name == sparse


def test_dense_calls_go_to_sdpa_on_both_devices_and_weights_to_the_reference():
    assert registry.resolve("auto", call("cuda")).name == "sdpa"
    assert registry.resolve("auto", call("cpu")).name == "sdpa"
    assert registry.resolve("auto", call("cuda", "window", need_weights=True)).name == "reference"


def test_without_flex_cuda_patterns_fall_back_to_the_window_kernel(monkeypatch):
    flex = mh.list_backends()["flex"]
    monkeypatch.setitem(registry._REGISTRY, "flex", replace(flex, available=lambda: "no compiler (test)"))
    assert registry.resolve("auto", call("cuda", "window")).name == "window"


def test_ranks_put_flex_above_the_window_kernel_only_for_cuda_patterns():
    flex, window = mh.list_backends()["flex"], mh.list_backends()["window"]
    assert flex.rank(call("cuda", "window"))[0] > window.rank(call("cuda", "window"))[0]
    assert flex.rank(call("cpu", "window"))[0] < window.rank(call("cpu", "window"))[0]
    assert flex.rank(call("cuda"))[0] < mh.list_backends()["sdpa"].rank(call("cuda"))[0]
    assert "on cuda" in flex.rank(call("cuda", "block"))[1]


def test_explain_choice_names_the_backend_and_why_the_ones_above_were_skipped():
    q = torch.randn(1, 2, 32, 8)
    assert mh.explain_choice(q, q, mask=SparsePattern(window=4)) == "auto runs 'window' (rank 20)"
    text = mh.explain_choice(q, q, mask=SparsePattern(window=4), need_weights=True)
    assert text.startswith("auto runs 'reference'") and "window does not return attention weights" in text
    # the order explain() lists is the order auto tries
    assert [n for n, _ in mh.explain(q, q)][:2] == ["window", "block_sparse"]
