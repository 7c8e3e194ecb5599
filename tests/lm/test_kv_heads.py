"""Heads for the KV cache: Wu et al.'s retrieval score and the echo/induction scores against their formulas on full
captured maps, the needles, the split, and `multihead heads --kv` / `multihead kv` end to end on a small random
GGUF model, with their messages for bad input."""

import json

import pytest
import torch

from hf_families import hf_model, write_gguf
from multihead import lm as LM
from multihead.cli import main
from multihead.data.needles import CITIES, make_needles
from multihead.interpret.kv import heads as K
from multihead.modules.capture import capture
from multihead.modules.kv import KV_POLICIES


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    return str(
        write_gguf(
            hf_model("llama", rope_scaling=None, max_position_embeddings=512),
            tmp_path_factory.mktemp("g") / "tiny.gguf",
        )
    )


@pytest.fixture(scope="module")
def tiny(gguf_model):
    return LM.load(gguf_model)


def test_needles_are_exact_seeded_and_hold_the_answer(tiny):
    needles = K.needles_for(tiny, length=200, count=3, seed=5)
    again = K.needles_for(tiny, length=200, count=3, seed=5)
    assert [n.ids for n in needles] == [n.ids for n in again]
    assert [n.depth for n in needles] == pytest.approx([0.1, 0.5, 0.9])
    for n in needles:
        assert len(n.ids) == 200
        assert n.ids[n.answer_at : n.answer_at + len(n.answer)] == n.answer  # verbatim inside the needle
        assert n.needle_start <= n.answer_at < n.needle_end <= len(n.ids)
        assert n.number in tiny.decode(n.ids[n.needle_start : n.needle_end])
    starts = [n.needle_start for n in needles]
    assert starts[0] < 20 < starts[1] < 60 < starts[2]  # spread over the haystack (83 tokens here)
    with pytest.raises(ValueError, match="no room"):
        make_needles(lambda t: tiny.encode(t, special=False), ["some text"] * 5, length=60, count=1)
    with pytest.raises(ValueError, match="past the"):
        K.needles_for(tiny, length=100_000, count=1)


def test_multi_key_needles_hide_the_answer_among_look_alikes(tiny):
    one = K.needles_for(tiny, length=300, count=2, seed=5)
    assert [n.ids for n in one] == [n.ids for n in K.needles_for(tiny, length=300, count=2, seed=5, keys=1)]
    for n in K.needles_for(tiny, length=300, count=2, seed=5, keys=4):
        text = tiny.decode(n.ids)
        assert len(n.ids) == 300 and text.count("The special magic number for") == 4 + 1  # 4 needles + the question
        assert len({c for c in CITIES if f"number for {c} is" in text}) == 4  # four cities, each once
        assert n.ids[n.answer_at : n.answer_at + len(n.answer)] == n.answer
        assert f"number for {n.city} is {n.number}" in tiny.decode(n.ids[n.needle_start : n.needle_end])
        assert text.endswith(f"The special magic number for {n.city} is")  # the question asks the placed one
    with pytest.raises(ValueError, match="keys is the number of needles"):
        K.needles_for(tiny, length=300, count=1, keys=0)


def test_retrieval_score_is_wu_et_al_on_full_maps(tiny):
    needles = K.needles_for(tiny, length=160, count=2, seed=0)
    got = K.retrieval_scores(tiny.model, needles)
    want = torch.zeros_like(got["retrieval"])
    for n in needles:
        ids = torch.tensor([n.ids + n.answer[:-1]])
        with torch.no_grad(), capture(tiny.model, ("pattern",)) as cap:
            logits = tiny.model(ids)[0]
        for r, answer in enumerate(n.answer):
            row = len(n.ids) - 1 + r
            if int(logits[row].argmax()) != answer:  # only tokens the model itself would write
                continue
            for layer, p in enumerate(cap.patterns()):
                for h in range(p.shape[1]):
                    j = int(p[0, h, row].argmax())
                    if n.needle_start <= j < n.needle_end and int(ids[0, j]) == answer:
                        want[layer, h] += 1 / len(n.answer) / len(needles)
    torch.testing.assert_close(got["retrieval"], want)


def test_echo_and_induction_on_full_maps(tiny):
    half = 16
    got = K.echo_and_induction(tiny.model, half=half, batch=2, low=10, start=1, seed=3)
    from multihead.interpret.roles.induction import repeated_tokens

    ids = repeated_tokens(2, half, low=10, high=300, start=1, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), capture(tiny.model, ("pattern",)) as cap:
        tiny.model(ids)
    for layer, p in enumerate(cap.patterns()):
        echo = [sum(float(p[b, h, 1 + half + i, 1 + i]) for b in range(2) for i in range(half - 1)) for h in range(4)]
        ind = [sum(float(p[b, h, 1 + half + i, 2 + i]) for b in range(2) for i in range(half - 1)) for h in range(4)]
        torch.testing.assert_close(got["echo"][layer], torch.tensor(echo) / (2 * (half - 1)))
        torch.testing.assert_close(got["induction"][layer], torch.tensor(ind) / (2 * (half - 1)))


