"""Masked-LM pretraining: the masking statistics, the loss, packing, the run folder, resume after SIGKILL, --init."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from multihead.cli import main
from multihead.data.masking import IGNORE, mask_tokens, word_starts

TINY = [
    "--d-model",
    "32",
    "--heads",
    "2",
    "--layers",
    "1",
    "--d-ff",
    "64",
    "--seq-len",
    "32",
    "--vocab-size",
    "300",
    "--batch-size",
    "8",
    "--threads",
    "1",
    "--no-progress",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from multihead.data import load_texts

    path = tmp_path_factory.mktemp("text") / "reviews.txt"
    path.write_text("\n".join(load_texts("rotten_tomatoes")[:400]) + "\n")
    return path


def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "multihead.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


# ------------------------------------------------------------------------------------------------ masking
def test_masking_statistics_are_bert_s_15_percent_80_10_10():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 5000, (200, 512), generator=g)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, 0] = maskable[:, -1] = False  # [CLS] / [SEP]
    inputs, labels = mask_tokens(ids, maskable=maskable, mask_id=4, vocab_size=5000, generator=g)
    selected = labels != IGNORE
    n = int(maskable.sum())
    # binomial standard deviations: sqrt(.15 * .85 / 102000) = 0.0011; sqrt(.8 * .2 / 15300) = 0.0032
    assert abs(selected.sum().item() / n - 0.15) < 0.006
    assert not selected[:, 0].any() and not selected[:, -1].any()
    assert torch.equal(labels[selected], ids[selected])  # labels: the original tokens, only where selected
    assert torch.equal(inputs[~selected], ids[~selected])  # nothing else changes
    k = int(selected.sum())
    masked = (inputs == 4) & selected
    kept = (inputs == ids) & selected
    random_ = selected & ~masked & ~kept
    assert abs(masked.sum().item() / k - 0.8) < 0.015
    assert abs(kept.sum().item() / k - 0.1) < 0.012  # (+ 1/5000 of the random draws that hit the same id)
    assert abs(random_.sum().item() / k - 0.1) < 0.012


def test_masks_depend_only_on_the_generator_seed():
    ids = torch.randint(10, 100, (4, 64))
    m = torch.ones_like(ids, dtype=torch.bool)
    a = mask_tokens(ids, maskable=m, mask_id=4, vocab_size=100, generator=torch.Generator().manual_seed(7))
    b = mask_tokens(ids, maskable=m, mask_id=4, vocab_size=100, generator=torch.Generator().manual_seed(7))
    c = mask_tokens(ids, maskable=m, mask_id=4, vocab_size=100, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[1], c[1])


def test_whole_word_masking_selects_every_piece_of_a_word_or_none(corpus):
    from multihead.data import train_tokenizer

    tok = train_tokenizer(corpus.read_text().splitlines(), 300, extra_specials=("[MASK]",))
    starts = word_starts(tok)
    enc = tok.encode(" ".join(corpus.read_text().splitlines()[:40]), add_special_tokens=False)
    ids = torch.tensor(enc.ids[:1600]).view(4, -1)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    _, labels = mask_tokens(
        ids,
        maskable=maskable,
        mask_id=tok.token_to_id("[MASK]"),
        vocab_size=300,
        generator=torch.Generator().manual_seed(0),
        word_start=starts,
    )
    selected = labels != IGNORE
    words_seen = 0
    for r in range(ids.shape[0]):
        word = starts[ids[r]].long().cumsum(0)
        for w in word.unique().tolist():
            sel = selected[r][word == w]
            assert sel.all() or not sel.any(), "a word was split by the mask"
            words_seen += int(sel.all())
    assert 0.08 < selected.float().mean().item() < 0.25 and words_seen > 20
    assert starts[ids].float().mean() < 0.95  # the test data does hold multi-piece words


def test_masking_rejects_bad_arguments():
    ids = torch.zeros(2, 4, dtype=torch.long)
    m = torch.ones_like(ids, dtype=torch.bool)
    g = torch.Generator()
    with pytest.raises(ValueError, match="prob"):
        mask_tokens(ids, maskable=m, mask_id=1, vocab_size=5, generator=g, prob=0.0)
    with pytest.raises(ValueError, match="sum <= 1"):
        mask_tokens(ids, maskable=m, mask_id=1, vocab_size=5, generator=g, replace=(0.8, 0.3))
    with pytest.raises(ValueError, match="same shape"):
        mask_tokens(ids, maskable=m[:, :2], mask_id=1, vocab_size=5, generator=g)


# ------------------------------------------------------------------------------------------------ model, loss
def _tiny_mlm(vocab=50):
    from multihead.models.masked_lm import MaskedLM
    from multihead.models.text_encoder import TextEncoderConfig
    from multihead.modules.encoder import EncoderConfig

    torch.manual_seed(0)
    cfg = TextEncoderConfig(
        vocab_size=vocab,
        max_len=16,
        positional="learned",
        embed_norm=True,
        embed_init_std=0.02,
        encoder=EncoderConfig(d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0, activation="gelu"),
    )
    return MaskedLM(cfg).eval()


def test_mlm_loss_counts_the_selected_positions_only():
    from multihead.train.pretrain import mlm_loss

    model = _tiny_mlm()
    ids = torch.randint(5, 50, (3, 16))
    labels = torch.full_like(ids, IGNORE)
    labels[0, 3], labels[1, 7], labels[2, 0], labels[2, 15] = 11, 12, 13, 14
    loss, count, correct = mlm_loss(model, ids, labels)
    full = model(ids)  # (B, L, V): the head on every position
    sel = labels != IGNORE
    expected = sum(-F.log_softmax(full[b, l], -1)[labels[b, l]] for b, l in sel.nonzero().tolist())
    assert count == 4 and torch.allclose(loss, expected, atol=1e-5)
    assert correct == int((full[sel].argmax(-1) == labels[sel]).sum())
    assert torch.allclose(
        loss, F.cross_entropy(full.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum"), atol=1e-5
    )
    # what the model is told at unselected positions' labels cannot matter: they are ignored
    labels2 = labels.clone()
    labels2[~sel] = IGNORE
    assert torch.equal(mlm_loss(model, ids, labels2)[0], loss)


def test_mlm_head_is_tied_to_the_embeddings_and_gets_gradients():
    model = _tiny_mlm()
    assert model.head.embed.weight is model.encoder.embed.weight
    ids = torch.randint(5, 50, (2, 16))
    model(ids, select=ids > 20).sum().backward()
    assert model.encoder.embed.weight.grad is not None and model.head.bias.grad is not None


def test_packing_cuts_joined_texts_into_cls_sep_rows():
    from multihead.data.packing import pack

    rows = pack([[10, 11, 12], [13], [14, 15, 16, 17, 18]], seq_len=6, sep_id=3, cls_id=2)
    # stream: 10 11 12 3 13 3 14 15 16 17 18 3 -> rows of 4 body tokens
    assert rows.tolist() == [[2, 10, 11, 12, 3, 3], [2, 13, 3, 14, 15, 3], [2, 16, 17, 18, 3, 3]]


def test_batch_rows_visit_every_row_once_per_pass():
    from multihead.data.packing import batch_rows

    seen = [r for s in range(5) for r in batch_rows(s, 23, 4, seed=1)]
    assert len(seen) == 20 and len(set(seen)) == 20  # 5 batches of 4 from a shuffled pass (3 rows left over)
    assert batch_rows(5, 23, 4, seed=1) != batch_rows(0, 23, 4, seed=1)  # the next pass is reshuffled
    assert batch_rows(2, 23, 4, seed=1) == batch_rows(2, 23, 4, seed=1)


# ------------------------------------------------------------------------------------------------ the CLI
@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs") / "mlm"
    assert (
        main(
            [
                "pretrain",
                "--data",
                str(corpus),
                "--out",
                str(out),
                "--steps",
                "80",
                "--eval-every",
                "40",
                "--lr",
                "3e-3",
                *TINY,
            ]
        )
        == 0
    )
    return out


def test_run_folder_and_learning(pretrained_run):
    out = pretrained_run
    for name in (
        "config.json",
        "tokenizer.json",
        "splits.json",
        "metrics.jsonl",
        "model.safetensors",
        "curves.png",
        "results.json",
        "encoder/config.json",
        "encoder/model.safetensors",
        "encoder/tokenizer.json",
    ):
        assert (out / name).is_file(), name
    r = json.loads((out / "results.json").read_text())
    assert r["steps"] == 80 and r["tokens"] == 80 * 8 * 32
    assert r["validation"]["perplexity"] == pytest.approx(math.exp(r["validation"]["loss"]), rel=1e-9)
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [40, 80]
    # it learns: below the uniform guess over the vocabulary, and still falling
    assert evals[1]["val_loss"] < evals[0]["val_loss"] < math.log(300) - 0.2
    tok = json.loads((out / "tokenizer.json").read_text())
    assert any(t["content"] == "[MASK]" for t in tok["added_tokens"])


def test_exported_encoder_equals_the_pretrained_one(pretrained_run):
    """The default (pre-LN, rotary) encoder is exported in multihead's own layout and loads back exactly."""
    from safetensors.torch import load_file

    from multihead import pretrained
    from multihead.models.masked_lm import MaskedLM
    from multihead.models.text_encoder import TextEncoderConfig
    from multihead.train.checkpoint import load_model_tensors

    cfg = json.loads((pretrained_run / "config.json").read_text())["pretrain"]
    model = MaskedLM(TextEncoderConfig.from_dict(cfg["model"])).eval()
    load_model_tensors(model, load_file(str(pretrained_run / "model.safetensors")))
    assert json.loads((pretrained_run / "encoder" / "config.json").read_text())["model_type"] == pretrained.NATIVE
    loaded = pretrained.load(pretrained_run)  # a pretraining run resolves to its encoder/ folder
    ids = torch.randint(5, 300, (2, 20))
    assert torch.allclose(loaded.model(ids), model.encoder(ids), atol=1e-6)


