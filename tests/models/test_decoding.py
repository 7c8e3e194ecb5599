"""MHA's decoder roles: causal self-attention with a KV cache, cross-attention, and generation. Incremental decoding
equals the full forward pass at every step; padding, GQA/MQA, rotary/learned/sinusoidal positions; beam search
checked against exhaustive search."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import multihead as mh
from multihead.models.generation import GenerationConfig


def lm(positional="learned", kv=None, max_len=40, layers=2, vocab=50, seed=0):
    torch.manual_seed(seed)
    return mh.CausalLM(
        vocab_size=vocab,
        max_len=max_len,
        positional=positional,
        decoder=mh.DecoderConfig(
            d_model=32,
            num_heads=4,
            num_layers=layers,
            attention=mh.AttentionConfig(num_kv_heads=kv),
            cross_attention=False,
            dropout=0.0,
        ),
    ).eval()


def s2s(positional="sinusoidal", kv=None, seed=0, tgt_vocab=40):
    torch.manual_seed(seed)
    cfg = mh.Seq2SeqConfig(
        src_vocab_size=30,
        tgt_vocab_size=tgt_vocab,
        max_len=32,
        positional=positional,
        encoder=mh.EncoderConfig(
            d_model=32, num_heads=4, num_layers=2, dropout=0.0, attention=mh.AttentionConfig(num_kv_heads=kv)
        ),
        decoder=mh.DecoderConfig(
            d_model=32, num_heads=4, num_layers=2, dropout=0.0, attention=mh.AttentionConfig(num_kv_heads=kv)
        ),
    )
    return mh.Seq2Seq(cfg).eval()


def left_padded(b=3, length=12, vocab=50, pads=(0, 4, 7), seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (b, length), generator=g)
    keep = torch.arange(length)[None, :] >= torch.tensor(pads)[:, None]
    return ids.masked_fill(~keep, 0), keep


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
@pytest.mark.parametrize("kv", [None, 2, 1])  # MHA, GQA, MQA
def test_causal_lm_cache_equals_full_forward_at_every_step(positional, kv):
    model = lm(positional, kv)
    ids, keep = left_padded()
    with torch.no_grad():
        full = model(ids, keep)  # (B, T, V)
        logits, cache = model.prefill(ids[:, :8], keep[:, :8])
        assert (logits - full[:, 7]).abs().max().item() < 1e-5
        for t in range(8, 12):
            step = model.step(ids[:, t], cache)
            assert (step - full[:, t]).abs().max().item() < 1e-5, t
        assert cache.length == 12 and cache.key_padding.shape == (3, 12)
        # a left-padded row computes what it would alone
        alone = model(ids[2:3, 7:])
        assert (alone - full[2:3, 7:]).abs().max().item() < 1e-5


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("kv", [None, 2, 1])
def test_seq2seq_cache_equals_teacher_forcing_at_every_step(positional, kv):
    model = s2s(positional, kv)
    src = torch.randint(2, 30, (3, 9))
    src_keep = torch.arange(9)[None, :] < torch.tensor([9, 5, 2])[:, None]
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), torch.randint(2, 40, (3, 6))], 1)  # BOS first
    with torch.no_grad():
        full = model(src, tgt, src_keep)
        logits, cache = model.prefill(src, src_keep)
        assert (logits - full[:, 0]).abs().max().item() < 1e-5
        for t in range(1, 7):
            assert (model.step(tgt[:, t], cache) - full[:, t]).abs().max().item() < 1e-5
        alone = model(src[2:3, :2], tgt[2:3])  # a padded source equals the same source unpadded
        assert (alone - full[2:3]).abs().max().item() < 1e-5


def test_cross_attention_keys_are_computed_once_and_gqa_caches_hold_only_kv_heads():
    model = s2s(kv=1)
    calls = []
    for layer in model.decoder.layers:
        layer.cross_attn.w_k.register_forward_hook(lambda *a: calls.append(1))
    src = torch.randint(2, 30, (2, 7))
    mh.generate(model, src, None, max_new_tokens=5)
    assert len(calls) == len(model.decoder.layers)  # once per layer, not once per step
    mha_cache = lm(kv=None).prefill(*left_padded())[1]
    mqa_cache = lm(kv=1).prefill(*left_padded())[1]
    assert mha_cache.nbytes() == 4 * mqa_cache.nbytes()  # 4 query heads share 1 key/value head


def test_the_causal_mask_blocks_the_future():
    model = lm()
    ids, keep = left_padded()
    changed = ids.clone()
    changed[:, 9] = (changed[:, 9] % 49) + 1  # a different token at position 9
    with torch.no_grad():
        a, b = model(ids, keep), model(changed, keep)
    assert torch.equal(a[:, :9], b[:, :9]) and not torch.allclose(a[:, 9:], b[:, 9:])
    seq = s2s()
    src = torch.randint(2, 30, (2, 7))
    tgt = torch.randint(2, 40, (2, 6))
    tgt2 = tgt.clone()
    tgt2[:, 4] = (tgt2[:, 4] % 38) + 2
    with torch.no_grad():
        a, b = seq(src, tgt), seq(src, tgt2)
    assert torch.equal(a[:, :4], b[:, :4]) and not torch.allclose(a[:, 4:], b[:, 4:])


def test_a_cache_beyond_the_models_positions_is_refused():
    model = lm(max_len=10)
    ids, keep = left_padded(length=8, pads=(0, 0, 0))
    _, cache = model.prefill(ids, keep)
    model.step(ids[:, 0], cache)
    model.step(ids[:, 0], cache)  # position 9: the last one
    with pytest.raises(ValueError, match=r"position 10 is beyond the 10 positions.*max_new_tokens"):
        model.step(ids[:, 0], cache)
    with pytest.raises(ValueError, match="beyond the 10 positions"):
        mh.generate(model, ids, keep, max_new_tokens=5)
    rope = lm("rope", max_len=10)
    with pytest.raises(ValueError, match="beyond the 10 positions"):
        rope(torch.randint(1, 50, (1, 11)))


def test_beam_one_is_greedy_and_top_k_one_sampling_is_greedy():
    for model, inputs in ((lm(), left_padded()), (s2s(), (torch.randint(2, 30, (3, 8)), None))):
        greedy = mh.generate(model, *inputs, max_new_tokens=10, stop_tokens=(3,))
        beam = mh.generate(model, *inputs, strategy="beam", num_beams=1, max_new_tokens=10, stop_tokens=(3,))
        sample = mh.generate(model, *inputs, strategy="sample", top_k=1, seed=0, max_new_tokens=10, stop_tokens=(3,))
        nucleus = mh.generate(
            model, *inputs, strategy="sample", top_p=1e-6, seed=0, max_new_tokens=10, stop_tokens=(3,)
        )
        assert greedy.tokens == beam.tokens == sample.tokens == nucleus.tokens
        assert all(3 not in t and len(t) <= 10 for t in greedy.tokens)
    a = mh.generate(lm(), *left_padded(), strategy="sample", seed=5, max_new_tokens=6)
    b = mh.generate(lm(), *left_padded(), strategy="sample", seed=5, max_new_tokens=6)
    assert a.tokens == b.tokens  # seeded sampling is reproducible


def test_beam_search_with_enough_beams_is_exhaustive_search():
    """Tiny vocabulary: with more beams than hypotheses, beam search must return the best sequence under
    sum log p / length ** length_penalty, found here by enumerating every sequence."""
    model = s2s(tgt_vocab=4, seed=3)  # tokens 0..3; 0 is the stop token (BOS is 1)
    src = torch.randint(2, 30, (1, 5))
    steps, stop = 3, 0
    for lp in (0.0, 1.0, 2.0):
        got = mh.generate(
            model,
            src,
            None,
            strategy="beam",
            num_beams=64,
            max_new_tokens=steps,
            stop_tokens=(stop,),
            length_penalty=lp,
            early_stopping=False,
        )
        best, best_seq = -float("inf"), None
        with torch.no_grad():
            memory = model.encode(src)
            for n in range(steps + 1):
                for seq in itertools.product([1, 2, 3], repeat=n):
                    ends = n < steps  # shorter sequences end with the stop token
                    tgt = torch.tensor([[model.config.bos_id, *seq]])
                    logp = model.decode(tgt, memory).log_softmax(-1)[0]  # (n + 1, V)
                    score = sum(float(logp[i, t]) for i, t in enumerate(seq)) + (float(logp[n, stop]) if ends else 0)
                    ranked = score / max(n + ends, 1) ** lp
                    if ranked > best:
                        best, best_seq = ranked, list(seq)
        assert got.tokens[0] == best_seq and got.scores[0] == pytest.approx(best, abs=1e-4), lp


def test_generation_returns_per_step_attention():
    model = s2s()
    src = torch.randint(2, 30, (2, 6))
    src_keep = torch.arange(6)[None, :] < torch.tensor([6, 3])[:, None]
    out = mh.generate(model, src, src_keep, max_new_tokens=4, output_attentions=True)
    assert len(out.attentions) == 4
    for t, step in enumerate(out.attentions):
        assert len(step["self"]) == len(step["cross"]) == 2
        assert step["self"][0].shape == (2, 4, 1, t + 1) and step["cross"][0].shape == (2, 4, 1, 6)
        cross = step["cross"][1]
        torch.testing.assert_close(cross.sum(-1), torch.ones(2, 4, 1))
        assert torch.all(cross[1, :, :, 3:] == 0)  # padded source positions get no attention
    assert not any(hp.active for hp in mh.hook_points(model).values())  # recording hooks removed


def test_bad_inputs_name_the_fix():
    model = lm()
    ids, keep = left_padded()
    right = torch.ones(3, 6, dtype=torch.bool)
    right[1, 4:] = False
    with pytest.raises(ValueError, match="left-padded"):
        model.prefill(ids[:, :6], right)
    with pytest.raises(ValueError, match=r"outside \[0, 50\)"):
        model(torch.tensor([[1, 2, 99]]))
    with pytest.raises(ValueError, match="unsqueeze"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="unknown strategy"):
        GenerationConfig(strategy="topk")
    with pytest.raises(ValueError, match="temperature"):
        GenerationConfig(strategy="sample", temperature=0)
    with pytest.raises(ValueError, match="cross-attention needs one width"):
        mh.Seq2SeqConfig(encoder=mh.EncoderConfig(d_model=32), decoder=mh.DecoderConfig(d_model=64))
    with pytest.raises(ValueError, match="pass memory="):
        s2s().decoder(torch.randn(1, 3, 32))


def test_configs_round_trip_through_json():
    for cfg, klass in ((lm("rope", 2).config, mh.CausalLMConfig), (s2s(kv=2).config, mh.Seq2SeqConfig)):
        again = klass.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg


def test_decoder_gradients_match_finite_differences():
    """The decoder stack's gradients (self- and cross-attention through the kernel seam) against torch.autograd's
    numerical check, in fp64."""
    torch.manual_seed(0)
    dec = mh.TransformerDecoder(d_model=8, num_heads=2, num_layers=1, d_ff=16, dropout=0.0).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    mem = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[True, True, True], [True, False, False]])
    assert torch.autograd.gradcheck(lambda a, m: dec(a, m, memory_key_padding_mask=keep), (x, mem))


def test_seq2seq_initialisation_depends_on_the_seed_only():
    """The embeddings were initialised in a set's order (object addresses): the same seed gave other weights in
    another process, so 2 DDP processes could not match 1. Two fresh interpreters must agree to the bit."""
    import subprocess
    import sys

    code = (
        "import torch; from multihead.models.seq2seq import Seq2Seq, Seq2SeqConfig; torch.manual_seed(0); "
        "m = Seq2Seq(Seq2SeqConfig(src_vocab_size=30, tgt_vocab_size=40, max_len=16)); "
        "print(m.src_embed.weight[0, :4].tolist(), m.tgt_embed.weight[0, :4].tolist())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": str(s)},
        ).stdout
        for s in range(4)
    }
    assert len(outs) == 1 and outs != {""}, outs


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_suppressed_tokens_are_never_chosen_and_begin_suppressed_ones_not_first(strategy):
    model = lm()
    ids = torch.randint(1, 50, (2, 5), generator=torch.Generator().manual_seed(3))
    free = mh.generate(model, ids, None, strategy=strategy, max_new_tokens=8)
    banned = sorted({t for row in free.tokens for t in row})[:3]  # tokens the free run uses
    first = [row[0] for row in free.tokens]
    out = mh.generate(
        model, ids, None, strategy=strategy, max_new_tokens=8, suppress_tokens=banned[:2], begin_suppress_tokens=first
    )
    for row, f in zip(out.tokens, first):
        assert not set(row) & set(banned[:2]) and row[0] != f
    # without suppression the same call gives the free run back
    assert mh.generate(model, ids, None, strategy=strategy, max_new_tokens=8).tokens == free.tokens
    with pytest.raises(ValueError, match=r"suppressed token ids must be >= 0, got \[-3\]"):
        mh.generate(model, ids, None, strategy=strategy, suppress_tokens=(-3,))
