"""The sink findings (`multihead.interpret.findings`) on small models whose mechanism is planted by hand, so that each
measurement is checked against what the weights were built to do, and each finding is told apart from its simpler
explanation: a sink made by a feed-forward neuron's massive activation (it vanishes when the neuron is zeroed, and
follows the neuron to another token) against a sink carried by the first *position* itself (it stays, whatever the
neurons do), and sink attention that carries nothing (removing it costs nothing)."""

from __future__ import annotations

import math

import pytest
import torch

from multihead.interpret import findings as F
from multihead.interpret.findings import measure as M
from multihead.interpret.findings import sinks as S
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules.decoder import DecoderConfig

E, H, D, LAYERS, FF, V = 16, 2, 8, 4, 8, 20
C, FEAT, MASSIVE = 0, 1, 2  # the dimensions: on in every token, the first token's feature, the massive one
ORIGIN = 1  # the block whose feed-forward writes the massive activation


def _planted(sink_reads: str = "massive", neuron: bool = True) -> CausalLM:
    """A 4-layer LM built by hand. Every token has dimension C; the first position has dimension FEAT (through the
    position table: any token there). In block 1 one neuron (0) fires on FEAT and writes a massive value into
    dimension MASSIVE. In blocks 2 and 3 every head's query reads C and its key reads ``sink_reads``: the massive
    dimension (a sink made by the neuron) or FEAT (a sink carried by the first position). Values and outputs are
    zero, so attention moves nothing; blocks 0-1 attend uniformly."""
    dec = DecoderConfig(
        d_model=E, num_heads=H, num_layers=LAYERS, d_ff=FF, cross_attention=False, norm_first=True, dropout=0.0,
        norm="rms", bias=False, activation="relu",
    )  # fmt: skip
    torch.manual_seed(0)
    model = CausalLM(CausalLMConfig(vocab_size=V, max_len=64, positional="learned", decoder=dec)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in [n for layer in model.decoder.layers for n in layer.norms] + [model.decoder.final_norm]:
            norm.weight.fill_(1.0)
        model.embed.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
        model.embed.weight[:, :3] = 0
        model.embed.weight[:, C] = 1.0
        model.pos.embedding.weight[0, FEAT] = 1.0
        ffn = model.decoder.layers[ORIGIN].ffn
        if neuron:
            ffn.w_1.weight[0, FEAT] = 4.0
            ffn.w_2.weight[MASSIVE, 0] = 30.0
        g = torch.Generator().manual_seed(2)
        ffn.w_1.weight[1:, 3:] = torch.randn(FF - 1, E - 3, generator=g) * 0.1  # other neurons: small, elsewhere
        ffn.w_2.weight[3:, 1:] = torch.randn(E - 3, FF - 1, generator=g) * 0.1
        for layer in model.decoder.layers[2:]:
            a = layer.self_attn
            for h in range(H):
                a.w_q.weight[h * D, C] = 3.0
                a.w_k.weight[h * D, MASSIVE if sink_reads == "massive" else FEAT] = (
                    1.0 if sink_reads == "massive" else 6.0
                )
    return model


def _rows(n: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(2, V, (n, length), generator=torch.Generator().manual_seed(3))


def test_matrix_entropy_is_the_formula():
    assert M.matrix_entropy(torch.eye(4)) == pytest.approx(1.0)
    assert M.matrix_entropy(torch.ones(5, 3)) == pytest.approx(0.0, abs=1e-9)
    p = torch.tensor([0.8, 0.2])  # singular values 2 and 1: energies 4 and 1
    want = float(-(p * p.log()).sum() / math.log(2))
    assert M.matrix_entropy(torch.diag(torch.tensor([2.0, 1.0]))) == pytest.approx(want)


def test_uniform_attention_gives_the_formula_and_no_sink():
    model = _planted()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attn.w_q.weight.zero_()  # every pattern uniform
    p = M.measure(model, _rows(length=10))
    want = sum(1 / (q + 1) for q in range(1, 10)) / 9
    assert p.uniform == pytest.approx(want)
    assert p.share == pytest.approx([want] * LAYERS)
    assert p.sink_rate == [0.0] * LAYERS  # 0.21 on the first token: no head reaches 0.3
    assert p.second == pytest.approx([sum(1 / (q + 1) for q in range(2, 10)) / 8] * LAYERS)


def test_the_spike_the_sink_and_the_valley_share_layers_and_ablating_the_massive_dims_removes_the_sink():
    out = S.sink_valley(_planted(), _rows())
    assert out["origin"] == ORIGIN and out["dims"] == [MASSIVE]
    assert out["spike_layers"] == [1, 2, 3] and out["sink_layers"] == [2, 3]
    assert set(out["valley_layers"]) <= {1, 2, 3}
    assert out["after"]["sink_rate"][2:] == [0.0, 0.0]
    assert min(out["after"]["entropy"][1:]) > max(out["before"]["entropy"][1:])
    assert out["reproduced"] is True


def test_a_sink_made_by_a_super_neuron_vanishes_when_it_is_zeroed_and_follows_it_when_moved():
    out = S.massive_origin(_planted(), _rows(), k=1)
    assert out["origin"] == ORIGIN and out["neurons"] == [0] and out["neuron_share"] == pytest.approx(1.0)
    before, zeroed, control = (out[k]["share"][2:] for k in ("before", "zeroed", "control"))
    assert min(before) > 0.99 and max(zeroed) < 0.2 and control == pytest.approx(before)
    assert min(out["moved"]["share"][2:]) > 0.99 > 0.2 > max(out["unmoved"]["share"][2:])
    assert out["reproduced"] is True


def test_a_sink_carried_by_the_first_position_stays_whatever_the_neurons_do():
    out = S.massive_origin(_planted(sink_reads="position"), _rows(), k=1)
    assert out["origin"] == ORIGIN and out["neurons"] == [0]  # the same massive activation and super neuron...
    assert min(out["zeroed"]["share"][2:]) > 0.99  # ...but the sink does not need them
    assert max(out["moved"]["share"][2:]) < 0.2
    assert out["reproduced"] is False


def test_no_massive_activation_is_said_not_ablated():
    out = S.sink_valley(_planted(sink_reads="position", neuron=False), _rows())
    assert "no massive activation" in out["verdict"] and out["reproduced"] is False
    assert out["sink_layers"] == [2, 3]


def test_removing_sink_attention_that_carries_nothing_costs_nothing():
    out = S.sink_length(_planted(), lambda n: _rows(length=n), [12, 24])
    for r in out["lengths"].values():
        assert min(r["share"][2:]) > 0.99
        assert r["loss_without_sink"] == pytest.approx(r["loss"], abs=1e-6)  # values are zero: nothing moved
    assert out["reproduced"] is False


def test_a_model_without_neurons_to_edit_is_refused_with_the_reason():
    model = _planted()
    model.decoder.layers[ORIGIN].ffn = None
    with pytest.raises(ValueError, match="no feed-forward"):
        M.neuron_activations(model, _rows(), ORIGIN)


def test_unknown_finding_and_rows_too_short_are_refused():
    with pytest.raises(ValueError, match="sink-length, sink-valley, massive-origin"):
        F.check_name("sinks-of-doom")
    with pytest.raises(ValueError, match="too short"):
        M.measure(_planted(), torch.ones(1, 1, dtype=torch.long))


def test_the_spike_to_explain_is_the_first_or_the_largest():
    p = M.Pass(norm_first=[1.0, 12.0, 11.0, 2.0, 150.0, 140.0], norm_rest=[1.0] * 6)
    assert S.spike_origin(p, "first") == 1  # the first block at 10x
    assert S.spike_origin(p, "largest") == 4  # the first within 10x of the peak (150 / 10 = 15 > 12)
    flat = M.Pass(norm_first=[1.0, 3.0, 2.0], norm_rest=[1.0] * 3)
    assert S.spike_origin(flat, "largest") is None and S.spike_origin(flat, "first") is None
    with pytest.raises(ValueError, match="first, largest"):
        S.spike_origin(p, "loudest")


def test_a_needle_counts_when_every_answer_token_is_the_models_greedy_choice():
    from types import SimpleNamespace

    model, ids = _planted(), _rows(1, 12)[0].tolist()
    with torch.no_grad():
        first = int(model(torch.tensor([ids]))[0, -1].argmax())
        second = int(model(torch.tensor([ids + [first]]))[0, -1].argmax())
    right = SimpleNamespace(ids=ids, answer=[first, second])
    wrong = SimpleNamespace(ids=ids, answer=[first, (second + 1) % V])
    assert S.needle_hits(model, [right]) == 1.0 and S.needle_hits(model, [right, wrong]) == 0.5
    # the planted sink's values are zero: taking its attention away changes no choice
    assert S.needle_hits(model, [right], remove_sink=True) == 1.0