def test_init_from_a_pretraining_run_fine_tunes(pretrained_run, tmp_path):
    out = tmp_path / "ft"
    csv = tmp_path / "s.csv"
    csv.write_text("text,label\n" + "".join(f"good fun film {i},pos\nbad dull film {i},neg\n" for i in range(100)))
    assert (
        main(
            [
                "train",
                "--init",
                str(pretrained_run),
                "--data",
                str(csv),
                "--out",
                str(out),
                "--epochs",
                "4",
                "--lr",
                "2e-3",
                "--threads",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    cfg = json.loads((out / "config.json").read_text())["train"]
    assert cfg["data"]["max_len"] == 32  # cut to the encoder's positions, not refused
    assert json.loads((out / "results.json").read_text())["test"]["accuracy"] >= 0.9


def test_the_bert_layout_exports_an_hf_folder_and_fine_tunes(tmp_path, corpus):
    """The default encoder (pre-LN, rotary) goes to encoder/ in multihead's own layout (see the run above); BERT's
    layout, asked for with --set, is written as an HF BertModel folder that HF itself loads, and `train --init`
    reads either."""
    from multihead import pretrained

    transformers = pytest.importorskip("transformers")
    out = tmp_path / "mlm"
    assert (
        main(
            [
                "pretrain",
                "--data",
                str(corpus),
                "--out",
                str(out),
                "--steps",
                "10",
                "--eval-every",
                "10",
                "--set",
                "model.encoder.norm_first=false",
                "--set",
                "model.positional=learned",
                *TINY,
            ]
        )
        == 0
    )
    assert json.loads((out / "encoder" / "config.json").read_text())["model_type"] == "bert"
    ours = pretrained.load(out).model
    hf = transformers.BertModel.from_pretrained(str(out / "encoder")).eval()
    ids = torch.randint(5, 300, (2, 20))
    with torch.no_grad():
        assert torch.allclose(hf(ids).last_hidden_state, ours(ids), atol=1e-5)
    csv = tmp_path / "s.csv"
    csv.write_text("text,label\n" + "".join(f"good fun film {i},pos\nbad dull film {i},neg\n" for i in range(50)))
    assert (
        main(
            [
                "train",
                "--init",
                str(out),
                "--data",
                str(csv),
                "--out",
                str(tmp_path / "ft"),
                "--epochs",
                "1",
                "--threads",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    model_cfg = json.loads((tmp_path / "ft" / "config.json").read_text())["train"]["model"]
    assert model_cfg["encoder"]["norm_first"] is False and model_cfg["positional"] == "learned"


def test_resume_after_sigkill_is_bit_identical(tmp_path, corpus):
    common = ["--data", corpus, "--steps", "60", "--save-every", "5", "--eval-every", "30", *TINY]
    full = tmp_path / "full"
    proc = cli("pretrain", "--out", full, *common)
    assert proc.returncode == 0, proc.stderr
    killed = tmp_path / "killed"
    p = subprocess.Popen(
        [sys.executable, "-m", "multihead.cli", "pretrain", "--out", str(killed), *map(str, common)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = killed / "checkpoint" / "state.json"
    deadline = time.time() + 120
    while time.time() < deadline:  # wait for a checkpoint past the start
        try:
            if state.exists() and json.loads(state.read_text()).get("step", 0) >= 10:
                break
        except ValueError:
            pass
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (killed / "results.json").exists(), "the run finished before it could be killed"
    proc = cli("pretrain", "--out", killed, "--resume", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "resuming" in proc.stdout
    from safetensors.torch import load_file

    wa, wb = load_file(str(full / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    evals = lambda run: [
        json.loads(x)["val_loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x
    ]
    assert evals(full) == evals(killed) and len(evals(full)) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--objective", "clm2"], "objective.name must be one of"),
        (["--steps", "0"], "optim.steps must be >= 1"),
        (["--mask-prob", "1.5"], "objective.mask_prob must be in"),
        (["--data", "no/such/file.txt"], "does not exist"),
        (["--data", "nonsense_name"], "unknown dataset"),
        (["--set", "optim.stepz=3"], "unknown optim fields"),
    ],
)
def test_bad_input_is_named(tmp_path, capsys, corpus, args, message):
    argv = ["pretrain", "--out", str(tmp_path / "x"), "--data", str(corpus), *TINY, *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_a_single_text_is_refused(tmp_path, capsys):
    one = tmp_path / "one.txt"
    one.write_text("just one line\n")
    assert main(["pretrain", "--out", str(tmp_path / "x"), "--data", str(one), *TINY]) == 2
    assert "at least two" in capsys.readouterr().err


def test_resume_refuses_new_options_and_non_runs(tmp_path, capsys, pretrained_run):
    assert main(["pretrain", "--out", str(tmp_path), "--resume", "--no-progress"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    before = {p: p.read_bytes() for p in pretrained_run.rglob("*") if p.is_file()}
    # the one resume policy of every task: options that differ from the recorded run are refused by name
    assert main(["pretrain", "--out", str(pretrained_run), "--resume", "--steps", "5", "--lr", "3e-3"]) == 2
    err = capsys.readouterr().err
    assert "optim.steps=5 (recorded: 80)" in err and "optim.lr" not in err and "Drop them to resume" in err
    assert {p: p.read_bytes() for p in pretrained_run.rglob("*") if p.is_file()} == before


# ------------------------------------------------------------------------------------------------ causal LM
def test_clm_loss_is_next_token_cross_entropy():
    from multihead.models import CausalLM, CausalLMConfig
    from multihead.modules.decoder import DecoderConfig
    from multihead.train.pretrain import clm_loss

    torch.manual_seed(0)
    model = CausalLM(
        CausalLMConfig(
            vocab_size=40,
            max_len=16,
            decoder=DecoderConfig(
                d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0, norm_first=True, cross_attention=False
            ),
        )
    ).eval()
    rows = torch.randint(0, 40, (3, 12))
    loss, count, correct = clm_loss(model, rows)
    expected = sum(
        -F.log_softmax(model(rows[b : b + 1, : t + 1])[0, -1], -1)[rows[b, t + 1]] for b in range(3) for t in range(11)
    )  # each prefix alone: the formula, position by position
    assert count == 33 and torch.allclose(loss, expected, atol=1e-4)


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs") / "clm"
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                str(corpus),
                "--out",
                str(out),
                "--steps",
                "60",
                "--eval-every",
                "30",
                "--lr",
                "3e-3",
                *TINY,
            ]
        )
        == 0
    )
    return out


def test_clm_run_learns_and_has_no_encoder_folder(clm_run):
    r = json.loads((clm_run / "results.json").read_text())
    assert r["objective"] == "clm" and r["encoder"] is None and not (clm_run / "encoder").exists()
    cfg = json.loads((clm_run / "config.json").read_text())["pretrain"]
    assert cfg["causal"]["decoder"]["d_model"] == 32 and cfg["causal"]["max_len"] == 32  # the size flags shaped it
    evals = [json.loads(x) for x in (clm_run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert evals[1]["val_loss"] < evals[0]["val_loss"] < math.log(300)


def test_generate_streams_what_it_would_print_at_once(clm_run):
    a = cli("generate", clm_run, "the film", "--max-new", "12")
    b = cli("generate", clm_run, "the film", "--max-new", "12", "--no-stream")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and a.stdout.startswith("the film") and len(a.stdout) > len("the film\n")
    s1 = cli("generate", clm_run, "the film", "--max-new", "12", "--sample", "--top-p", "0.9", "--seed", "3")
    s2 = cli("generate", clm_run, "the film", "--max-new", "12", "--sample", "--top-p", "0.9", "--seed", "3")
    assert s1.returncode == 0 and s1.stdout == s2.stdout  # seeded sampling is reproducible


def test_generate_refuses_what_it_cannot_do(clm_run, pretrained_run, capsys):
    assert main(["generate", str(clm_run), "the film", "--max-new", "500"]) == 2
    assert "exceeds the model's 32 positions" in capsys.readouterr().err
    assert main(["generate", str(pretrained_run), "the film"]) == 2
    assert "generation needs a causal LM" in capsys.readouterr().err
    assert main(["generate", str(clm_run.parent), "x"]) == 2
    assert "not a pretraining run" in capsys.readouterr().err


def test_two_process_ddp_pretraining_matches_one_process(tmp_path, corpus):
    """The global batch is masked identically on every rank and split between them, so 2 DDP processes train on
    what one process trains on; parameters agree to float32 round-off (see tests/train/test_distributed.py for why
    not bitwise, and for the key bias left out)."""
    import socket

    from safetensors.torch import load_file

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["--data", str(corpus), "--steps", "12", "--eval-every", "12", "--dropout", "0", *TINY]
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            "-m",
            "multihead.cli",
            "pretrain",
            "--out",
            str(ddp),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cli("pretrain", "--out", single, *args).returncode == 0
    r = json.loads((ddp / "results.json").read_text())
    assert r["distributed"]["world_size"] == 2 and r["distributed"]["max_param_diff_across_ranks"] == 0.0
    wa, wb = load_file(str(ddp / "model.safetensors")), load_file(str(single / "model.safetensors"))
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa if not k.endswith("attn.w_k.bias"))
    assert diff < 1e-5, f"DDP and single-process parameters differ by {diff}"


def test_heads_and_sinks_on_a_causal_run(clm_run, pretrained_run, tmp_path, capsys):
    assert main(["heads", str(clm_run), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["prefix_matching"]) == 1 and len(r["prefix_matching"][0]) == 2 and r["half"] == 15
    assert r["roles"][0][0] in ("induction", "-")
    assert main(["heads", str(pretrained_run)]) == 2
    assert "masked-LM run" in capsys.readouterr().err
    out = tmp_path / "sinks"
    assert main(["sinks", str(clm_run), "--texts", "2", "--out", str(out)]) == 0
    s = json.loads((out / "sinks.json").read_text())
    assert s["length"] == 128 and s["window"] == 16 and set(s["policies"]) == {"full", "window", "sinks"}
    assert (out / "sinks.png").is_file() and "perplexity by position band" in capsys.readouterr().out


def test_heads_from_statistics_on_inputs_longer_than_training(pretrained_run, tmp_path, capsys):
    """`heads ENCODER --max-len 512 --concat --from stats`: a rotary encoder trained on 32-token rows read at 512
    tokens, roles from exact statistics (no map); a learned-position model is refused a longer --max-len."""
    enc = str(pretrained_run / "encoder")
    assert (
        main(
            [
                "heads",
                enc,
                "--data",
                "rotten_tomatoes",
                "--max-len",
                "512",
                "--concat",
                "--n",
                "2",
                "--from",
                "stats",
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["computed_from"] == "stats" and r["tokens"] == 2 * 512 and r["data"]["max_len"] == 512
    assert sum(r["counts"].values()) == 2 and r["peak_rss_mib"] > 0 and r["seconds"] >= 0
    assert main(["heads", enc, "--data", "rotten_tomatoes", "--n", "6", "--from", "maps", "--json"]) == 0
    from_maps = json.loads(capsys.readouterr().out)
    assert main(["heads", enc, "--data", "rotten_tomatoes", "--n", "6", "--from", "stats", "--json"]) == 0
    from_stats = json.loads(capsys.readouterr().out)
    assert [h["role"] for h in from_maps["heads"]] == [h["role"] for h in from_stats["heads"]]
    assert main(["heads", "minilm", "--max-len", "4096", "--n", "1"]) == 2
    assert "learned positions for 512 tokens" in capsys.readouterr().err


def test_show_on_an_input_longer_than_1024_tokens_builds_no_map(pretrained_run, tmp_path, capsys):
    from safetensors.torch import load_file

    from multihead.data import load_texts

    enc = str(pretrained_run / "encoder")
    text = " ".join(load_texts("rotten_tomatoes")[:120])
    out = tmp_path / "long"
    assert main(["show", enc, text, "--max-len", "1500", "--out", str(out)]) == 0
    assert (out / "attention.html").is_file() and not (out / "grid.png").exists()
    links = load_file(str(out / "links.safetensors"))
    assert links["layer_0.index"].shape == (2, 1500, 8) and links["layer_0.thumbnail"].shape == (2, 64, 64)
    w = links["layer_0.weight"]
    assert (w[..., :-1] >= w[..., 1:]).all() and (w.sum(-1) <= 1 + 1e-4).all()
    assert '"mode": "links"' in (out / "attention.html").read_text()
    assert main(["show", enc, text, "--max-len", "1500", "--heads", "0:1", "--out", str(tmp_path / "h")]) == 2
    assert "open the page" in capsys.readouterr().err


def test_a_causal_lm_with_alibi_and_gated_attention_pretrains_and_generates(tmp_path, corpus, capsys):
    """The variants are config options of the same pretraining command: ALiBi (no position table) and the gate."""
    out = tmp_path / "clm"
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                str(corpus),
                "--out",
                str(out),
                "--steps",
                "20",
                "--eval-every",
                "20",
                "--set",
                "causal.positional=alibi",
                "--set",
                "causal.decoder.gate=true",
                *TINY,
            ]
        )
        == 0
    )
    config = json.loads((out / "config.json").read_text())["pretrain"]["causal"]
    attn = config["decoder"]["attention"]  # the flat --set key (causal.decoder.gate) read into the nested config
    assert config["positional"] == "alibi" and attn["alibi"] and attn["gate"]
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any("w_gate" in n for n in names) and not any(n.startswith("pos.") for n in names)
    capsys.readouterr()
    assert main(["generate", str(out), "the film", "--max-new", "5"]) == 0


def test_compare_trains_and_measures_each_variant(tmp_path, capsys):
    """`multihead compare`: one run folder per variant x seed with the measured numbers; a finished run is reused."""
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--data",
        "rotten_tomatoes",
        "--variants",
        "mha,mla,alibi",
        "--seeds",
        "1",
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--seq-len",
        "24",
        "--d-model",
        "32",
        "--heads",
        "4",
        "--layers",
        "1",
        "--d-ff",
        "128",
        "--vocab-size",
        "300",
        "--limit",
        "200",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    payload = json.loads((out / "compare.json").read_text())
    s = payload["summary"]
    assert set(s) == {"mha", "mla", "alibi"} and (out / "compare.png").is_file()
    # cache per token: MHA 2 x 4 heads x 8 x 4 bytes; MLA (latent 32 + rope key 16) x 4 bytes
    assert s["mha"]["kv_cache_bytes_per_token"][0] == 2 * 32 * 4 and s["mla"]["kv_cache_bytes_per_token"][0] == 48 * 4
    # every variant at 4x the trained length: ALiBi as trained, the rotary ones (MLA's rope key too) extrapolating
    assert all(v["long_perplexity"][0] > 1 and v["pieces_perplexity"][0] > 1 for v in s.values())
    assert all(0 < x < 1 for v in s.values() for x in v["first_token_share"])
    # parameters matched through the FFN width: within half a width step (one layer: 2 x d_model + 1) of MHA's
    assert payload["matched_parameters"] and s["mha"]["d_ff"] == 128 and s["mla"]["d_ff"] != 128
    assert all(abs(v["parameters"] - s["mha"]["parameters"]) <= (2 * 32 + 1) / 2 for v in s.values())
    capsys.readouterr()
    assert main(args) == 0 and "reusing" in capsys.readouterr().out
    # a finished run of another recipe is never reused silently: refused before anything trains
    assert main(args[:-2] + ["--no-match-params", "--out", str(out)]) == 2
    assert "mla-s0 in" in capsys.readouterr().err
    assert main(["compare", "--variants", "mha,nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown variants ['nope']" in capsys.readouterr().err


def test_compare_matches_parameter_counts_through_the_ffn_width():
    """Every variant's parameter count lands within half an FFN-width step of MHA's at the compare recipe's size,
    counted on the meta device; variants that add parameters get a narrower FFN, those that save some a wider one."""
    from multihead.train.compare import VARIANTS, matched_ffn, parameter_count, variant_config

    kw = dict(data="imdb", seed=0, steps=10, batch_size=32, seq_len=128, lr=2e-3, threads=1)
    ffn = matched_ffn(list(VARIANTS), **kw)
    base = parameter_count(variant_config("mha", **kw))
    step = 4 * (2 * 128 + 1)  # 4 layers, d_model 128: two weight rows/columns and one bias per unit of width
    for name, width in ffn.items():
        assert abs(parameter_count(variant_config(name, size={"d_ff": width}, **kw)) - base) <= step / 2, name
    assert ffn["mha"] == 512 and ffn["gated"] < 512 < ffn["gqa"] and ffn["mla"] > 512


def test_evaluate_repeats_the_runs_own_validation(pretrained_run, capsys):
    """``multihead evaluate`` on a pretraining run packs the held-out texts as training did ([CLS] ... [SEP] rows for
    a masked LM, the same fixed masks) and so reproduces results.json's validation numbers."""
    results = json.loads((pretrained_run / "results.json").read_text())["validation"]
    assert main(["evaluate", str(pretrained_run), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["objective"] == "mlm" and r["tokens"] == results["tokens"]
    assert abs(r["loss"] - results["loss"]) < 1e-6 and r["accuracy"] == results["accuracy"]
