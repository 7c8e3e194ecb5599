"""`multihead bench kv` as a benchmark, on small HF folders: a policy scored once after the prompt keeps every token
that follows (and equals a prefill under it), each kvpress press applied through its own hook to one read leaves the
cache its own ``with press(model)`` leaves, both sides answer alike from the full cache, Wilson intervals follow the
formula, a stopped run resumes, and bad flags are refused before a model is read."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead.bench import kv as K  # noqa: E402
from multihead.loading import load  # noqa: E402
from multihead.modules.kv import make_policy  # noqa: E402

from .test_attached_load_report import _save  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("kv") / "llama", "llama", max_position_embeddings=1024)


def test_wilson_interval_is_the_formula():
    # Wilson (1927): (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z = 1.96
    assert K.wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert K.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert K.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert K.wilson(25, 50)[0] < 0.5 < K.wilson(25, 50)[1]


def test_a_questions_strings_are_one_trial_in_its_interval():
    # two questions of four strings each, one answered whole and one not: two trials, not eight
    row = {**K._blank("multihead", "snapkv", 0.5, "niah_multivalue", 400, "context"), "questions": 2, "samples": 2}
    row.update(score_sum=1.0, hits=4.0, expected=8, reads=2)
    K._finish(row, None)
    assert row["score"] == 0.5 and row["interval"] == pytest.approx(K.wilson(1, 2), abs=1e-4)
    assert row["interval"][0] < K.wilson(4, 8)[0]  # wider than counting the strings as trials
    one = {**row, "questions": 8, "score_sum": 4.0, "hits": 4.0, "expected": 8}  # a string per question: binomial
    K._finish(one, None)
    assert one["interval"] == pytest.approx(K.wilson(4, 8), abs=1e-4)


def test_two_methods_are_compared_question_by_question():
    def row(scores, questions=None):
        return {"scores": scores, "questions": len(scores or []) if questions is None else questions}

    # a higher on two questions, lower on none, a tie on two: the sign test over the two that differ
    assert K.paired(row([1, 1, 0.5, 0]), row([0, 0.25, 0.5, 0])) == (2, 0, pytest.approx(0.5))
    wins = K.paired(row([1.0] * 12 + [0.0] * 3), row([0.0] * 12 + [1.0] * 3))
    assert wins[:2] == (12, 3) and wins[2] == pytest.approx(0.03516, abs=1e-4)  # 2 * P(X <= 3), X ~ Bin(15, 1/2)
    assert K.paired(row([1, 0]), row([1, 0, 1])) is None  # other questions
    assert K.paired(row(None, 3), row([1, 0, 1])) is None  # a run that did not keep them
    resumed = {**K._blank("multihead", "window", 0.5, "vt", 400, "context"), "questions": 3}
    K._record(resumed, 1.0)  # three questions answered before anything was kept: nothing kept from here on
    assert resumed["scores"] is None


@torch.no_grad()
def test_a_prompt_only_policy_evicts_once_and_then_keeps_every_token(folder):
    model = load(f"hf:{folder}").detail.model
    g = torch.Generator().manual_seed(0)
    ids, question = torch.randint(3, 290, (1, 200), generator=g), torch.randint(3, 290, (1, 12), generator=g)
    recorded = model.new_cache(record=True)
    model.prefill(ids, cache=recorded)
    for name in ("snapkv", "tova", "knorm", "h2o", "window", "expected"):
        policy = make_policy(name, 50)
        once = recorded.compress(policy, prompt_only=True)
        assert [kv.length for kv in once.self_attn] == [50] * len(once.self_attn)
        got = model(question, cache=once)[:, -1]
        assert [kv.length for kv in once.self_attn] == [62] * len(once.self_attn), name  # the question kept whole
        live = model.new_cache(policy=name, budget=50, prompt_only=True)  # a prefill under the policy
        model.prefill(ids, cache=live)
        torch.testing.assert_close(model(question, cache=live)[:, -1], got)
        always = recorded.compress(policy)  # by default the budget holds while decoding where the policy evicts then
        model(question, cache=always)
        held = 50 if name in ("tova", "knorm", "h2o", "window") else 62  # SnapKV and expected attention choose once
        assert [kv.length for kv in always.self_attn] == [held] * len(always.self_attn), name


@torch.no_grad()
def test_each_press_applied_to_one_read_leaves_the_cache_its_own_prefill_leaves(folder):
    pytest.importorskip("kvpress", reason="make kvpress")
    from transformers import DynamicCache

    from multihead.bench.kvpress import make_press

    side = K.PressSide(folder)
    ids = [int(t) for t in torch.randint(3, 290, (180,), generator=torch.Generator().manual_seed(1))]
    read = side.read(ids)
    for name in K.PRESSES:
        for fraction in (0.25, 0.5):
            got = side.compressed(read, name, fraction)
            masked = [
                getattr(layer.self_attn, "masked_key_indices", None) for layer in side.models[got["impl"]].model.layers
            ]
            model = side.models[got["impl"]]
            ref = DynamicCache()
            with make_press(name, fraction)(model):
                model.model(input_ids=torch.tensor([ids]), past_key_values=ref)
            for a, b in zip(got["cache"].layers, ref.layers):
                torch.testing.assert_close(a.keys, b.keys, msg=name)
                torch.testing.assert_close(a.values, b.values, msg=name)
            for m, layer in zip(masked, model.model.layers):  # AdaKV and CriticalKV mask keys instead of dropping
                want = getattr(layer.self_attn, "masked_key_indices", None)
                assert (m is None) == (want is None), name
                if m is not None:
                    for x, y in zip(m, want):
                        assert torch.equal(x, y), name


def test_bench_kv_runs_both_sides_and_protocols_writes_as_it_goes_and_resumes(folder, tmp_path, monkeypatch):
    out = tmp_path / "kv.json"
    opts = dict(
        folder=folder,
        tasks=["niah_single_number", "vt"],
        lengths=[400],
        n=2,
        fractions=(0.5,),
        methods=["snapkv", "window", "SnapKVPress", "StreamingLLMPress"],
        out=out,
        progress=False,
    )
    real, calls = K._one_sample, []

    def stop_after_three(*a, **k):  # a run stopped by its user after three samples
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(a[1])
        return real(*a, **k)

    monkeypatch.setattr(K, "_one_sample", stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        K.run(**opts)
    written = json.loads(out.read_text())
    assert written["done"] == {"niah_single_number/400/context": 2, "niah_single_number/400/question": 1}
    written["machine"]["cpu"] = "Another CPU"  # the first samples were measured elsewhere: the resumed run says so
    out.write_text(json.dumps(written))
    monkeypatch.setattr(K, "_one_sample", real)
    resumed = []
    monkeypatch.setattr(K, "_one_sample", lambda *a, **k: (resumed.append(a[1]), real(*a, **k)))
    payload = K.run(**opts, resume=True)
    assert len(resumed) == 8 - 3  # 2 tasks x 2 protocols x 2 samples, three done before
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert [m["cpu"] for m in payload["earlier_machines"]] == ["Another CPU"]
    assert "some rows measured on Another CPU" in K.markdown(payload)
    rows = payload["results"]
    assert {r["samples"] for r in rows} == {2}
    sides = {r["side"] for r in rows}
    for r in rows:
        assert "error" not in r, r
        assert 0 <= r["interval"][0] <= r["score"] <= r["interval"][1] <= 1
        assert len(r["scores"]) == r["questions"] and sum(r["scores"]) == pytest.approx(r["score_sum"], abs=1e-3)
        if r["method"] == "full":
            assert r["kept_share"] == 1.0
        else:
            assert r["kept_share"] == pytest.approx(0.5, abs=0.02), r
    try:
        import kvpress  # noqa: F401
    except ImportError:
        assert sides == {"multihead"} and "make kvpress" in payload["kvpress"]
    else:
        assert sides == {"multihead", "kvpress"}
        for task in opts[
            "tasks"
        ]:  # the same ids, the same weights: both sides write the same answers from the full cache
            full = {r["side"]: r for r in rows if r["method"] == "full" and r["task"] == task}
            assert full["multihead"]["examples"] == full["kvpress"]["examples"]
            assert full["multihead"]["kv_bytes"] == full["kvpress"]["kv_bytes"]
    with pytest.raises(ValueError, match=r"other settings \(n:"):
        K.run(**{**opts, "n": 3}, resume=True)
    narrowed = K.run(**{**opts, "tasks": ["vt"]}, resume=True)  # fewer tasks named: what the file holds is kept
    assert narrowed["results"] == payload["results"] and narrowed["config"]["tasks"] == opts["tasks"]
    assert [p.name for p in K.plot(payload, tmp_path / "fig")] == [
        "fig-niah_single_number.png",
        "fig-niah_single_number.svg",
        "fig-vt.png",
        "fig-vt.svg",
    ]
    assert "niah_single_number" in K.format_table(payload)
    page = K.markdown(payload)
    assert "## vt, 400 tokens, question protocol" in page and "multihead: full cache (ceiling)" in page
    assert "| kvpress: SnapKVPress |" in page or "make kvpress" in payload["kvpress"]


def test_bench_kv_refuses_bad_flags_before_reading_a_model(folder, tmp_path, monkeypatch, capsys):
    from multihead.cli import main

    def no_model(*a, **k):
        raise AssertionError("a model was read")

    monkeypatch.setattr(K, "OursSide", no_model)
    monkeypatch.setattr(K, "smollm2_folder", no_model)
    out = tmp_path / "out" / "kv.json"
    cases = [
        (["--tasks", "qa"], "knows no task qa"),
        (["--n", "0"], "--n is the number of samples"),
        (["--n", "1001"], "--n is the number of samples"),
        (["--lengths", "2048"], "past the 1024 positions"),
        (["--fractions", "1.5"], "fractions in (0, 1]"),
        (["--fractions", "0"], "fractions in (0, 1]"),
        (["--impls", "FooPress"], "knows no method FooPress"),
        (["--protocols", "both"], "knows no protocol both"),
        (["--evict", "never"], "--evict is one of"),
        (["--budget", "floor"], "--budget is one of kvpress, round"),
        (["--keys", "3"], "niah_multikey"),
    ]
    for flags, message in cases:
        length = [] if "--lengths" in flags else ["--lengths", "512"]
        try:
            code = main(["bench", "kv", "--model", str(folder), *length, *flags, "--out", str(out)])
        except SystemExit as stop:  # refused by the flag's parser
            code = stop.code
        assert code == 2, flags
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (flags, err)
        assert not out.parent.exists()
    garbled = tmp_path / "garbled.json"
    for text in ("not json", '{"config": {}}'):  # --resume on a file that is no bench kv JSON: refused, left as it was
        garbled.write_text(text)
        flags = ["--lengths", "512", "--resume", "--out", str(garbled)]
        assert main(["bench", "kv", "--model", str(folder), *flags]) == 2
        err = capsys.readouterr().err
        assert "is not a bench kv JSON" in err and "Traceback" not in err and garbled.read_text() == text
    assert main(["bench", "kv", "--lengths", "9000", "--out", str(out)]) == 2  # the default folder: SmolLM2's 8192
    assert "past the 8192 positions" in capsys.readouterr().err


def test_memory_is_measured_per_method_in_a_fresh_process(folder):
    rows = K.memory_rows(folder, [400], [("multihead", "full", 1.0), ("multihead", "snapkv", 0.5)], "prompt", False)
    full, snap = rows
    assert "error" not in full and "error" not in snap, rows
    assert snap["kv_bytes"] == pytest.approx(full["kv_bytes"] / 2, rel=0.02)  # tensor bytes: half the keys kept
    for r in rows:  # None where the kernel's peak mark cannot be reset
        assert r["peak_added_mib"] is None or r["peak_added_mib"] >= 0


def test_a_budget_kept_while_decoding_holds_its_cap(folder):
    rows = K.decode_rows(
        folder, context=200, tokens=24, fractions=(0.25,), methods=["window", "tova", "TOVAPress"], progress=False
    )
    got = {(r["side"], r["method"]): r for r in rows}
    full, window, tova = got[("multihead", "full")], got[("multihead", "window")], got[("multihead", "tova")]
    assert all("error" not in r for r in rows), rows
    assert full["kv_bytes_max"] == full["kv_bytes_end"] > 0 and full["tokens"] == 24
    for r in (window, tova):  # 50 keys per head at every step, whatever was read
        assert r["kv_bytes_max"] == r["kv_bytes_end"] == pytest.approx(full["kv_bytes_end"] * 50 / 223, rel=0.01)
    if ("kvpress", "full") in got:  # the same text through HF's own model: the same perplexity
        assert got[("kvpress", "full")]["perplexity"] == pytest.approx(full["perplexity"], rel=1e-4)
        press = got[("kvpress", "TOVAPress")]
        assert "error" not in press and press["kv_bytes_max"] <= full["kv_bytes_end"] * (50 + 16) / 223 + 1


def test_runs_split_by_task_join_into_the_run_of_both_and_refuse_other_settings(folder, tmp_path, capsys):
    from multihead.cli import main

    opts = dict(folder=folder, lengths=[400], n=1, fractions=(0.5,), methods=["snapkv"], protocols=["context"])
    both = K.run(tasks=["niah_single_number", "vt"], progress=False, **opts)
    parts = [tmp_path / "a.json", tmp_path / "b.json"]
    for task, path in zip(["vt", "niah_single_number"], parts):  # split, in the other order
        K.run(tasks=[task], out=path, progress=False, **opts)
    out = tmp_path / "joined.json"
    assert main(["bench", "kv", "--join", ",".join(map(str, parts)), "--out", str(out)]) == 0
    capsys.readouterr()
    joined = json.loads(out.read_text())

    def same(payload):  # what a run measures, less its timings
        keys = ("task", "length", "protocol", "side", "method", "fraction", "score", "examples", "kv_bytes", "samples")
        return sorted(tuple(json.dumps(r[k]) for k in keys) for r in payload["results"])

    assert same(joined) == same(both)
    assert joined["config"] == json.loads(json.dumps(both["config"]))  # the tasks in the suite's order
    assert joined["done"] == both["done"] and len(joined["joined"]) == 2
    resumed = K.run(tasks=["vt"], out=out, resume=True, progress=False, **opts)  # nothing left: the join still said
    assert resumed["joined"] == joined["joined"] and resumed["done"] == joined["done"]
    # a run written when the interval counted strings and the scoring said so joins, its intervals worked out again
    older = json.loads(parts[0].read_text())
    older["config"]["scoring"] += "; Wilson 95% over them"
    for r in older["results"]:
        r["interval"] = [round(x, 4) for x in K.wilson(r["hits"], r["expected"])]
    parts[0].write_text(json.dumps(older))
    again = tmp_path / "again.json"
    assert main(["bench", "kv", "--join", ",".join(map(str, parts)), "--out", str(again)]) == 0
    capsys.readouterr()
    rejoined = json.loads(again.read_text())
    assert rejoined["config"] == joined["config"]
    for r in rejoined["results"]:
        assert r["interval"] == pytest.approx(K.wilson(r["score_sum"], r["questions"]), abs=1e-4)
    assert out.with_suffix(".md").is_file() and (tmp_path / "joined-vt.png").is_file()
    # the page names the one command that runs the joined grid, and that command asks for this grid
    import shlex

    from multihead.cli import build_parser

    threads = joined["machine"]["threads"]
    line = K.command(joined["config"], threads)
    assert line in out.with_suffix(".md").read_text()
    args = build_parser().parse_args(shlex.split(line)[1:])
    c = joined["config"]
    assert (args.tasks, args.lengths, args.n, list(args.fractions), args.protocols, args.impls, args.threads) == (
        c["tasks"],
        c["lengths"],
        c["n"],
        c["fractions"],
        c["protocols"],
        c["methods"],
        threads,
    )
    assert args.model == str(folder)
    assert args.budget is None  # kvpress's count: the default, not said
    older = {k: v for k, v in c.items() if k != "budget"}  # a run made before the rule was said: round's
    assert build_parser().parse_args(shlex.split(K.command(older))[1:]).budget == "round"
    other = tmp_path / "other.json"
    K.run(tasks=["vt"], out=other, progress=False, **{**opts, "n": 2})
    bad = tmp_path / "bad.json"
    assert main(["bench", "kv", "--join", f"{parts[0]},{other}", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "other settings (n)" in err and "Traceback" not in err and not bad.exists()
    assert main(["bench", "kv", "--join", f"{parts[0]},{tmp_path / 'nowhere.json'}", "--out", str(bad)]) == 2
    assert "cannot be read" in capsys.readouterr().err and not bad.exists()
    garbled = tmp_path / "garbled.json"
    for text in ('{"suite": "kv", "results": []}', '{"suite": "kv", "config": {}, "results": [{}]}', "[]"):
        garbled.write_text(text)
        assert main(["bench", "kv", "--join", f"{parts[0]},{garbled}", "--out", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "file 2 is not a bench kv JSON" in err and "Traceback" not in err and not bad.exists()


def test_each_methods_settings_are_kept_and_a_resume_under_other_settings_is_refused(folder, tmp_path, capsys):
    from multihead.cli import main

    out = tmp_path / "kv.json"
    opts = dict(folder=folder, tasks=["niah_single_number"], lengths=[400], n=1, fractions=(0.5,), progress=False)
    opts.update(methods=["snapkv", "head-aware", "SnapKVPress", "AdaKVPress(SnapKVPress)"], protocols=["context"])
    payload = K.run(out=out, **opts)
    ours = payload["method_settings"]["multihead"]
    assert ours["snapkv"] == {"class": "SnapKV", "window": 32, "kernel": 7}  # of_budget's defaults, as run
    assert ours["full"] == {"class": "Full"} and "data-free split" in ours["head-aware"]["whole heads"]
    assert "method_settings_from" not in payload  # kept from the first sample
    assert payload["config"]["budget"] == "kvpress" and "as kvpress keeps" in K.markdown(payload)
    page = K.markdown(payload)
    assert "| multihead | snapkv | SnapKV, window = 32, kernel = 7 |" in page
    if "kvpress" in payload["method_settings"]:
        press = payload["method_settings"]["kvpress"]
        assert press["SnapKVPress"] == {"class": "SnapKVPress", "window_size": 64, "kernel_size": 5}
        assert press["AdaKVPress(SnapKVPress)"]["press"] == press["SnapKVPress"]  # the wrapped press, as one dict
        assert "| kvpress | SnapKVPress | SnapKVPress, window_size = 64, kernel_size = 5 |" in page
        rows = {(r["method"], r["fraction"]): r for r in payload["results"]}  # the same keys per head: the same bytes
        assert rows[("snapkv", 0.5)]["kv_bytes"] == rows[("SnapKVPress", 0.5)]["kv_bytes"]
    # a file written before the settings were kept: resumed, it gets them, and says which samples came before
    older = json.loads(out.read_text())
    del older["method_settings"], older["config"]["budget"]  # and before a run said its budget rule: round's
    out.write_text(json.dumps(older))
    resumed = K.run(out=out, resume=True, **opts)
    assert resumed["config"]["budget"] == "round" and "round(fraction x length)" in K.markdown(resumed)
    with pytest.raises(ValueError, match=r"other settings \(budget"):  # asked for kvpress's: not this file's rule
        K.run(out=out, resume=True, budget="kvpress", **opts)
    assert resumed["method_settings"] == json.loads(json.dumps(payload["method_settings"]))
    assert resumed["method_settings_from"] == {"niah_single_number/400/context": 1}
    assert "run before the file kept them" in K.markdown(resumed)
    # the same name under other settings: refused before a sample is run, the file left as it was
    other = json.loads(out.read_text())
    other["method_settings"]["multihead"]["snapkv"]["window"] = 64
    out.write_text(json.dumps(other))
    with pytest.raises(ValueError, match=r"other settings for multihead's snapkv \(.*'window': 64.*now .*'window': 32"):
        K.run(out=out, resume=True, **{**opts, "tasks": ["niah_single_number", "vt"]})
    assert json.loads(out.read_text()) == other
    # two runs of one method under other settings do not join
    part = tmp_path / "vt.json"
    K.run(out=part, **{**opts, "tasks": ["vt"]})
    bad = tmp_path / "bad.json"
    assert main(["bench", "kv", "--join", f"{out},{part}", "--out", str(bad)]) == 2  # round's budget and kvpress's
    assert "was run with other settings (budget)" in capsys.readouterr().err and not bad.exists()
    other_part = json.loads(part.read_text())
    other_part["config"]["budget"] = "round"
    part.write_text(json.dumps(other_part))
    assert main(["bench", "kv", "--join", f"{out},{part}", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "ran multihead's snapkv with other settings" in err and "Traceback" not in err and not bad.exists()
