"""Role rules on constructed heads with known patterns; the case-study search on planted and real heads."""

import torch

from multihead.interpret import AttentionMaps
from multihead.interpret.roles import case_study
from multihead.interpret.roles import scores as roles
from multihead.interpret.pages.plots import _ticks, rollout

TOKENS = ["[CLS]", "the", "cat", ",", "sat", "on", "the", "mat", ".", "[SEP]"]
N = len(TOKENS)


def _head(kind: str) -> torch.Tensor:
    w = torch.zeros(N, N)
    for i in range(N):
        if kind == "prev":
            w[i, max(i - 1, 0)] = 1
        elif kind == "next":
            w[i, min(i + 1, N - 1)] = 1
        elif kind == "self":
            w[i, i] = 1
        elif kind == "sep":
            w[i, N - 1], w[i, i] = 0.8, 0.2
        elif kind == "punct":
            w[i, 3], w[i, 8], w[i, 0] = 0.4, 0.3, 0.3
        elif kind == "uniform":
            w[i] = 1 / N
        elif kind == "mixed":
            w[i, (i * 7) % N] += 0.6
            w[i, (i * 3 + 1) % N] += 0.4
    return w


KINDS = ["prev", "next", "self", "sep", "punct", "uniform", "mixed"]
EXPECTED = ["previous token", "next token", "self", "delimiter sink", "punctuation", "broad", "mixed"]


def test_role_rules_on_constructed_heads():
    maps = AttentionMaps("x", TOKENS, [torch.stack([_head(k) for k in KINDS])], "constructed")
    result = roles.analyse([maps, maps])
    assert [h["role"] for h in result["heads"]] == EXPECTED
    prev = result["heads"][0]
    assert prev["argmax_prev"] == 1.0 and prev["distance"] == sum(1 for i in range(1, N)) / N
    assert abs(result["heads"][5]["entropy_norm"] - 1) < 1e-4  # uniform: the maximum entropy
    assert result["counts"]["previous token"] == 1 and result["texts"] == 2


def test_role_table_and_picture(tmp_path):
    maps = AttentionMaps("x", TOKENS, [torch.stack([_head(k) for k in KINDS])] * 2, "constructed")
    result = roles.analyse([maps])
    text = roles.format_table(result)
    assert "previous token" in text and len(text.splitlines()) == 2 + 14
    files = roles.write(result, tmp_path)
    assert all(f.exists() and f.stat().st_size > 0 for f in files)
    assert {f.suffix for f in files} == {".json", ".png", ".svg"}


def test_case_study_finds_a_planted_head_and_says_when_none_matches():
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    n = len(tokens)
    layer = torch.full((4, n, n), 1 / n)
    layer[2, 2] = 0.0
    layer[2, 2, 6] = 0.7  # cat -> mat planted in head 2
    layer[2, 2, 0] = 0.3  # more on [CLS], which does not count as a word link
    maps = AttentionMaps(case_study.SENTENCE, tokens, [layer], "planted")
    res = case_study.run(maps)
    long_range = res["long range: subject -> object of preposition"]
    assert long_range["heads"] == [{"layer": 0, "head": 2, "weight": 0.7}]
    assert long_range["pairs"] == ["cat(2) -> mat(6)"]
    det = res["determiner -> noun"]
    assert det["heads"] == [] and det["closest"] is not None and det["adjacent"]
    assert "no head has it as its strongest word link" in case_study.format_results(res)
    assert case_study.highlights(res) == {(0, 2): "long range"}


def test_case_study_skips_other_sentences_and_handles_subwords():
    maps = AttentionMaps("x", ["[CLS]", "the", "ca", "##t", "sat", "[SEP]"], [torch.eye(6)[None]], "m")
    assert "skipped" in case_study.run(maps)
    bpe = AttentionMaps(
        "x",
        ["[CLS]", "the", "c", "at", "sat", "[SEP]"],
        [torch.eye(6)[None]],
        "m",
        starts=[True, True, True, False, True, True],
    )
    assert case_study.word_positions(bpe, ["the", "cat", "sat"]) == [1, 2, 4]
    assert case_study.is_case_sentence("  the cat sat on the  MAT. ")


def test_case_study_on_minilm_searches_every_head():
    from multihead.interpret import load_subject

    maps = load_subject("minilm").maps(case_study.SENTENCE)
    res = case_study.run(maps)
    assert "skipped" not in res and any(r["heads"] for r in res.values())  # the loop below checks real heads
    for kind, r in res.items():
        for found in r["heads"]:  # every reported head really has the link as its strongest word link
            w = maps.head(found["layer"], found["head"])
            for pair in r["pairs"]:
                q = int(pair.split("(")[1].split(")")[0])
                k = int(pair.split("(")[2].split(")")[0])
                assert int(w[q, 1:-1].argmax()) + 1 == k, (kind, found)


def test_rollout_rows_are_distributions_and_labels_thin_out():
    maps = AttentionMaps("x", TOKENS, [torch.stack([_head("prev"), _head("uniform")])] * 3, "m")
    r = rollout(maps)
    assert torch.allclose(r.sum(-1), torch.ones(N), atol=1e-5)
    pos, names = _ticks([f"t{i}" for i in range(512)], 150)
    assert len(pos) <= 150 and pos[0] == 0 and len(names) == len(pos)


def test_roles_from_statistics_equal_roles_from_maps_on_minilm():
    """The issue's check: MiniLM on 200 Rotten Tomatoes test sentences, head statistics once from the full captured
    maps and once from exact statistics on the fused path (no map built): every role and statistic agrees."""
    from multihead import data as D
    from multihead.interpret import load_subject
    from multihead.interpret.roles.scores import subject_head_stats

    subject = load_subject("minilm")
    texts = D.split(D.load("rotten_tomatoes"), seed=0).test.texts[:200]
    from_maps = roles.analyse(subject.maps(texts))
    stats, tokens = subject_head_stats(subject, texts)
    from_stats = roles.summarise(stats, subject.name, len(texts), tokens, "stats")
    assert tokens == from_maps["tokens"] and from_stats["counts"] == from_maps["counts"]
    for a, b in zip(from_maps["heads"], from_stats["heads"]):
        assert a["role"] == b["role"], (a, b)
        for k in roles.STATS:
            assert abs(a[k] - b[k]) < 2e-4, (a["layer"], a["head"], k, a[k], b[k])  # both rounded to 4 digits
