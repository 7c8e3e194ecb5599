"""Text-image grounding: canvases and questions, the cross-attention model (kdim/vdim from the image width), the
grounding share against a formula, and the cut: with every cross-attention head masked the answer cannot depend on
the image, so no model can beat chance."""

import json

import pytest
import torch

from multihead.data import grounding as G
from multihead.data import images as I
from multihead.models.grounding import GroundedQA, GroundingConfig, grounding_share, quadrant_of_patches
from multihead.models.vision import VisionConfig
from multihead.modules.decoder import DecoderConfig, TransformerDecoder
from multihead.modules.encoder import EncoderConfig


def _model(**text):
    vision = VisionConfig(
        image_size=16,
        patch_size=4,
        pooling="mean",
        num_classes=0,
        encoder=EncoderConfig(d_model=24, num_heads=2, num_layers=1, d_ff=48, dropout=0.0, norm_first=True),
    )
    tc = DecoderConfig(
        **{
            "d_model": 16,
            "num_heads": 4,
            "num_layers": 2,
            "d_ff": 32,
            "dropout": 0.0,
            "norm_first": True,
            "causal": False,
            **text,
        }
    )
    vocab = G.QuestionVocab([str(i) for i in range(10)])
    torch.manual_seed(0)
    return GroundedQA(
        GroundingConfig(vocab_size=len(vocab), num_answers=len(vocab.answers), vision=vision, text=tc)
    ).eval(), vocab


def _digits(n=400):
    s = I.load_images("digits")
    return s.train[0][:n], s.train[1][:n]


def test_canvases_hold_four_different_classes_in_their_quadrants_and_questions_have_their_answers():
    images, labels = _digits()
    specs = G.draw_canvases(labels, 300, torch.Generator().manual_seed(0), num_classes=10)
    cls = labels[specs.items]  # (N, 4)
    assert all(len(set(row.tolist())) == 4 for row in cls)
    canvases = G.render(images, specs.items)
    assert canvases.shape == (300, 1, 16, 16) and canvases.dtype == torch.uint8
    i = 7
    for q, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        assert torch.equal(canvases[i, :, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8], images[specs.items[i, q]])
    vocab = G.QuestionVocab([str(d) for d in range(10)])
    ids, answers = vocab.batch(specs, labels)
    assert set(specs.kind.tolist()) == {0, 1} and set(specs.quadrant.tolist()) == {0, 1, 2, 3}
    for n in range(50):
        words = [vocab.words[t] for t in ids[n] if t]
        q = int(specs.quadrant[n])
        if specs.kind[n] == 0:  # where is the <class at q> ? -> q
            assert words[3] == str(int(cls[n, q])) and int(answers[n]) == q
        else:  # what is at the <q> ? -> the class at q
            assert " ".join(words[4:6]) == G.QUADRANTS[q] and vocab.answers[int(answers[n])] == str(int(cls[n, q]))
    # the same generator seed draws the same canvases (resume, held-out sets)
    again = G.draw_canvases(labels, 300, torch.Generator().manual_seed(0), num_classes=10)
    assert torch.equal(again.items, specs.items) and torch.equal(again.quadrant, specs.quadrant)


def test_questions_are_parsed_whole_and_bad_ones_name_the_forms():
    vocab = G.QuestionVocab(I.FASHION_LABELS)
    kind, ids = vocab.parse("Where is the ankle boot?")
    assert kind == 0 and [vocab.words[i] for i in ids] == ["where", "is", "the", "ankle boot", "?"]
    kind, ids = vocab.parse("what is at the bottom right")
    assert kind == 1 and len(ids) == 7
    for bad in ["where is the cat?", "who is at the top left?", "what is at the middle?", ""]:
        with pytest.raises(ValueError, match="ask 'where is the CLASS\\?'"):
            vocab.parse(bad)
    with pytest.raises(ValueError, match="four different classes"):
        G.draw_canvases(torch.tensor([0, 0, 1, 2]), 3, torch.Generator(), num_classes=10)


