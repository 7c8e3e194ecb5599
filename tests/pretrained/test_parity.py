"""Our encoder on real MiniLM weights against HF transformers (eager attention) on a padded batch.

HF transformers is a test-only reference. transformers 5 ignores head_mask: that comparison runs in the 4.57.6
environment (`make test` runs this file there too); everything else runs under both.
"""

import pytest
import torch
import torch.nn.functional as F

import multihead as mh
from multihead import pretrained

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The cat sat on the mat.",
    "A man is playing a guitar on a stage in front of a large crowd of people.",
    "Hello!",
    "Stock markets fell sharply after the announcement, dragging technology shares down.",
]
BACKENDS = sorted(
    n
    for n, b in mh.list_backends().items()
    if b.capabilities.exact
    and not b.capabilities.requires_pattern
    and "cpu" in b.capabilities.backward_devices
    and b.available() is None
)  # available() returns why not


@pytest.fixture(scope="module")
def hf_run():
    path = pretrained.resolve("minilm")
    model = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True, output_hidden_states=True)
    return batch, out


def _capture_patterns(model):
    seen, handles = [], []
    for layer in model.encoder.layers:
        handles.append(layer.attn.hook_pattern.add_hook(lambda w, hook: seen.append(w.detach().clone())))
    return seen, handles


def test_tokens_match_hf():
    p = pretrained.load("minilm")
    assert p.tokens("The cat sat on the mat.") == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    tok = transformers.AutoTokenizer.from_pretrained(str(p.path))
    ids, mask = p.encode(TEXTS)
    ref = tok(TEXTS, padding=True, return_tensors="pt")
    assert torch.equal(ids, ref["input_ids"]) and torch.equal(mask, ref["attention_mask"].bool())


@pytest.mark.parametrize("backend", BACKENDS)
def test_hidden_states_weights_and_embeddings_match_hf(hf_run, backend):
    batch, ref = hf_run
    p = pretrained.load("minilm", backend=backend)
    real = batch["attention_mask"].bool()  # (B, L)
    with torch.no_grad():
        ours = p.model(batch["input_ids"], real)  # unpadded fast path, no hooks
        seen, handles = _capture_patterns(p.model)
        hooked = p.model(batch["input_ids"], real)  # padded path with weights captured
        for h in handles:
            h.remove()
    for states in (ours, hooked):
        err = ((states - ref.last_hidden_state).abs() * real[..., None]).max().item()
        assert err <= 1e-5, f"last hidden state differs by {err:.2e} on real tokens"
    assert len(seen) == len(ref.attentions) == 6
    for i, (w, w_ref) in enumerate(zip(seen, ref.attentions)):
        assert w.shape == w_ref.shape == (len(TEXTS), 12, real.shape[1], real.shape[1])
        err = ((w - w_ref).abs() * real[:, None, :, None]).max().item()  # rows of real query tokens
        assert err <= 1e-5, f"layer {i} attention weights differ by {err:.2e}"
    m = real[..., None].float()
    st = F.normalize((ref.last_hidden_state * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1)  # sentence-transformers
    cos = F.cosine_similarity(p.embed(TEXTS), st, dim=-1)
    assert cos.min().item() >= 0.99999, cos


def test_backend_returned_weights_match_hf_per_layer(hf_run):
    """The reference backend's own weights (need_weights=True), fed HF's input to each layer."""
    batch, ref = hf_run
    p = pretrained.load("minilm", backend="reference")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        for i, layer in enumerate(p.model.encoder.layers):
            _, w = layer.attn(ref.hidden_states[i], key_padding_mask=real, need_weights=True)
            err = ((w - ref.attentions[i]).abs() * real[:, None, :, None]).max().item()
            assert err <= 1e-5, f"layer {i}: {err:.2e}"


@pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) >= 5,
    reason="transformers 5 ignores head_mask (make test runs it in .venv-hf4)",
)
def test_head_mask_matches_hf(hf_run):
    batch, _ = hf_run
    p = pretrained.load("minilm")
    path = pretrained.resolve("minilm")
    hf = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    head_mask = torch.ones(6, 12)
    head_mask[0, [1, 5]] = 0
    head_mask[4, :6] = 0
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = hf(**batch, head_mask=head_mask).last_hidden_state
        ours = p.model(batch["input_ids"], real, head_mask=head_mask)
    assert ((ours - ref).abs() * real[..., None]).max().item() <= 1e-5


def test_gradients_flow_into_pretrained_weights():
    p = pretrained.load("minilm")
    ids, mask = p.encode(TEXTS[:2])
    p.model.train()
    p.model.sentence_embeddings(ids, mask).sum().backward()
    grads = {n: q.grad for n, q in p.model.named_parameters()}
    assert all(torch.isfinite(g).all() for g in grads.values() if g is not None)
    assert grads["encoder.layers.0.attn.w_q.weight"].abs().sum() > 0


def test_bench_pretrained_compares_like_with_like():
    """`bench pretrained` times the same computation in each implementation (timings: bench only)."""
    from multihead.bench import pretrained as suite

    ids, keep = suite._batch(padded=True)
    ids, keep = ids[:4, :48], keep[:4, :48]
    outs = {}
    for impl in suite.IMPLS:
        model, fwd = suite._forward(impl)
        model.eval()
        with torch.no_grad():
            outs[impl] = fwd(ids, keep)
    for impl in suite.IMPLS:
        assert ((outs[impl] - outs["multihead"]).abs() * keep[..., None]).max().item() <= 1e-5, impl
    suite.build({"impl": "multihead", "mode": "train", "padded": True, "tokens": 1})()
