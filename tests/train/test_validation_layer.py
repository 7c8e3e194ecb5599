"""One validation layer for every config section and option: out-of-range settings are refused before anything is
built or written (exit 2, the field named), sizes are estimated with every table they imply, and a run's files are
checked before they are read into memory. Each case finished with a NaN model, crashed (exit 70) or exhausted memory
before."""

from __future__ import annotations

import json
import shutil

import pytest

from multihead.cli import main

TINY = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--layers",
    "1",
    "--d-ff",
    "32",
    "--seq-len",
    "32",
    "--vocab-size",
    "300",
    "--batch-size",
    "8",
    "--threads",
    "1",
    "--no-progress",
    "--steps",
    "3",
    "--eval-every",
    "3",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from multihead.data import load_texts

    path = tmp_path_factory.mktemp("text") / "c.txt"
    path.write_text("\n".join(load_texts("rotten_tomatoes")[:200]) + "\n")
    return path


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs") / "clm"
    assert main(["pretrain", "--objective", "clm", "--data", str(corpus), "--out", str(out), *TINY]) == 0
    return out


@pytest.mark.parametrize(
    "setting, field",
    [
        ("causal.decoder.layer_norm_eps=-1", "causal.decoder.layer_norm_eps"),
        ("optim.lr=1e30", "optim.lr"),
        ("causal.max_len=0", "causal.max_len"),
        ("causal.decoder.attention.num_kv_heads=0", "num_kv_heads"),
        ("run.eval_rows=0", "run.eval_rows"),
        ("objective.mask_replace=2", "objective.mask_replace"),
        ("optim.lr=nan", "optim.lr"),
    ],
)
def test_pretraining_settings_out_of_range_are_refused_before_anything(tmp_path, corpus, capsys, setting, field):
    out = tmp_path / "r"
    assert (
        main(["pretrain", "--objective", "clm", "--data", str(corpus), "--out", str(out), *TINY, "--set", setting]) == 2
    )
    assert field in capsys.readouterr().err and not out.exists()


def test_a_position_table_counts_toward_the_size_ceiling(tmp_path, corpus, capsys):
    """A learned table of 1M positions x 65,536 wide is 2.7e11 parameters: refused before allocation."""
    out = tmp_path / "r"
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
                *TINY,
                "--set",
                "causal.positional=learned",
                "--set",
                "causal.max_len=1000000",
                "--set",
                "causal.decoder.d_model=65536",
                "--set",
                "causal.decoder.num_heads=1",
            ]
        )
        == 2
    )
    assert "parameters, over the ceiling" in capsys.readouterr().err


def test_a_run_whose_config_disagrees_with_its_weights_is_refused_before_building(clm_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(clm_run, run)
    cfg = json.loads((run / "config.json").read_text())
    cfg["pretrain"]["causal"]["positional"] = "learned"
    cfg["pretrain"]["causal"]["max_len"] = 100000  # a table the weights do not hold
    (run / "config.json").write_text(json.dumps(cfg))
    assert main(["generate", str(run), "the film", "--max-new", "2"]) == 2
    assert "model.safetensors" in capsys.readouterr().err


def test_a_corrupt_tokenizer_is_named(clm_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(clm_run, run)
    (run / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    assert main(["generate", str(run), "the film", "--max-new", "2"]) == 2
    assert "tokenizer.json is not a readable tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "1e-40", "inf", "0"])
def test_generate_refuses_temperatures_that_overflow(clm_run, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["generate", str(clm_run), "the film", "--sample", "--temperature", value])
    assert exc.value.code == 2 and "temperature in [0.001, 1000]" in capsys.readouterr().err


def test_the_generation_config_refuses_them_too():
    from multihead.models.generation import GenerationConfig

    for t in (float("nan"), 1e-40, float("inf")):
        with pytest.raises(ValueError, match="temperature must be in"):
            GenerationConfig(strategy="sample", temperature=t)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "RUN", "--beam", "1000000"], "beam width in [1, 64]"),
        (["induction", "--out", "OUT", "--half", "100000000"], "[1, 1024]"),
        (["bench", "attention", "--modes", "sideways"], "no modes ['sideways']"),
    ],
)
def test_options_without_a_bound_are_bounded(argv, message, tmp_path, capsys):
    argv = [str(tmp_path / "x") if a in ("RUN", "OUT") else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_sinks_refuses_a_length_too_short_to_compare(clm_run, capsys):
    assert main(["sinks", str(clm_run), "--length", "1"]) == 2
    err = capsys.readouterr().err
    assert "--length 1 is too short" in err


def test_g2p_beam_is_bounded_in_the_library_too():
    from multihead.train.g2p import transcribe

    with pytest.raises(ValueError, match=r"beam must be in \[1, 64\]"):
        transcribe(None, None, ["word"], beam=10**6)


def test_bench_out_that_is_a_folder_is_refused_before_running(tmp_path, capsys):
    assert main(["bench", "attention", "--lengths", "16", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_a_prompt_longer_than_the_model_asks_for_a_shorter_prompt(clm_run, capsys):
    """Before: it suggested --max-new 1, which failed the same way."""
    assert main(["generate", str(clm_run), "the film " * 40, "--max-new", "1"]) == 2
    err = capsys.readouterr().err
    assert "shorten the prompt" in err and "--max-new" not in err


def test_a_nested_config_error_is_said_once(capsys, tmp_path, corpus):
    assert (
        main(
            [
                "pretrain",
                "--objective",
                "clm",
                "--data",
                str(corpus),
                "--out",
                str(tmp_path / "r"),
                *TINY,
                "--set",
                "causal.decoder.attention.differential=true",
                "--set",
                "causal.decoder.attention.talking_heads=true",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("invalid config") == 1 and "config: invalid" not in err and "causal.decoder.attention" in err


def test_the_causal_lm_summary_reports_next_token_accuracy(tmp_path, corpus, capsys):
    assert main(["pretrain", "--objective", "clm", "--data", str(corpus), "--out", str(tmp_path / "r"), *TINY]) == 0
    out = capsys.readouterr().out
    assert "next-token accuracy" in out and "masked accuracy" not in out


@pytest.mark.parametrize(
    ("data", "value", "message"),
    [
        ("rotten_tomatoes", "0", "data.eval_limit"),
        ("cmudict", "0", "data.eval_limit must be >= 1"),
        ("digits", "7", "data.eval_limit must be >= 8"),
    ],
)
def test_eval_limit_out_of_range_is_refused_before_the_data_is_read(
    tmp_path, capsys, monkeypatch, data, value, message
):
    """Every task checks --eval-limit with its config, before a dataset is read or --out is touched."""
    from multihead.data import datasets, g2p, images

    def never(*a, **k):
        raise AssertionError("the data was read before the config was checked")

    for module, name in ((datasets, "load"), (g2p, "load_cmudict"), (images, "load_images")):
        monkeypatch.setattr(module, name, never)
    out = tmp_path / "run"
    assert main(["train", "--data", data, "--eval-limit", value, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


def test_an_unknown_preset_names_the_task_s_presets():
    from multihead._config import ConfigError
    from multihead.train import presets

    with pytest.raises(ConfigError, match="unknown preset 'huge' for this task; its presets: quick"):
        presets.preset("g2p", "huge", "cmudict")
    assert presets.preset("train", None, "rotten_tomatoes") == {}
