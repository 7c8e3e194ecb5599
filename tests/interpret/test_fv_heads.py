"""Function-vector heads beside induction heads (`multihead.interpret.findings.icl`) on a 2-layer LM built by hand,
so that each score is checked against what the weights were built to do, and a function-vector head is told apart
from a head that merely copies:

* a previous-token head (layer 0) writes each token's predecessor; layer 0's neurons mark a label that is the right
  answer to the input before it (the pair shows the task);
* the function-vector head (layer 1, head 0) reads how many pairs show the task and writes a task direction; layer
  1's neurons turn "task on + input x" into the answer f(x);
* the induction head (layer 1, head 1) finds the earlier occurrence of the current token and copies what followed.

On prompts whose query is new, only the function-vector head can answer; on prompts whose query repeats a
demonstration, the copying head answers alone (a model without the function-vector head)."""

from __future__ import annotations

import random

import pytest
import torch

from multihead.interpret.findings import icl
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules.decoder import DecoderConfig

E, D, V, P = 64, 32, 14, 32
X, Y, PX, C, ISY, CONS, TASK, POS = 0, 6, 12, 24, 25, 26, 27, 32  # the stream's dimensions (PY follows PX)
N = 6  # pairs: input token 2 + i -> label token 8 + i
RMS_X, RMS_Y = (3 / 64) ** 0.5, (6 / 64) ** 0.5  # an input token's RMS (X, C, POS); a label's after layer 0


