"""`multihead show` and `multihead heads` end to end, on MiniLM and on a trained run."""

import json

from safetensors.torch import load_file

from multihead.cli import main


def test_show_minilm_case_study(tmp_path, capsys):
    out = tmp_path / "show"
    assert main(["show", "minilm", "The cat sat on the mat.", "--out", str(out), "--heads", "0:2"]) == 0
    printed = capsys.readouterr().out
    assert "determiner -> noun" in printed and "9 tokens: [CLS] the cat sat on the mat . [SEP]" in printed
    for name in ("grid", "layer_mean", "rollout", "head_L0_H2"):
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.svg").stat().st_size > 1000
    case = json.loads((out / "case_study.json").read_text())
    found = [(h["layer"], h["head"]) for r in case.values() for h in r["heads"][:1]]
    for layer, head in found:  # the best head of each link is drawn at full size
        assert (out / f"head_L{layer}_H{head}.png").exists()
    weights = load_file(str(out / "attention.safetensors"))
    assert [weights[f"layer_{i}"].shape for i in range(6)] == [(12, 9, 9)] * 6
    assert json.loads((out / "tokens.json").read_text())[2] == "cat"
    assert (out / "attention.html").stat().st_size > 1000
    test = json.loads((out / "role_test.json").read_text())  # the head the page opens on passed the separating test
    layer, head = test["passed"]
    assert test["noun"][layer][head] >= 0.5 > test["noun"][1][8] and "passes the determiner -> noun test" in printed
    assert (out / f"head_L{layer}_H{head}.png").exists()


def test_show_rejects_missing_heads(tmp_path, capsys):
    assert main(["show", "minilm", "hello there", "--out", str(tmp_path), "--heads", "9:0"]) == 2
    assert "layer 9 head 0 does not exist" in capsys.readouterr().err


def test_heads_table_json_and_picture(tmp_path, capsys):
    assert main(["heads", "minilm", "--n", "12", "--out", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["texts"] == 12 and len(result["heads"]) == 72 and sum(result["counts"].values()) == 72
    assert result["heads"][2]["role"] == "previous token"  # MiniLM layer 0 head 2 copies the previous token
    assert (tmp_path / "heads.png").exists() and (tmp_path / "heads.json").exists()


def test_show_on_a_trained_run(tmp_path, sentiment_csv):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(sentiment_csv),
                "--out",
                str(run),
                "--epochs",
                "1",
                "--d-model",
                "16",
                "--heads",
                "2",
                "--layers",
                "2",
                "--d-ff",
                "32",
                "--vocab-size",
                "100",
                "--max-len",
                "24",
                "--text-column",
                "sentence",
                "--label-column",
                "sentiment",
                "--no-progress",
                "--limit",
                "60",
                "--eval-limit",
                "60",
            ]
        )
        == 0
    )
    assert main(["show", str(run), "the film was good", "--out", str(tmp_path / "s"), "--no-rollout"]) == 0
    assert (tmp_path / "s" / "grid.png").exists() and not (tmp_path / "s" / "rollout.png").exists()
    assert load_file(str(tmp_path / "s" / "attention.safetensors"))["layer_1"].shape[0] == 2