def test_split_takes_the_top_share_of_key_value_heads():
    scores = torch.tensor([[0.9, 0.1, 0.2, 0.0], [0.05, 0.5, 0.3, 0.4]])  # 2 layers x 4 query heads
    per_kv = K.kv_head_scores(scores, [2, 2])  # GQA: heads 0-1 share kv head 0, 2-3 kv head 1
    torch.testing.assert_close(torch.tensor(per_kv), torch.tensor([[0.9, 0.2], [0.5, 0.4]]))
    assert K.split(per_kv, 0.5) == [[0], [0]]
    assert K.split(per_kv, 0.01) == [[0], []]  # at least one
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        K.split(per_kv, 0.0)


def test_heads_kv_and_kv_curves_end_to_end(gguf_model, tmp_path, capsys):
    heads = tmp_path / "heads"
    args = ["heads", gguf_model, "--kv", "--needles", "2", "--needle-len", "160", "--out", str(heads)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "retrieval heads" in printed and "head-aware split" in printed
    r = json.loads((heads / "kv-heads.json").read_text())
    assert len(r["heads"]) == 8 and len(r["split"]["full_heads"]) == 2
    assert (heads / "kv-heads.png").stat().st_size > 0
    fitted = tmp_path / "fitted"  # DuoAttention's gates, fitted on the needles
    assert main([*args[:-1], str(fitted), "--kv-score", "fitted"]) == 0
    assert "gates fitted by distillation in" in capsys.readouterr().out
    g = json.loads((fitted / "kv-heads.json").read_text())
    assert g["split"]["score"] == "fitted" and len(g["gates"]["losses"]) == g["gates"]["settings"]["steps"]
    assert [len(row) for row in g["gates"]["gates"]] == r["num_kv_heads"]
    out = tmp_path / "kv"
    args = ["kv", gguf_model, "--heads", str(heads / "kv-heads.json"), "--out", str(out), "--lengths", "180"]
    args += ["--budgets", "8,16", "--needles", "1", "--context", "40", "--tokens", "6", "--no-progress"]
    assert main(args) == 0
    result = json.loads((out / "kv.json").read_text())
    assert {(p["policy"], p["budget"]) for p in result["perplexity"]["points"]} == {("full", None)} | {
        (name, b) for name in KV_POLICIES if name not in ("full", "streaming") for b in (8, 16)
    }  # every registered policy that applies to a recorded prompt, by default
    full = next(p for p in result["perplexity"]["points"] if p["policy"] == "full")
    assert full["share"] == 1.0
    small = next(p for p in result["points"] if p["policy"] == "window" and p["budget"] == 8)
    assert small["share"] == pytest.approx(8 / 180, abs=1e-3)  # the kept keys' bytes over the full cache's
    assert (out / "kv.png").stat().st_size > 0
    assert "perplexity" in capsys.readouterr().out
    # the same command again replaces its own output; files the user added stop it, and stay as they were
    assert main(args) == 0
    mine = {".git/HEAD": "ref: refs/heads/main\n", "my_analysis.json": "{}", "thesis_figure.png": "png"}
    for name, text in mine.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ".git/" in err and "my_analysis.json" in err and "multihead did not write" in err
    assert all((out / n).read_text() == t for n, t in mine.items())
    assert (out / "kv.json").is_file()


def test_kv_refusals(gguf_model, tmp_path, capsys):
    out = str(tmp_path / "kv")
    assert main(["kv", gguf_model, "--out", out, "--policies", "head-aware"]) == 2
    assert "--heads" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"split": {"full_heads": "all"}}))
    assert main(["kv", gguf_model, "--out", out, "--heads", str(bad)]) == 2
    assert "one list of key/value head indices per layer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["kv", gguf_model, "--out", out, "--budgets", "0,64"])
    assert "positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["kv", gguf_model, "--out", out, "--policies", "lru"])
    assert "choose from full" in capsys.readouterr().err
    assert main(["kv", gguf_model, "--out", out, "--policies", "full", "--context", "4000"]) == 2
    assert "positions" in capsys.readouterr().err


