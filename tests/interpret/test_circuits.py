"""The IOI experiment's parts on a small random model with a word-level tokenizer (every name one token), against
their definitions: the prompts, the logit differences, the classes of heads and the path effects that chose them;
and ``multihead circuit``'s messages. (The induction circuit is checked on the trained toy in test_induction.py.)"""

import sys
from pathlib import Path

import pytest
import torch

from multihead.cli import main
from multihead.interpret.causal import circuits as C
from multihead.interpret.causal import patching as P
from multihead.models.seq2seq import CausalLM, CausalLMConfig
from multihead.modules.decoder import DecoderConfig
from multihead.modules.variants import AttentionConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lm"))
from hf_families import hf_model, write_gguf  # noqa: E402


class WordLM:
    """A random CausalLM with a word-level tokenizer over the IOI templates and names."""

    def __init__(self):
        from tokenizers import Tokenizer, models, pre_tokenizers

        split = pre_tokenizers.Whitespace().pre_tokenize_str
        words = set(C.NAMES) | {w for t in C.TEMPLATES for w, _ in split(t.format(A="x", B="x", S="x"))}
        vocab = {w: i for i, w in enumerate(sorted(words | {"[UNK]"}))}
        self.tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        self.tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        torch.manual_seed(0)
        self.model = CausalLM(
            CausalLMConfig(
                vocab_size=len(vocab),
                max_len=32,
                positional="rope",
                decoder=DecoderConfig(
                    d_model=32,
                    num_heads=4,
                    num_layers=3,
                    cross_attention=False,
                    norm_first=True,
                    dropout=0.0,
                    norm="rms",
                    activation="swiglu",
                    attention=AttentionConfig(num_kv_heads=2),
                ),
            )
        ).eval()

    def encode(self, text, special=True):
        return self.tokenizer.encode(text).ids


@pytest.fixture(scope="module")
def word_lm():
    return WordLM()


def test_ioi_prompts_differ_only_in_the_repeated_subject(word_lm):
    prompts = C.ioi_prompts(word_lm, 8, seed=3)
    assert len(prompts) == 8 and len({p["template"] for p in prompts}) == 6
    for p in prompts:
        a, b = word_lm.encode(p["clean"]), word_lm.encode(p["corrupt"])
        assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
        io, s = word_lm.encode(p["answer"])[0], word_lm.encode(p["wrong"])[0]
        assert a.count(s) == 2 and a.count(io) == 1 and b.count(s) == 1 and a.index(io) < a.index(s)


def test_ioi_reports_what_its_definitions_say(word_lm):
    r = C.ioi(word_lm, pairs=4, movers=1, inhibitors=2, batch_size=8)
    model = word_lm.model
    diffs = []
    with torch.no_grad():
        for p in r["pairs"]:
            ids = torch.tensor([word_lm.encode(p["clean"])])
            diffs.append(
                float(P.logit_diff(word_lm.encode(p["answer"])[0], word_lm.encode(p["wrong"])[0])(model(ids))[0])
            )
    assert r["logit_diff"]["clean"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-5)
    direct = torch.tensor(r["direct"])
    top = sorted(direct.flatten().tolist(), reverse=True)[:1]
    assert [h["direct"] for h in r["name_movers"]] == pytest.approx(top)
    assert r["negative_name_movers"][0]["direct"] == pytest.approx(float(direct.min()))
    # path effects exist only for heads before the first name mover; the S-inhibition heads are the most negative
    first = min(h["layer"] for h in r["name_movers"])
    path = torch.tensor(r["path_into_name_movers_q"])
    assert path[first:].isnan().all() and not path[:first].isnan().any()
    assert r["s_inhibition"] and all(h["layer"] < first for h in r["s_inhibition"])
    assert r["s_inhibition"][0]["path_q"] == pytest.approx(float(path[:first].min()))
    for h in r["name_movers"] + r["s_inhibition"]:
        assert h["exact"] == pytest.approx(r["effect"][h["layer"]][h["head"]])
        assert 0.0 <= h["END->IO"] <= 1.0
    exact, approx = torch.tensor(r["effect"]).flatten(), torch.tensor(r["attribution"]).flatten()
    assert r["correlation"] == pytest.approx(float(torch.corrcoef(torch.stack([exact, approx]))[0, 1]), abs=1e-6)
    worst = r["disagreements"][0]  # the head where the first-order estimate is furthest from the exact effect
    assert abs(worst[2] - worst[3]) == pytest.approx(float((exact - approx).abs().max()), abs=1e-6)
    assert len(r["disagreements"]) == 5
    assert "name movers:" in C.format_ioi(r)


def test_circuit_command_names_what_a_model_lacks(tmp_path, capsys):
    gguf = str(write_gguf(hf_model("llama", rope_scaling=None), tmp_path / "tiny.gguf"))
    # a random model has no induction heads; its byte-level tokenizer splits the names
    assert (
        main(
            [
                "circuit",
                "induction",
                gguf,
                "--out",
                str(tmp_path / "a"),
                "--no-progress",
                "--half",
                "8",
                "--sequences",
                "1",
            ]
        )
        == 2
    )
    assert "no head of this model has a prefix-matching score" in capsys.readouterr().err
    assert main(["circuit", "ioi", gguf, "--out", str(tmp_path / "b"), "--no-progress"]) == 2
    assert "of the names are one token" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_circuit_never_replaces_a_folder_holding_the_users_files_or_the_current_directory(
    tmp_path, capsys, monkeypatch
):
    gguf = str(write_gguf(hf_model("llama", rope_scaling=None), tmp_path / "tiny.gguf"))
    earlier = tmp_path / "circuit"
    earlier.mkdir()
    (earlier / "circuit.json").write_text("{}")
    (earlier / "circuit.png").write_bytes(b"png")
    (earlier / "notes.txt").write_text("my notes")
    argv = ["circuit", "induction", gguf, "--no-progress", "--half", "8", "--sequences", "1"]
    for extra in ([], ["--overwrite"]):
        assert main([*argv, "--out", str(earlier), *extra]) == 2
        err = capsys.readouterr().err
        assert "notes.txt, which multihead did not write" in err and "internal error" not in err
    (earlier / "notes.txt").unlink()
    monkeypatch.chdir(earlier)  # --out . inside an earlier circuit folder: the current directory is never replaced
    for extra in ([], ["--overwrite"]):
        assert main([*argv, "--out", ".", *extra]) == 2
        assert "is the current directory" in capsys.readouterr().err
    assert sorted(p.name for p in earlier.iterdir()) == ["circuit.json", "circuit.png"]
    assert (earlier / "circuit.json").read_text() == "{}"
