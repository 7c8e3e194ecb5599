"""``multihead explain``: the tutorial's steps on a real model's layer. The numbers follow the formulas written out
here and equal the model's own (hook points, output projection); in Chromium the page's tables equal them to 1e-5,
the temperature slider recomputes the softmax as the formula says, a clicked score is spelt out term by term, and
hostile text stays text."""

from __future__ import annotations

import math

import pytest
import torch

from browser import open_page

from multihead.cli import main
from multihead.interpret.pages.explain import explain, write_explain_page
from multihead.interpret.maps import Subject
from multihead.modules.capture import capture

EVIL = "The <img src=x onerror=alert(1)> cat </script><script>alert(2)</script> sat on the mat."


@pytest.fixture(scope="module")
def subject():
    """A small random encoder with a word-level tokenizer (no package needed): 2 layers of 4 heads, d_model 32."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from multihead.models import TextEncoder, TextEncoderConfig
    from multihead.modules.encoder import EncoderConfig

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", ".", "a", "dog"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    torch.manual_seed(0)
    encoder = EncoderConfig(d_model=32, num_heads=4, num_layers=2, dropout=0.0)
    model = TextEncoder(TextEncoderConfig(vocab_size=len(words), max_len=64, positional="learned", encoder=encoder))
    return Subject("tiny", model.eval(), tok, 64)


def test_every_step_follows_the_formula_and_equals_the_model(subject):
    d = explain(subject, "the cat sat on the mat .", layer=1, head=2)
    assert d["tokens"] == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    x = torch.tensor(d["X"], dtype=torch.float64)
    mod = subject.model.encoder.layers[1].attn
    lo, hi = 2 * 8, 3 * 8  # head 2 of d_k = 8
    wq, bq = mod.w_q.weight.double()[lo:hi], mod.w_q.bias.double()[lo:hi]
    q = x @ wq.T + bq  # XW_Q, this head's columns
    assert torch.allclose(q, torch.tensor(d["Q"][2], dtype=torch.float64), atol=1e-5)
    k = torch.tensor(d["K"][2], dtype=torch.float64)
    scores = q @ k.T / math.sqrt(8)
    weights = torch.softmax(scores, -1)
    assert torch.allclose(weights, torch.tensor(d["weights"][2], dtype=torch.float64), atol=1e-5)
    ids, keep = subject.encode(["the cat sat on the mat ."])
    with torch.no_grad(), capture(subject.model) as cache:
        subject.model(ids, keep)
    assert torch.allclose(weights.float(), cache.pattern(1)[0, 2], atol=1e-5)  # the model's own weights
    z = weights @ torch.tensor(d["V"][2], dtype=torch.float64)
    concat = torch.tensor(d["concat"], dtype=torch.float64)
    assert torch.allclose(z, concat[:, lo:hi], atol=1e-5)
    out = concat @ mod.w_o.weight.double().T + mod.w_o.bias.double()
    assert torch.allclose(out, torch.tensor(d["output"], dtype=torch.float64), atol=1e-5)
    assert max(d["checks"].values()) < 1e-5 and not d["rotated"] and not d["causal"]


def test_the_default_head_links_determiners_to_their_nouns(subject):
    d = explain(subject, "the cat sat on the mat .")
    p = torch.tensor(d["weights"])  # (H, L, L) of the chosen layer
    ids, keep = subject.encode(["the cat sat on the mat ."])
    with torch.no_grad(), capture(subject.model) as cache:
        subject.model(ids, keep)
    score = lambda w: (w[:, 1, 2] + w[:, 5, 6]) / 2  # noqa: E731  the -> cat, the -> mat
    best = max(((l, h) for l in range(2) for h in range(4)), key=lambda c: float(score(cache.pattern(c[0])[0])[c[1]]))
    assert (d["layer"], d["head"]) == best and "determiner" in d["why"]
    assert float(score(p)[d["head"]]) == pytest.approx(float(score(cache.pattern(best[0])[0])[best[1]]), abs=1e-5)


def test_bad_layers_heads_and_variants_are_refused(subject, tmp_path, capsys):
    with pytest.raises(ValueError, match="attention layers 0 to 1"):
        explain(subject, "the cat", layer=5)
    with pytest.raises(ValueError, match="heads 0 to 3"):
        explain(subject, "the cat", layer=0, head=9)
    from multihead.models import TextEncoder, TextEncoderConfig
    from multihead.modules.encoder import EncoderConfig
    from multihead.modules.variants import AttentionConfig

    encoder = EncoderConfig(d_model=32, num_heads=4, num_layers=1, attention=AttentionConfig(alibi=True))
    alibi = TextEncoder(TextEncoderConfig(vocab_size=12, max_len=64, positional="none", encoder=encoder))
    with pytest.raises(ValueError, match="ALiBi"):
        explain(Subject("alibi", alibi.eval(), subject.tokenizer, 64), "the cat", layer=0, head=0)
    assert main(["explain", "the cat", "--model", "nonexistent-model", "--out", str(tmp_path / "e")]) == 2
    assert not (tmp_path / "e").exists()


def _open(browser, path):
    return open_page(browser, path, viewport={"width": 1280, "height": 900})


def _table(page, id_):
    cells = page.locator(f"#{id_} td").evaluate_all("cs => cs.map(c => [+c.dataset.i, +c.dataset.j, c.dataset.v])")
    n = 1 + max(i for i, _, _ in cells)
    m = 1 + max(j for _, j, _ in cells)
    out = torch.full((n, m), float("nan"), dtype=torch.float64)
    for i, j, v in cells:
        out[i, j] = float(v)
    return out


def test_the_page_shows_the_models_numbers_and_the_slider_follows_the_formula(browser, subject, tmp_path):
    d = explain(subject, "the cat sat on the mat .", layer=1, head=2)
    page, problems = _open(browser, write_explain_page(d, tmp_path / "explain.html"))
    assert torch.allclose(_table(page, "weights"), torch.tensor(d["weights"][2], dtype=torch.float64), atol=1e-5)
    scores = torch.tensor(d["Q"][2], dtype=torch.float64) @ torch.tensor(d["K"][2], dtype=torch.float64).T
    assert torch.allclose(_table(page, "scores"), scores, atol=1e-5)
    page.locator("#temperature").fill("0.69")  # the slider moves T on a log scale: e^0.69, about 2
    t = math.exp(float(page.locator("#temperature").input_value()))
    hot = torch.softmax(scores / math.sqrt(8) / t, -1)
    assert torch.allclose(_table(page, "weights"), hot, atol=1e-5)
    assert f"T = {t:.2f}" in page.locator("#tnote").inner_text() and "flatter" in page.locator("#tnote").inner_text()
    page.locator("#scores td[data-i='2'][data-j='1']").click()  # cat -> the, term by term
    terms = page.locator("#terms td[data-v]").evaluate_all("cs => cs.map(c => +c.dataset.v)")
    q, k = torch.tensor(d["Q"][2][2]), torch.tensor(d["K"][2][1])
    assert len(terms) == 8 and torch.allclose(torch.tensor(terms, dtype=torch.float64), (q * k).double(), atol=1e-6)
    assert "score(cat → the)" in page.locator("#dot").inner_text()
    page.locator("#head").select_option("0")  # another head: the same formulas on its own q and k, same T
    q0, k0 = (torch.tensor(d[w][0], dtype=torch.float64) for w in ("Q", "K"))
    assert torch.allclose(_table(page, "weights"), torch.softmax(q0 @ k0.T / math.sqrt(8) / t, -1), atol=1e-5)
    assert problems == []


def test_hostile_text_stays_text(browser, subject, tmp_path):
    d = explain(subject, EVIL, layer=0, head=0)
    d["tokens"] = [EVIL.split()[1], *d["tokens"][1:]]  # a token that is markup, as a BPE model could give
    path = write_explain_page(d, tmp_path / "evil.html")
    html = path.read_text()
    assert "<img src=x" not in html and "</script><script>alert" not in html and "https://" not in html
    page, problems = _open(browser, path)
    assert "<img src=x onerror=alert(1)>" in page.locator("#text").inner_text()
    assert problems == []
