"""DuoAttention's gates fitted by distillation (:func:`multihead.interpret.kv.heads.fit_gates`): a head whose output
the model never uses gets its gate pushed to 0 by the penalty alone, heads whose window-only attention would change
the answer keep theirs, and with a window that covers the whole prompt nothing separates the heads (the mixed model
is the full one), so every gate falls alike."""

from __future__ import annotations

import pytest
import torch

from multihead.data.needles import Needle
from multihead.interpret.kv.heads import classify, fit_gates, ranking
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules.decoder import DecoderConfig

E, H, G, D, L = 32, 4, 2, 8, 2


def _lm() -> CausalLM:
    torch.manual_seed(0)
    dec = DecoderConfig(
        d_model=E,
        num_heads=H,
        num_layers=L,
        cross_attention=False,
        norm_first=True,
        dropout=0.0,
        attention={"num_kv_heads": G},
    )
    return CausalLM(CausalLMConfig(vocab_size=60, max_len=256, positional="rope", decoder=dec)).eval()


def _needles(n: int = 2, length: int = 96) -> list[Needle]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        ids = torch.randint(1, 60, (length,), generator=g).tolist()
        answer = ids[10:13]  # what the end asks for sits far outside a short window
        out.append(Needle(ids, answer, 8, 14, 10, 0.1, "Lisbon", "0"))
    return out


def test_an_unused_head_loses_its_gate_and_used_heads_keep_theirs():
    model = _lm()
    with torch.no_grad():  # layer 0, key/value head 0 (query heads 0 and 1): its output is never read
        model.decoder.layers[0].self_attn.w_o.weight[:, : 2 * D] = 0
    before = [p.clone() for p in model.parameters()]
    options = dict(window=8, sinks=2, steps=30, lr=0.05, penalty=1e-4, tail=16)
    fit = fit_gates(model, _needles(), **options)
    gates = fit["gates"]
    assert gates[0][0] < 0.05  # only the penalty acts on it
    assert min(gates[0][1], *gates[1]) > gates[0][0] + 0.3  # the heads that matter hold on to the full cache
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model itself is untouched
    assert all(p.requires_grad for p in model.parameters()) and len(fit["losses"]) == 30 and fit["seconds"] >= 0
    split = classify(model, _needles(), fraction=0.5, score="fitted", fit=options)
    assert 0 not in split["split"]["full_heads"][0] and split["gates"]["gates"] == gates
    assert ranking(split) == gates  # what a split at another share is drawn from (bench kv --kv-heads)
    assert [t["gate"] for t in split["heads"] if t["layer"] == 0] == [gates[0][0]] * 2 + [gates[0][1]] * 2


def test_a_window_over_the_whole_prompt_separates_no_head():
    model = _lm()
    fit = fit_gates(model, _needles(length=40), window=64, steps=10, penalty=0.05, tail=8)
    flat = [g for row in fit["gates"] for g in row]
    assert max(fit["losses"]) < 1e-6  # the mixed model is the full model
    assert max(flat) - min(flat) < 1e-6 and max(flat) < 1.0  # every gate falls alike, by the penalty alone


def test_fitting_needs_needles():
    with pytest.raises(ValueError, match="needle prompts"):
        fit_gates(_lm(), [])
    with pytest.raises(ValueError, match="fitted split needs needles"):
        classify(_lm(), [], score="fitted")