def test_cross_attention_reads_another_width_and_the_question_is_read_both_ways():
    model, vocab = _model()
    cross = model.text.layers[0].cross_attn
    assert (cross.kdim, cross.vdim, cross.d_model) == (24, 24, 16)  # image width != text width
    images = torch.randn(3, 1, 16, 16)
    q = torch.tensor([vocab.encode("where is the 3 ?".split()) + [0, 0]] * 3)
    out = model(images, q)
    assert out.shape == (3, len(vocab.answers)) and torch.isfinite(out).all()
    # not causal: the first word's state depends on a later word
    dec = TransformerDecoder(
        DecoderConfig(d_model=16, num_heads=4, num_layers=1, dropout=0.0, causal=False, memory_dim=24)
    ).eval()
    x, mem = torch.randn(1, 5, 16), torch.randn(1, 7, 24)
    y = x.clone()
    y[0, 4] += 1.0
    assert not torch.allclose(dec(x, mem)[0, 0], dec(y, mem)[0, 0])
    causal = TransformerDecoder(DecoderConfig(d_model=16, num_heads=4, num_layers=1, dropout=0.0, memory_dim=24)).eval()
    torch.testing.assert_close(causal(x, mem)[0, 0], causal(y, mem)[0, 0])
    # padding is padding: extra [PAD] tokens change nothing
    torch.testing.assert_close(model(images, q[:, :5]), out, atol=1e-5, rtol=1e-5)


def test_config_rules_and_input_checks():
    with pytest.raises(ValueError, match="vision.num_classes"):
        GroundingConfig(vision=VisionConfig(image_size=56, patch_size=7, pooling="mean", num_classes=10))
    with pytest.raises(ValueError, match="text.causal"):
        GroundingConfig(text=DecoderConfig(d_model=64, num_heads=4, causal=True))
    cfg = GroundingConfig.from_dict(json.loads(json.dumps(GroundingConfig().to_dict())))
    assert cfg.text.memory_dim == cfg.vision.encoder.d_model
    model, vocab = _model()
    with pytest.raises(ValueError, match=r"question ids must be in \[0, "):
        model(torch.randn(1, 1, 16, 16), torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="batch"):
        model(torch.randn(2, 1, 16, 16), torch.tensor([[1, 2]]))


def test_grounding_share_is_the_mass_on_the_asked_quadrant():
    vision = VisionConfig(image_size=16, patch_size=4, pooling="mean", num_classes=0)
    quad = quadrant_of_patches(vision)
    assert quad.reshape(4, 4).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(5, 3, 4, 16, dtype=torch.float64), -1)  # (B, H, T, N)
    questions = torch.tensor([[1, 2, 3, 0], [1, 2, 3, 4], [5, 0, 0, 0], [1, 1, 1, 1], [2, 2, 0, 0]])
    quadrant = torch.tensor([0, 3, 1, 2, 0])
    share = grounding_share([p, p.flip(-1)], questions, quadrant, vision)
    want = torch.zeros(2, 3, dtype=torch.float64)
    for layer, w in enumerate([p, p.flip(-1)]):
        for h in range(3):
            per = []
            for b in range(5):
                rows = [
                    sum(float(w[b, h, t, n]) for n in range(16) if quad[n] == quadrant[b])
                    for t in range(4)
                    if questions[b, t] != 0
                ]
                per.append(sum(rows) / len(rows))
            want[layer, h] = sum(per) / 5
    torch.testing.assert_close(share.double(), want, atol=1e-6, rtol=0)


def test_masking_every_cross_attention_head_cuts_the_image_off():
    """With all cross-attention heads masked the answer is a function of the question alone; the questions are
    built so that every answer is equally likely given the question, so such a model is at chance (1/4, 1/10)."""
    model, vocab = _model()
    cut = torch.zeros(2, 4)
    q = torch.tensor([vocab.encode("what is at the top left ?".split())] * 4)
    a = model(torch.randn(4, 1, 16, 16) * 3, q, cross_head_mask=cut)
    torch.testing.assert_close(a, a[:1].expand_as(a), atol=1e-6, rtol=0)
    b = model(torch.randn(4, 1, 16, 16) * 3, q)
    assert (b - b[:1]).abs().max() > 1e-4  # the image matters when the heads are on
    # ... and one head left on lets the image through again
    one = cut.clone()
    one[1, 2] = 1
    c = model(torch.randn(4, 1, 16, 16) * 3, q, cross_head_mask=one)
    assert (c - c[:1]).abs().max() > 1e-5
    # chance, measured: the best question-only answer on many canvases
    images, labels = _digits()
    specs = G.draw_canvases(labels, 4000, torch.Generator().manual_seed(3), num_classes=10)
    ids, answers = vocab.batch(specs, labels)
    for k, chance in ((0, 0.25), (1, 0.1)):
        sel = specs.kind == k
        best = 0
        for row in ids[sel].unique(dim=0):  # the best constant answer per question
            same = (ids[sel] == row).all(1)
            best += int(answers[sel][same].bincount().max())
        assert abs(best / int(sel.sum()) - chance) < 0.05
