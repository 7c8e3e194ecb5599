"""Induction heads: the detector on a planted pattern and on random models, the copying score against the V x V
formula, the toy model's phase change, and the CLI."""

import json

import pytest
import torch

from multihead.cli import main
from multihead.interpret.roles import induction as I
from multihead.modules.variants import AttentionConfig


def _causal_uniform(l: int) -> torch.Tensor:
    w = torch.tril(torch.ones(l, l))
    return w / w.sum(-1, keepdim=True)


def test_prefix_matching_finds_a_planted_induction_head_and_not_others():
    half = 8
    l = 1 + 2 * half
    g = torch.Generator().manual_seed(0)
    r = torch.stack([torch.randperm(45, generator=g)[:half] + 5 for _ in range(3)])  # distinct tokens per half
    ids = torch.cat([torch.zeros(3, 1, dtype=torch.long), r, r], 1)
    assert I.repeated_tokens(3, half, low=5, high=50, start=0, generator=g).shape == ids.shape
    # a planted induction head: every query attends to the key right after the previous occurrence of its token
    planted = torch.zeros(3, l, l)
    for b in range(3):
        for q in range(l):
            earlier = [j for j in range(q) if ids[b, j] == ids[b, q]]
            planted[b, q, earlier[-1] + 1 if earlier else 0] = 1.0
    prev = torch.zeros(l, l)
    prev[0, 0] = 1.0
    prev[torch.arange(1, l), torch.arange(0, l - 1)] = 1.0  # a previous-token head
    pattern = torch.stack([planted, _causal_uniform(l).expand(3, l, l), prev.expand(3, l, l)], 1)  # (B, 3, L, L)
    score = I.prefix_matching([pattern], half)[0]
    assert score[0] == pytest.approx(1.0) and score[2] == 0.0
    # the uniform head: mean over queries at positions 1+half+i of 1/(2+half+i)
    expected = sum(1 / (2 + half + i) for i in range(half - 1)) / (half - 1)
    assert score[1].item() == pytest.approx(expected, rel=1e-6)
    assert I.induction_roles(score[None]) == [["induction", "-", "-"]]


def _tiny_lm(seed=0, heads=4, kv=None):
    from multihead.models import CausalLM, CausalLMConfig
    from multihead.modules.decoder import DecoderConfig

    torch.manual_seed(seed)
    return CausalLM(
        CausalLMConfig(
            vocab_size=30,
            max_len=64,
            decoder=DecoderConfig(
                d_model=32,
                num_heads=heads,
                attention=AttentionConfig(num_kv_heads=kv),
                num_layers=2,
                d_ff=0,
                dropout=0.0,
                norm_first=True,
                cross_attention=False,
            ),
        )
    ).eval()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_induction_head_in_a_random_model(seed):
    s = I.induction_scores(_tiny_lm(seed), half=16, batch=8, low=1, start=0)
    assert s["prefix_matching"].shape == (2, 4)
    assert float(s["prefix_matching"].max()) < I.INDUCTION


@pytest.mark.parametrize("kv", [None, 2])
def test_copying_score_equals_the_eigenvalues_of_the_full_ov_circuit(kv):
    model = _tiny_lm(kv=kv)
    scores = I.copying_scores(model)
    w_e, w_u = model.embed.weight.double(), model.lm_head.weight.double()
    attn = model.decoder.layers[1].self_attn
    dh, group = attn.head_dim, attn.num_heads // attn.num_kv_heads
    for h in range(attn.num_heads):
        j = h // group
        w_v = attn.w_v.weight.double()[j * dh : (j + 1) * dh]  # (dh, E)
        w_o = attn.w_o.weight.double()[:, h * dh : (h + 1) * dh]  # (E, dh)
        full = w_u @ w_o @ w_v @ w_e.T  # (V, V): token attended to -> logits
        lam = torch.linalg.eigvals(full)
        assert scores[1, h].item() == pytest.approx((lam.real.sum() / lam.abs().sum()).item(), abs=1e-6)


def test_an_attention_only_block_has_no_ffn():
    model = _tiny_lm()
    assert all(layer.ffn is None for layer in model.decoder.layers)
    assert not any("ffn" in n for n, _ in model.named_parameters())


@pytest.fixture(scope="module")
def toy():
    torch.set_num_threads(1)
    return I.train_toy(I.ToyConfig(steps=1500, eval_every=100))  # the phase change comes at ~1,200 steps


def test_the_toy_model_learns_induction_with_a_phase_change(toy):
    r = toy
    assert r["phase_change_step"] is not None and 0 < r["phase_change_step"] <= 1500
    first = r["history"][0]
    assert first["loss_second_half"] > 0.9 * first["loss_first_half"]  # at the start: no help from the repeat
    assert r["loss_second_half"] < 0.5 * r["loss_first_half"]
    pm = torch.tensor(r["prefix_matching"])
    assert pm[1].max() >= I.INDUCTION and pm[0].max() < I.INDUCTION  # formed in the second layer (K-composition)


def test_the_toy_models_induction_heads_read_the_previous_token_heads_through_their_keys(toy):
    from multihead.interpret.causal.circuits import induction_circuit

    cfg = toy["config"]
    # the toy spreads "previous token" over its four layer-0 heads (~0.2 each): all of them are the senders
    r = induction_circuit(
        toy["model"],
        start=cfg["vocab"],
        low=0,
        high=cfg["vocab"],
        half=cfg["half"],
        sequences=3,
        senders=[(0, h) for h in range(4)],
    )
    assert {l for l, _, _ in r["receivers"]} == {1}
    m = r["mean"]
    gain = m["original"] - m["first_half"]
    assert gain > 1.0  # the repeated half is predicted far better than the first
    # K-composition: through the induction heads' keys the senders' change removes most of the copying gain, through
    # their queries little (layer 0 reaches layer 1's heads only through q, k and v: attention only, 2 layers)
    assert m["original"] - m["k"] > 0.75 * gain
    assert m["original"] - m["q"] < 0.25 * gain
    assert m["original"] - m["k"] > m["original"] - m["v"]
    assert len(r["sender_through_k"]) == len(r["senders"])
    with pytest.raises(ValueError, match="no head of this model has a prefix-matching score >= 1.5"):
        induction_circuit(toy["model"], start=cfg["vocab"], high=cfg["vocab"], half=cfg["half"], threshold=1.5)


def test_cli_induction_and_heads_on_a_causal_run(tmp_path, capsys):
    out = tmp_path / "ind"
    assert main(["induction", "--out", str(out), "--steps", "60", "--threads", "1", "--no-progress"]) == 0
    r = json.loads((out / "induction.json").read_text())
    assert (out / "induction.png").is_file() and len(r["history"]) == 3 and "phase change" in capsys.readouterr().out
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["induction", "--out", str(other), "--steps", "60", "--no-progress"]) == 2  # not someone's folder
    assert "--overwrite" in capsys.readouterr().err and (other / "notes.txt").read_text() == "mine"
