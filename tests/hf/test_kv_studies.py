"""The KV studies under bench/ refuse what cannot run before any model is read, as `bench kv` refuses: a sample
count out of bounds, a length past the model's positions, a fraction outside (0, 1], a list that does not parse, a
file that is not a kv-heads.json. Nothing is written. (The studies themselves are measurements: bench/results.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _study(name: str):
    spec = importlib.util.spec_from_file_location(f"study_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


CASES = [
    ("kv_head_share", ["--n", "0"], "--n is the number of samples"),
    ("kv_head_share", ["--length", "100000"], "past the 8192 positions"),
    ("kv_head_share", ["--fraction", "1.5"], "--fractions are kept shares"),
    ("kv_head_share", ["--shares", "0.1,x"], "--shares is a comma-separated list of numbers"),
    ("kv_head_share", ["--shares", ""], "--shares is a comma-separated list of numbers"),
    ("kv_head_share", ["--shares", "0.3"], "--shares are shares of the key/value heads in (0, --fraction)"),
    ("kv_head_share", ["--kv-heads", "{missing}"], "not a kv-heads.json"),
    ("kv_fwe_start", ["--n", "1001"], "--n is the number of samples"),
    ("kv_fwe_start", ["--fractions", "0.25,0"], "--fractions are kept shares"),
    ("kv_fwe_start", ["--length", "100"], "at least 256 tokens"),
    ("kv_fwe_start", ["--fractions", "a quarter"], "--fractions is a comma-separated list of numbers"),
    ("kv_snapkv_digits", ["--fraction", "0"], "--fractions are kept shares"),
    ("kv_snapkv_digits", ["--length", "9000"], "past the 8192 positions"),
    ("kv_question_inside", ["--n", "0"], "--n is the number of samples"),
    ("kv_question_inside", ["--fraction", "1.5"], "--fractions are kept shares"),
    ("kv_question_inside", ["--length", "9000"], "past the 8192 positions"),
    ("kv_snapkv_settings", ["--settings", "32:6"], "--settings is a comma-separated list of window:kernel pairs"),
    ("kv_snapkv_settings", ["--settings", "32"], "--settings is a comma-separated list of window:kernel pairs"),
    ("kv_snapkv_settings", ["--settings", "0:5"], "--settings is a comma-separated list of window:kernel pairs"),
    ("kv_snapkv_settings", ["--task", "squad"], "bench kv knows no task squad"),
    ("kv_snapkv_settings", ["--protocol", "both"], "bench kv knows no protocol both"),
    ("kv_snapkv_settings", ["--grid", "{missing}"], "not a bench kv JSON"),
]


@pytest.mark.parametrize("name,flags,message", CASES, ids=[f"{c[0]}{' '.join(c[1])}" for c in CASES])
def test_a_study_refuses_bad_flags_before_reading_a_model(name, flags, message, tmp_path, monkeypatch, capsys):
    import multihead.bench.kv as kv

    def no_model(*args, **kwargs):  # reading a model is what a refusal must come before
        raise AssertionError("a model was read")

    monkeypatch.setattr(kv, "smollm2_folder", no_model)
    monkeypatch.setattr(kv, "OursSide", no_model)
    monkeypatch.setattr(kv, "folder_positions", lambda folder: kv.SMOLLM2_POSITIONS)  # the default folder's
    out = tmp_path / "study.json"
    flags = [f.format(missing=tmp_path / "none.json") for f in flags]
    assert _study(name).main([*flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_partial_copy_counts_the_needles_first_characters_in_order():
    copied = _study("kv_head_share").copied
    assert copied("The number is 2002747.", "2002747") == 7
    assert copied("The number is 2002.", "2002747") == 4
    assert copied("I do not know", "2002747") == 0
    assert copied("7472002", "2002747") == 4  # the start found elsewhere in the answer still counts, in order


def test_the_first_digit_given_is_the_answers_start_up_to_the_needles_first_digit():
    study = _study("kv_question_inside")

    class Chars:  # one token per character, as SmolLM2 writes a number one digit per token after a space
        def encode(self, text, special=True):
            return ([0] if special else []) + [ord(c) for c in text]  # a BOS only where special tokens are asked for

        def decode(self, ids):
            return "".join(map(chr, ids))

    assert study.given(Chars(), "3382776") == [ord(" "), ord("3")]
    with pytest.raises(ValueError, match="holds no digit"):
        study.given(Chars(), "apple")
    assert study.first_digit(" 3382776.") == "3"
    assert study.first_digit("It is 12, not 3.") == "1"
    assert study.first_digit("I do not know") == ""


def test_the_studies_sign_test_is_bench_kvs_paired_comparison():
    from scipy.stats import binomtest

    from multihead.bench.kv import sign_test

    a, b = [1.0, 1.0, 0.5, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert sign_test(a, b) == {"better": 3, "worse": 0, "p": float(f"{binomtest(3, 3).pvalue:.3g}")}
    assert sign_test(b, a)["worse"] == 3
    with pytest.raises(ValueError, match="same questions"):
        sign_test(a, b[:-1])


def test_each_expected_value_is_a_needle_found_where_it_lies():
    found = _study("kv_head_share").found
    text = "a" * 10 + "4411" + "b" * 26 + "2002" + "c" * 56  # 100 characters
    got = found("They are 2002 and 9.", text, ("4411", "2002"))
    assert got == [(0.1, False), (0.4, True)]
    assert sum(hit for _, hit in got) / len(got) == 0.5  # their mean is the question's RULER score
    from multihead.data.ruler import score

    assert score("They are 2002 and 9.", ["4411", "2002"]) == 0.5


def test_the_settings_study_reads_pairs_and_a_grids_cell(tmp_path):
    import json

    study = _study("kv_snapkv_settings")
    assert study.settings("32:7,64:5") == [(32, 7), (64, 5)]
    row = {"task": "fwe", "length": 2048, "protocol": "question", "fraction": 0.125}
    grid = tmp_path / "grid.json"
    grid.write_text(
        json.dumps(
            {
                "results": [
                    {**row, "method": "SnapKVPress", "scores": [0.3333, 0.0]},
                    {**row, "method": "snapkv", "scores": None},  # a resumed row that kept no scores
                    {**row, "protocol": "context", "method": "snapkv", "scores": [1.0, 1.0]},
                ]
            }
        )
    )
    assert study.grid_scores(grid, "fwe", 2048, "question") == {("SnapKVPress", 0.125): [0.3333, 0.0]}


def test_the_summary_tells_cells_apart_by_intervals_then_question_by_question(tmp_path, capsys):
    import json

    from multihead.bench.kv import wilson

    summary = _study("kv_summary")

    def row(method, side, fraction, scores):
        lo, hi = wilson(sum(scores), len(scores))
        return {
            "task": "niah_single_number",
            "length": 2048,
            "protocol": "context",
            "side": side,
            "method": method,
            "fraction": fraction,
            "questions": len(scores),
            "score": sum(scores) / len(scores),
            "score_sum": sum(scores),
            "interval": [lo, hi],
            "scores": scores,
        }

    n = 40
    ahead_apart = row("head-aware", "multihead", 0.5, [1.0] * n), row("StreamingLLMPress", "kvpress", 0.5, [0.0] * n)
    assert summary.verdict(*ahead_apart) == "ahead, apart" and summary.verdict(*ahead_apart[::-1]) == "behind, apart"
    # 0.35 against 0.2: the intervals overlap, but a is higher on 6 questions and lower on none (p = 0.031)
    a = row("head-aware", "multihead", 0.25, [1.0] * 14 + [0.0] * 26)
    b = row("StreamingLLMPress", "kvpress", 0.25, [1.0] * 8 + [0.0] * 32)
    assert a["interval"][0] < b["interval"][1]
    assert summary.verdict(a, b) == "ahead" and summary.verdict(b, a) == "behind"
    # the same scores on other questions: 8 and 14 differ, p = 0.29; and without per-question scores, the intervals only
    shuffled = row("StreamingLLMPress", "kvpress", 0.25, [0.0] * 26 + [1.0] * 8 + [0.0] * 6)
    assert summary.verdict(a, shuffled) == "level"
    assert summary.verdict(a, {**b, "scores": None}) == "level"
    full = row("full", "multihead", 1.0, [1.0] * n)
    payload = {
        "suite": "kv",
        "config": {"n": 50, "tasks": ["niah_single_number"]},
        "done": {"niah_single_number/2048/context": 50},
        "results": [full, *ahead_apart, a, b],
    }
    cells = summary.cells(payload)
    assert [(c["fraction"], c["head_aware_verdict"], c["best_verdict"]) for c in cells] == [
        (0.25, "ahead", "ahead"),
        (0.5, "ahead, apart", "ahead, apart"),
    ]
    assert summary.cells({**payload, "done": {"niah_single_number/2048/context": 49}}) == []  # still running
    run = tmp_path / "kv.json"
    run.write_text(json.dumps(payload))
    assert summary.main([str(run)]) == 0
    page = capsys.readouterr().out
    assert "The head-aware cache against kvpress's best press, 2 cells: ahead, apart 1, ahead 1, level 0" in page
    assert summary.main([str(run), "--floor", "1.5"]) == 2 and "--floor is a score in [0, 1]" in capsys.readouterr().err
    # a run that kept no per-question scores takes a rerun's where the rerun scored the same; one that did not is said
    unpaired = {**payload, "results": [{**r, "scores": None} for r in payload["results"]]}
    assert [c["head_aware_verdict"] for c in summary.cells(unpaired)] == ["level", "ahead, apart"]
    rerun = {**payload, "results": [a, b, {**full, "scores": [0.0] + [1.0] * (n - 1)}]}
    filled, differ = summary.fill_scores(unpaired, [rerun])
    assert filled == 2 and differ == ["niah_single_number/2048/context/multihead/full/1.0: 40.0000 against 39.0000"]
    assert [c["head_aware_verdict"] for c in summary.cells(unpaired)] == ["ahead", "ahead, apart"]
    run.write_text(json.dumps({**payload, "results": [{**r, "scores": None} for r in payload["results"]]}))
    again = tmp_path / "rerun.json"
    again.write_text(json.dumps(rerun))
    assert summary.main([str(run), "--scores", str(again)]) == 0
    page = capsys.readouterr().out
    assert "2 rows took each question's score from a rerun" in page and "a rerun scored otherwise" in page
    assert "2 cells: ahead, apart 1, ahead 1, level 0" in page
    run.write_text('{"results": []}')
    assert summary.main([str(run)]) == 2 and "is not a bench kv JSON" in capsys.readouterr().err


def test_the_questions_keys_replaced_are_the_whole_text_reads_and_only_in_the_heads_named():
    import torch

    from multihead.models.seq2seq import CausalLM, CausalLMConfig
    from multihead.modules.decoder import DecoderConfig
    from multihead.modules.kv import make_policy

    study = _study("kv_question_inside")
    torch.manual_seed(0)
    dec = DecoderConfig(
        d_model=32, num_heads=4, num_layers=2, cross_attention=False, norm_first=True, dropout=0.0,
        attention={"num_kv_heads": 2},
    )  # fmt: skip
    model = CausalLM(CausalLMConfig(vocab_size=60, max_len=64, positional="rope", decoder=dec)).eval()
    ids = torch.randint(0, 60, (1, 30), generator=torch.Generator().manual_seed(1))
    context, asked = ids[:, :24], ids[:, 24:29]  # the question but its last token
    policy = make_policy("head-aware", 8, full_heads=[[0], [1]])
    assert study.heads_of(policy, "the whole heads", [2, 2]) == [[0], [1]]
    assert study.heads_of(policy, "the windowed heads", [2, 2]) == [[1], [0]]
    assert study.heads_of(make_policy("window", 8), "every head", [2, 2]) == [[0, 1], [0, 1]]
    with torch.no_grad():
        whole = model.new_cache(record=True)
        model(ids[:, :29], cache=whole)  # the question protocol's read: the question with the whole text
        read = model.new_cache(record=True)
        model(context, cache=read)
        cache = read.compress(policy, prompt_only=True)
        model(asked, cache=cache)  # the context protocol: the question over what the policy kept

    def question_kv(c, layer, head):  # the question's keys and values in one head: the last 5 it holds
        for grp in c.self_attn[layer].groups:
            if head in grp.kv_heads:
                i = grp.kv_heads.index(head)
                return grp.buffers.k[0, i, -5:].clone(), grp.buffers.v[0, i, -5:].clone()

    def of_read(layer, head):
        [grp] = whole.self_attn[layer].groups
        return grp.buffers.k[0, head, 24:29], grp.buffers.v[0, head, 24:29]

    before = {(lay, h): question_kv(cache, lay, h) for lay in range(2) for h in range(2)}
    # read over the compressed context, the second layer's question keys are not the whole text's
    assert not torch.allclose(before[(1, 0)][0], of_read(1, 0)[0])
    heads = study.heads_of(policy, "the windowed heads", [2, 2])
    assert study.replace_keys(cache, whole, 24, 5, heads) == 2
    for (lay, h), kept in before.items():
        now = question_kv(cache, lay, h)
        want = of_read(lay, h) if h in heads[lay] else kept
        assert torch.equal(now[0], want[0]) and torch.equal(now[1], want[1]), (lay, h)
    with pytest.raises(ValueError, match="not where expected"):
        study.replace_keys(cache, whole, 23, 5, heads)  # positions one off

    # a swap of one part, in some layers: the keys of the second layer's windowed head only, its values left
    only = study.Swap("the windowed heads", layers=range(1, 2), part="keys")
    but = study.Swap("the windowed heads", layers=range(1, 2), but=True)
    assert only.heads(policy, [2, 2]) == [[], [0]] and but.heads(policy, [2, 2]) == [[1], []]
    assert only.name == "the question's keys, not values, from the whole text in the windowed heads of layers 1 to 1"
    assert study.replaced("every head") == "context, the question's keys from the whole text in every head"
    with torch.no_grad():
        cache = read.compress(policy, prompt_only=True)
        model(asked, cache=cache)
    before = question_kv(cache, 1, 0)
    assert study.replace_keys(cache, whole, 24, 5, only.heads(policy, [2, 2]), only.part) == 1
    now = question_kv(cache, 1, 0)
    assert torch.equal(now[0], of_read(1, 0)[0]) and torch.equal(now[1], before[1])
    assert not torch.equal(now[1], of_read(1, 0)[1])
    table = study.swaps(30)
    assert [s.layers for s in table if s.layers and not s.but] == [range(0, 10), range(10, 20), range(20, 30)]
    assert len({s.name for s in table}) == len(table)  # every swap answers under its own name


def test_a_wrong_answer_that_is_neither_is_told_by_what_it_writes():
    kind = _study("kv_snapkv_digits").other_kind
    others = {"9841226", "4621531"}  # the look-alike keys' numbers in the text
    assert kind("", "3910975", others) == "no number"
    assert kind("14", "3910975", others) == "a number of one or two digits"
    assert kind("984", "3910975", others) == "a number in the text, changed"  # a look-alike's start, cut
    assert kind("4621999", "3910975", others) == "a number in the text, changed"
    assert kind("7109752", "3910975", others) == "the asked number's digits, out of place"  # 0975 inside
    assert kind("142", "3910975", others) == "a number not in the text"