def test_heads_kv_refusals_leave_no_folder(gguf_model, tmp_path, capsys):
    out = tmp_path / "heads"
    for flags in (["heads", gguf_model, "--kv"], ["kv", gguf_model]):  # absurd counts: refused before any prompt
        with pytest.raises(SystemExit):
            main([*flags, "--needles", "1000000000", "--out", str(out)])
        assert "at most" not in (err := capsys.readouterr().err) and "256]" in err
    with pytest.raises(ValueError, match="needle prompts in \\[1, 256\\]"):
        make_needles(lambda t: [1], ["text"], length=60, count=10**9)
    cases = [
        (["--needle-len", "40"], "no room for a haystack"),
        (["--needle-len", "100000"], "past the 512 positions"),
        (["--kv-score", "retrieval", "--needles", "0"], "needs needles"),
        (["--kv-score", "fitted", "--needles", "0"], "needs needles"),
    ]
    for flags, message in cases:
        assert main(["heads", gguf_model, "--kv", "--out", str(out), *flags]) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()
    assert main(["heads", "minilm", "--kv", "--out", str(out)]) == 2
    assert "without --kv, `multihead heads` takes it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["heads", gguf_model, "--kv", "--kv-fraction", "1.5"])
    assert "1.5" in capsys.readouterr().err


def test_kv_refuses_a_split_of_another_model_and_lengths_past_the_positions(gguf_model, tmp_path, capsys):
    out = tmp_path / "kv"
    short = ["--context", "40", "--tokens", "6"]  # within the tiny model's 512 positions
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"split": {"full_heads": [[0], [1], [0]]}}))  # three layers; the model has two
    assert main(["kv", gguf_model, "--out", str(out), "--heads", str(other), "--lengths", "180", *short]) == 2
    assert "names 3 layers" in capsys.readouterr().err
    assert main(["kv", gguf_model, "--out", str(out), "--heads", str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["kv", gguf_model, "--out", str(out), "--policies", "full", "--lengths", "100000", *short]) == 2
    assert "--lengths 512 or less" in capsys.readouterr().err
    not_json = tmp_path / "not.json"
    not_json.write_text("{split")
    assert main(["kv", gguf_model, "--out", str(out), "--heads", str(not_json)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not out.exists()


def test_bench_decode_refuses_a_bad_split_before_any_case(gguf_model, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"heads": []}))
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--model", gguf_model, "--kv-heads", str(bad), "--out", str(out)]) == 2
    assert "no split.full_heads" in capsys.readouterr().err
    other = tmp_path / "other.json"  # a split of three layers; the model has two
    other.write_text(json.dumps({"split": {"full_heads": [[0], [1], [0]]}}))
    assert main(["bench", "decode", "--model", gguf_model, "--kv-heads", str(other), "--out", str(out)]) == 2
    assert "names 3 layers" in capsys.readouterr().err
    assert main(["bench", "decode", "--model", gguf_model, "--context", "1000000", "--out", str(out)]) == 2
    assert "past" in (err := capsys.readouterr().err) and "512 positions" in err and "--context 448 or less" in err
    assert not out.exists()


def test_head_aware_at_a_fraction_holds_that_share_of_the_bytes():
    from multihead.modules.kv import head_aware_at

    full_heads, groups, length = [[0], [], [1, 2]], [3, 3, 3], 400
    with pytest.raises(ValueError, match="more than the 25% asked for"):
        head_aware_at(0.25, length, full_heads, groups)  # a third of the heads whole is already over a quarter
    policy = head_aware_at(0.5, length, full_heads, groups)
    assert policy.keep_all == ((0,), (), (1, 2))
    window = policy.streaming.sinks + policy.streaming.window
    kept = 3 * length + 6 * window  # 3 of 9 heads keep all 400 keys, the other 6 the sinks and the window
    assert abs(kept / (9 * length) - 0.5) < 1 / length
    with pytest.raises(ValueError, match="full_heads names 2 layers; the model has 3"):
        head_aware_at(0.5, length, [[0], [1]], groups)


def test_head_aware_at_most_a_fraction_never_holds_more_and_holds_the_most_it_can():
    from multihead.modules.kv import head_aware_at

    full_heads, groups = [[0], [], [1, 2]], [3, 3, 3]  # 3 of 9 heads whole, 6 windowed
    for length in (400, 401, 2047):
        for keys in (length // 2, length // 2 + 1, (3 * length) // 4):  # keys per head, as a budget gives them
            policy = head_aware_at(keys / length, length, full_heads, groups, at_most=True)
            window = policy.streaming.sinks + policy.streaming.window
            held = 3 * length + 6 * window
            assert held <= 9 * keys < held + 6, (length, keys)  # not over; one key more per windowed head would be
    # rounded to the nearest key instead: 2047 x (1/2 - 1/3) / (2/3) = 511.75 windowed keys, 512: over half the bytes
    over = head_aware_at(0.5, 2047, full_heads, groups)
    assert 3 * 2047 + 6 * (over.streaming.sinks + over.streaming.window) > 9 * 2047 * 0.5


def test_head_aware_at_a_fraction_the_whole_heads_already_hold_keeps_the_smallest_window():
    from multihead.modules.kv import head_aware_at

    policy = head_aware_at(0.25, 100, [[0], []], [2, 2])  # one of four heads whole: a quarter already
    assert policy.streaming.sinks + policy.streaming.window == 5
