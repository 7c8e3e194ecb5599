"""`multihead bench kv` on a small HF folder: every registered KV policy at the asked fraction holds that share of
the full cache's bytes, the JSON is written after every row, and kvpress's presses run beside it where kvpress is
installed (its AdaKV keeps the masked keys' tensors whole)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="pip install 'multihead[hf]'")

from multihead.bench import kvpress as K  # noqa: E402
from multihead.modules.kv import KV_POLICIES  # noqa: E402

from .test_attached_load_report import _save  # noqa: E402


def test_bench_kv_measures_every_policy_and_writes_as_it_goes(tmp_path):
    folder = _save(tmp_path / "llama", "llama", max_position_embeddings=256)
    out = tmp_path / "kv.json"
    payload = K.run(folder=folder, fractions=(0.25,), length=160, needles=1, context=64, tokens=8, out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    ours = {r["method"]: r for r in payload["results"] if r["side"] == "multihead"}
    assert set(ours) == set(KV_POLICIES) - {"streaming"}  # streaming rotates by slot: HF models stream elsewhere
    for name, r in ours.items():
        assert "error" not in r, r
        if name in ("window", "h2o", "snapkv", "tova", "knorm", "adakv", "expected"):  # a quarter of the keys
            assert r["kept_share"] == pytest.approx(0.25, abs=0.01), name
        assert r["rss_peak_added_mib"] is None or r["rss_peak_added_mib"] >= 0
    assert ours["full"]["kept_share"] == 1.0
    table = K.format_table(payload)
    assert "head-aware" in table and "needles" in table
    assert all(f.stat().st_size > 0 for f in K.plot(payload, tmp_path / "kv"))
    theirs = {r["method"]: r for r in payload["results"] if r["side"] == "kvpress"}
    try:
        import kvpress  # noqa: F401
    except ImportError:
        assert not theirs and "make kvpress" in payload["config"]["kvpress"]
        return
    assert set(theirs) == {"full", *K.PRESSES}
    assert all("error" not in r for r in theirs.values()), theirs
    assert theirs["AdaKVPress(SnapKVPress)"]["kept_share"] == 1.0  # masked, not freed
    assert theirs["StreamingLLMPress"]["kept_share"] == pytest.approx(0.25, abs=0.01)


def test_bench_kv_runs_the_methods_asked_on_multi_key_needles(tmp_path):
    folder = _save(tmp_path / "llama", "llama", max_position_embeddings=512)
    payload = K.run(
        folder=folder,
        fractions=(0.5,),
        length=400,
        needles=1,
        keys=3,
        context=32,
        tokens=4,
        methods=["adakv", "head-aware"],
        ranking=[[0.0, 1.0], [1.0, 0.0]],  # a kv-heads.json's scores: layer 0 head 1, layer 1 head 0 first
    )
    assert payload["config"]["keys"] == 3 and payload["config"]["head_split"] == "given (--kv-heads)"
    ours = {(r["method"], r["fraction"]): r for r in payload["results"] if r["side"] == "multihead"}
    assert set(ours) == {("full", 1.0), ("adakv", 0.5), ("head-aware", 0.5)}
    assert all("error" not in r for r in ours.values())
    with pytest.raises(ValueError, match="classify this model's heads"):
        K.run(folder=folder, length=400, needles=1, context=32, tokens=4, methods=["head-aware"], ranking=[[1.0]])
    with pytest.raises(ValueError, match="knows no method lru"):
        K.run(folder=folder, fractions=(0.5,), length=400, needles=1, context=32, tokens=4, methods=["lru"])


def test_bench_kv_refuses_bad_flags_before_reading_a_model(tmp_path, capsys):
    from multihead.cli import main

    out = tmp_path / "kv.json"
    bad = tmp_path / "kv-heads.json"
    bad.write_text('{"split": {"full_heads": [[0]]}}')
    cases = [
        (["--impls", "lru"], "knows no method lru"),
        (["--impls", "streaming"], "knows no method streaming"),
        (["--kv-heads", str(bad)], "holds no per-head scores"),
    ]
    for flags, message in cases:
        assert main(["bench", "kv", "--model", str(tmp_path / "nowhere"), *flags, "--out", str(out)]) == 2
        assert "config.json" in capsys.readouterr().err  # the folder is checked first
        folder = _save(tmp_path / "llama", "llama", max_position_embeddings=256)
        assert main(["bench", "kv", "--model", str(folder), "--lengths", "256", *flags, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert not out.exists() and bad.read_text() == '{"split": {"full_heads": [[0]]}}'