def _planted(fv_head: bool = True) -> CausalLM:
    dec = DecoderConfig(
        d_model=E, num_heads=2, num_layers=2, d_ff=16, cross_attention=False, norm_first=True, dropout=0.0,
        norm="rms", bias=False, activation="relu",
    )  # fmt: skip
    m = CausalLM(CausalLMConfig(vocab_size=V, max_len=P, positional="learned", decoder=dec)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for norm in [n for layer in m.decoder.layers for n in layer.norms] + [m.decoder.final_norm]:
            norm.weight.fill_(1.0)
        w = m.embed.weight
        w[:, C] = 1.0
        for i in range(N):
            w[2 + i, X + i] = w[8 + i, Y + i] = w[8 + i, ISY] = 1.0
        for p in range(P):
            m.pos.embedding.weight[p, POS + p] = 1.0
        a0, f0 = m.decoder.layers[0].self_attn, m.decoder.layers[0].ffn
        for p in range(P):  # layer 0, head 0: the previous token...
            a0.w_q.weight[p, POS + p] = 4.0
            if p + 1 < P:
                a0.w_k.weight[p + 1, POS + p] = 4.0
        for i in range(2 * N):  # ...whose identity it writes into PX / PY
            a0.w_v.weight[i, X + i] = RMS_X
            a0.w_o.weight[PX + i, i] = 1.0
        for i in range(N):  # layer 0's neurons: a label that answers the input before it -> CONS
            f0.w_1.weight[i, PX + i] = f0.w_1.weight[i, Y + i] = 1.0
            f0.w_1.weight[i, C] = -1.5
            f0.w_2.weight[CONS, i] = 0.56  # 1 / (0.5 / RMS of a label with CONS's inputs)
        a1, f1 = m.decoder.layers[1].self_attn, m.decoder.layers[1].ffn
        if fv_head:  # layer 1, head 0: attends to every label, writes how many show the task
            a1.w_q.weight[0, C] = a1.w_k.weight[0, ISY] = 3.0
            a1.w_v.weight[0, CONS] = 1.0
            a1.w_o.weight[TASK, 0] = RMS_Y
        for i in range(2 * N):  # layer 1, head 1: induction (the token after the earlier occurrence, copied)
            a1.w_q.weight[D + i, X + i] = a1.w_k.weight[D + i, PX + i] = 3.0
            a1.w_v.weight[D + i, X + i] = 1.0
            a1.w_o.weight[X + i, D + i] = 0.6
        for i in range(N):  # layer 1's neurons: the task on and input i here -> label i
            f1.w_1.weight[i, X + i] = f1.w_1.weight[i, TASK] = 1.0
            f1.w_1.weight[i, C] = -1.5
            f1.w_2.weight[Y + i, i] = 5.0
    return m


def _prompts(n: int, seed: int, *, repeat: bool, shots: int = 4) -> list[icl.Prompt]:
    """Start token, ``shots`` pairs, a query: new (``repeat=False``) or one of the demonstrations' inputs."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        xs = rng.sample(range(N), shots + 1)
        q = xs[rng.randrange(shots)] if repeat else xs[-1]
        moved = icl.derange(shots, rng)
        clean = [0] + [t for i in xs[:shots] for t in (2 + i, 8 + i)] + [2 + q]
        bad = [0] + [t for j, i in enumerate(xs[:shots]) for t in (2 + i, 8 + xs[moved[j]])] + [2 + q]
        out.append(icl.Prompt(tuple(clean), tuple(bad), 8 + q))
    return out


def _flipped(prompts: list[icl.Prompt]) -> list[icl.Prompt]:
    return [icl.Prompt(p.corrupted, p.clean, p.answer) for p in prompts]


FV, INDUCTION = (1, 0), (1, 1)


def test_the_function_vector_head_answers_new_queries_and_the_copying_head_does_not():
    m, prompts = _planted(), _prompts(12, 0, repeat=False)
    assert icl.accuracy(m, prompts) == 1.0 and icl.accuracy(m, _flipped(prompts)) == 0.0  # labels moved: no task
    fv = icl.fv_scores(m, prompts)
    ind = icl.induction_scores(m, low=2, high=V, half=6)
    assert icl.top_heads(fv, 1) == [FV] and icl.top_heads(ind, 1) == [INDUCTION]
    # the function-vector head's mean output restores the answer on the corrupted prompts almost surely...
    assert fv[FV] > 1 - 1 / N
    # ...the copying head's, an average of labels, can raise the answer no more than a uniform guess would
    assert fv[INDUCTION] < 1 / N and ind[FV] < ind[INDUCTION]
    table = icl.ablation_table(m, {"t": (prompts, _prompts(12, 1, repeat=False))}, fv, ind, [1], seed=0)
    row = table["k"]["1"]
    assert table["clean"]["t"] == 1.0
    assert row["fv"]["t"] == 0.0 and row["induction"]["t"] == 1.0  # only the function-vector head is needed
    assert row["heads"]["fv"] == [list(FV)] and row["heads"]["induction"] == [list(INDUCTION)]


def test_a_head_that_merely_copies_is_needed_for_repeated_queries_but_scores_no_function_vector():
    m, prompts = _planted(fv_head=False), _prompts(12, 0, repeat=True)
    assert icl.accuracy(m, prompts) == 1.0  # copying the label after the query's earlier occurrence...
    assert icl.accuracy(m, _prompts(12, 0, repeat=False)) == 0.0  # ...and nothing when the query is new
    fv = icl.fv_scores(m, prompts)
    assert fv[INDUCTION] < 1 / N  # its mean output carries no task
    table = icl.ablation_table(m, {"t": (prompts, _prompts(12, 1, repeat=True))}, fv, fv, [1], seed=0)
    assert table["k"]["1"]["fv"]["t"] == 0.0  # ablating it still costs every answer: needed is not a function vector


def test_the_finding_is_reproduced_on_the_planted_model_and_the_overlap_is_counted():
    m = _planted()
    tasks = {"t": (_prompts(8, 0, repeat=False), _prompts(8, 1, repeat=False))}
    out = icl.fv_vs_induction(m, tasks, ks=[1], vocab=(2, V))
    assert out["reproduced"] is True
    assert out["overlap"]["1"]["count"] == 0 and out["drops"]["1"]["fv"] == 1.0
    assert out["drops"]["1"]["induction"] == 0.0


def test_a_mean_output_is_the_mean_over_real_positions():
    m = _planted()
    rows = [(0, 2, 8), (0, 3, 9, 4, 10)]  # different lengths: the padding of the first row is left out
    got = icl.mean_outputs(m, rows, last=False)
    want = []
    for site in range(2):
        zs = []
        for r in rows:
            seen: list[torch.Tensor] = []
            handle = m.decoder.layers[site].self_attn.hook_z.add_hook(lambda z, h, seen=seen: seen.append(z))
            with torch.no_grad():
                m(torch.tensor([r]))
            handle.remove()
            zs.append(seen[0][0].transpose(0, 1))  # (L, H, D)
        want.append(torch.cat(zs).mean(0))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_prompts_move_every_label_and_keep_the_length():
    pairs = [(f"w{i}", f"v{i}") for i in range(12)]
    encode = lambda s: [ord(c) for c in s]  # noqa: E731  (one id per character)
    prompts = icl.text_prompts(pairs, encode, n=5, shots=4, seed=0)
    for p in prompts:
        assert len(p.clean) == len(p.corrupted) and p.clean[-4:] == p.corrupted[-4:]
        clean, bad = "".join(map(chr, p.clean)), "".join(map(chr, p.corrupted))
        labels = [line[3:] for line in clean.split("\n") if line.startswith("A: ")]
        moved = [line[3:] for line in bad.split("\n") if line.startswith("A: ")]
        assert sorted(labels) == sorted(moved) and all(a != b for a, b in zip(labels, moved))
        assert p.answer == ord(" ")  # the first token of " v..": a space, in this one-character tokenizer
    with pytest.raises(ValueError, match="demonstrations"):
        icl.text_prompts(pairs, encode, n=1, shots=12, seed=0)
    assert sorted(icl.derange(5, random.Random(0))) == list(range(5))
