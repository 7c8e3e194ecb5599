"""The RULER-style tasks: exact lengths, answers verbatim in the context, the answer each task states is the true one
(the chain resolves, the common words are the most common, the top coded words are unique), seeded, RULER's scoring,
and refusals."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from multihead import data as D
from multihead.data.ruler import MAX_SAMPLES, TASKS, make_task, score


def _encode(text: str) -> list[int]:  # bytes as tokens: decoding is exact, lengths are checkable
    return list(text.encode("utf-8"))


def _decode(ids) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def texts():
    return D.split(D.load("imdb"), seed=0).test.texts


EXACT = [t for t in TASKS if t not in ("cwe", "fwe")]


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_states_answers_found_verbatim_in_its_context(name, texts):
    samples = make_task(name).make(_encode, texts, length=3000, count=3, seed=1, start=[2])
    assert len(samples) == 3
    for s in samples:
        assert s.ids[0] == 2 and s.task == name
        prompt = s.prompt()
        if name in EXACT:
            assert len(prompt) == 3000
        else:  # the word lists fill with whole entries
            assert 0.85 * 3000 <= len(prompt) <= 3000
        context = _decode(s.ids[1:])
        for q in s.questions:
            assert q.answers and q.max_new_tokens >= 1
            for a in q.answers:
                assert a in context, (name, a)
                assert a not in _decode(q.ids) or name == "vt"  # vt's question names the value, not the variables
    again = make_task(name).make(_encode, texts, length=3000, count=3, seed=1, start=[2])
    assert [s.ids for s in again] == [s.ids for s in samples]  # seeded
    other = make_task(name).make(_encode, texts, length=3000, count=3, seed=2, start=[2])
    assert [s.ids for s in other] != [s.ids for s in samples]


def test_the_variable_chain_resolves_to_the_variables_asked_for(texts):
    for s in make_task("vt").make(_encode, texts, length=2000, count=4, seed=0):
        context = _decode(s.ids)
        holds: dict[str, str] = {}
        for var, rhs in re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", context):
            holds[var] = holds[rhs[4:]] if rhs.startswith("VAR ") else rhs  # assignments appear in chain order
        value = re.search(r"assigned the value (\d+)", _decode(s.questions[0].ids)).group(1)
        assert sorted(v for v, x in holds.items() if x == value) == sorted(s.questions[0].answers)


def test_common_words_are_the_most_common_and_frequent_words_have_no_tie(texts):
    for s in make_task("cwe").make(_encode, texts, length=4000, count=3, seed=0):
        words = re.findall(r"\d+\. (\w+)\n", _decode(s.ids))
        counts = Counter(words)
        top = {w for w, _ in counts.most_common(10)}
        assert top == set(s.questions[0].answers)
        assert min(counts[w] for w in top) > max(c for w, c in counts.items() if w not in top)  # no tie at the cut
    for s in make_task("fwe").make(_encode, texts, length=4000, count=3, seed=0):
        body = _decode(s.ids).split("coded words.\n", 1)[1]
        counts = Counter(body.split()).most_common()
        assert {w for w, _ in counts[:3]} == set(s.questions[0].answers)
        assert counts[2][1] > counts[3][1]


def test_multi_key_tasks_hide_look_alike_keys(texts):
    s = make_task("niah_multikey").make(_encode, texts, length=2000, count=1)[0]
    context = _decode(s.ids)
    assert len(re.findall(r"One of the special magic numbers for [\w-]+ is: \d{7}\.", context)) == 4
    mv = make_task("niah_multivalue").make(_encode, texts, length=2000, count=1)[0]
    assert len(mv.questions[0].answers) == 4
    key = re.search(r"for ([\w-]+) mentioned", _decode(mv.questions[0].ids)).group(1)
    assert len(re.findall(rf"for {re.escape(key)} is: (\d{{7}})", _decode(mv.ids))) == 4
    uid = make_task("niah_single_uuid").make(_encode, texts, length=2000, count=1)[0]
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", uid.questions[0].answers[0]
    )


def test_score_is_rulers_string_match_all():
    assert score("The numbers are 123 and 456.", ["123", "456"]) == 1.0
    assert score("just 123", ["123", "456", "789"]) == pytest.approx(1 / 3)
    assert score("ABCDE, fghij", ["abcde", "FGHIJ", "KLMNO", "PQRST"]) == 0.5  # case-insensitive
    assert score("", ["1"]) == 0.0


def test_bad_input_is_refused(texts):
    with pytest.raises(ValueError, match="unknown task 'qa'.*niah_single_number"):
        make_task("qa")
    for count in (0, MAX_SAMPLES + 1, True, 2.5):
        with pytest.raises(ValueError, match=r"number of samples"):
            make_task("vt").make(_encode, texts, length=2000, count=count)
    with pytest.raises(ValueError, match="leaves no room"):
        make_task("niah_multiquery").make(_encode, texts, length=300, count=1)
