"""Bad input is answered with a message that names the fix, never a traceback, and nothing is written (defects 6, 7
and 9 of the reliability issue)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from robust_helpers import refused, run_cli, tiny_train_args


def _csv(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


# ---------------------------------------------------------------------------------------------------- 6. numbers
@pytest.mark.parametrize(
    "flag, value, fragment",
    [
        ("--batch-size", "-5", "optim.batch_size"),
        ("--threads", "-1", "run.threads"),
        ("--epochs", "0", "optim.epochs"),
        ("--lr", "nan", "finite"),
        ("--max-len", "2", "data.max_len"),
    ],
)
def test_train_numbers_out_of_range_are_refused(tmp_path, data_csv, flag, value, fragment):
    out = tmp_path / "run"
    refused(run_cli(*tiny_train_args(data_csv, out, flag, value)), fragment)
    assert not out.exists()


def test_embed_negative_batch_size_is_refused(tmp_path):
    out = tmp_path / "e.jsonl"
    proc = run_cli("embed", "minilm", "hello", "--batch-size", "-1", "--out", out)
    refused(proc, "--batch-size", "positive integer")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------- 7. data
def test_missing_label_cell_is_refused_with_its_line(tmp_path):
    f = _csv(tmp_path / "d.csv", "text,label\ngood,pos\nbad,\nok,neg\n")
    refused(run_cli("data", f), "d.csv:3", "label", "empty")


def test_missing_column_value_in_jsonl_is_refused(tmp_path):
    f = _csv(tmp_path / "d.jsonl", '{"text": "good", "label": "a"}\n{"text": "bad"}\n')
    refused(run_cli("data", f), "d.jsonl:2", "label", "missing")


def test_unbalanced_quote_is_refused_with_its_line(tmp_path):
    rows = "".join(f"text {i},{'a' if i % 2 else 'b'}\n" for i in range(20))
    f = _csv(tmp_path / "d.csv", 'text,label\n"an open quote,a\n' + rows)
    refused(run_cli("data", f), "d.csv:2", "quote")


def test_numeric_twin_labels_are_kept_and_warned(tmp_path):
    rows = "".join(f"text number {i},{['1', '1.0', '01', '0'][i % 4]}\n" for i in range(80))
    f = _csv(tmp_path / "d.csv", "text,label\n" + rows)
    proc = run_cli("data", f, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "warning" in proc.stderr and "'01', '1', '1.0'" in proc.stderr
    assert set(json.loads(proc.stdout)["classes"]) == {"0", "01", "1", "1.0"}  # exactly as written


def test_null_text_in_jsonl_is_refused(tmp_path):
    f = _csv(tmp_path / "d.jsonl", '{"text": "good", "label": "a"}\n{"text": null, "label": "b"}\n')
    refused(run_cli("data", f), "d.jsonl:2", "text", "missing")


def test_predict_file_with_null_text_is_refused(trained_run, tmp_path):
    f = _csv(tmp_path / "t.jsonl", '{"text": "good"}\n{"text": null}\n')
    proc = run_cli("predict", trained_run, "--file", f)
    refused(proc, "t.jsonl:2")
    assert "None" not in proc.stdout


def test_bom_is_stripped_from_the_header(tmp_path):
    rows = "".join(f"text {i},{'a' if i % 2 else 'b'}\n" for i in range(40))
    f = tmp_path / "d.csv"
    f.write_bytes(b"\xef\xbb\xbf" + ("text,label\n" + rows).encode())
    proc = run_cli("data", f)
    assert proc.returncode == 0, proc.stderr
    assert "40 examples" in proc.stdout


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("[1, 2]\n", "a JSON list, not an object"),
        ("42\n", "a JSON int, not an object"),
        ('{"text": "a", "label": [1]}\n', "JSON list"),
        ('{"text": 5, "label": "a"}\n', "not a string"),
    ],
)
def test_jsonl_lines_that_are_not_objects_are_refused(tmp_path, content, fragment):
    refused(run_cli("data", _csv(tmp_path / "d.jsonl", content)), "d.jsonl:1", fragment)


def test_latin1_file_names_the_file_line_and_fix(tmp_path):
    f = _csv(tmp_path / "d.csv", "text,label\nok,a\ncafé,b\n", encoding="latin-1")
    refused(run_cli("data", f, subprocess_=True), "d.csv:3", "not UTF-8", "iconv")


def test_directory_named_like_a_csv_is_refused(tmp_path):
    (tmp_path / "x.csv").mkdir()
    refused(run_cli("data", tmp_path / "x.csv"), "is a folder")


# ---------------------------------------------------------------------------------------------------- 9. outputs
def test_out_that_is_a_file_is_refused_before_data_preparation(tmp_path, data_csv):
    f = tmp_path / "taken"
    f.write_text("keep me")
    refused(run_cli(*tiny_train_args(data_csv, f)), "is a file")
    refused(run_cli(*tiny_train_args(data_csv, f / "sub")), "is a file")
    assert f.read_text() == "keep me"


def test_out_of_another_kind_is_refused(tmp_path, data_csv):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused(run_cli(*tiny_train_args(data_csv, other)), "other files", "--overwrite")
    assert (other / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ('optim.epochs="3"x', "optim.epochs"),
        ("model.encoder.num_layers=[1]", "model.encoder.num_layers"),
        ("optim.lr=true", "optim.lr"),
        ("run.seed=-1", "run.seed"),
        ("nosection=1", "unknown"),
        ("optim.nofield=1", "unknown optim fields"),
        ("=1", "section.key=value"),
    ],
)
def test_wrong_types_in_set_are_refused_and_leave_no_folder(tmp_path, data_csv, setting, fragment):
    out = tmp_path / "run"
    refused(run_cli(*tiny_train_args(data_csv, out, "--set", setting)), fragment)
    assert not out.exists() and not (tmp_path / ".run.new").exists()
    assert run_cli(*tiny_train_args(data_csv, out)).returncode == 0  # the retry is not blocked


@pytest.mark.parametrize(
    "toml, fragment",
    [
        ('[optim]\nlr = "fast"\n', "optim.lr"),
        ("[optim\nlr = 1\n", "not valid TOML"),
        ("[model.encoder]\nnum_heads = 0\n", "model.encoder.num_heads"),
        ("optim = 3\n", "optim must be a table"),
    ],
)
def test_wrong_toml_is_refused(tmp_path, data_csv, toml, fragment):
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    proc = run_cli(
        "train",
        "--data",
        data_csv,
        "--text-column",
        "sentence",
        "--label-column",
        "sentiment",
        "--out",
        tmp_path / "run",
        "--config",
        cfg,
        "--no-progress",
    )  # no flags: they would win over the file
    refused(proc, fragment)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_refused(tmp_path, data_csv):
    refused(run_cli(*tiny_train_args(data_csv, tmp_path / "run", "--device", "cuda")), "CUDA is not available")
    refused(run_cli(*tiny_train_args(data_csv, tmp_path / "run", "--device", "tpu")), "run.device")


def test_non_utf8_argument_is_refused():
    proc = run_cli("predict", "runs/x", b"caf\xe9".decode("utf-8", "surrogateescape"), subprocess_=True)
    refused(proc, "argument 3", "not valid UTF-8")


# ---------------------------------------------------------------------------------------------------- 9. run folders
def _corrupt(run: Path, name: str, content: str) -> None:
    (run / name).write_text(content)


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("config.json", '{"model": {}}', "no 'train' section"),
        ("config.json", "[1, 2]", "JSON list"),
        ("config.json", "{not json", "not valid JSON"),
        ("labels.json", '{"a": 0, "b": 1}', "JSON dict"),
        ("labels.json", '"ab"', "JSON str"),
        ("labels.json", '["a", "a"]', "distinct class names"),
        ("tokenizer.json", '{"version": "1.0", "model": 5}', "not a readable tokenizer"),
    ],
)
def test_corrupt_run_files_get_messages(run_copy, name, content, fragment):
    _corrupt(run_copy, name, content)
    for cmd in (
        ["predict", run_copy, "good"],
        ["evaluate", run_copy],
        ["show", run_copy, "good", "--out", run_copy.parent / "show"],
    ):
        refused(run_cli(*cmd), fragment)


def test_truncated_hf_safetensors_is_refused(tmp_path):
    from multihead import pretrained

    folder = tmp_path / "hf"
    folder.mkdir()
    src = pretrained.resolve("minilm")
    for name in ("config.json", "tokenizer.json", "vocab.txt"):
        (folder / name).write_bytes((src / name).read_bytes())
    data = (src / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
    refused(run_cli("embed", folder, "hello"), "truncated or corrupt")


def test_malicious_pickle_message_never_suggests_weights_only_false(tmp_path):
    import pickle

    from multihead import pretrained

    folder = tmp_path / "hf"
    folder.mkdir()
    src = pretrained.resolve("minilm")
    for name in ("config.json", "tokenizer.json"):
        (folder / name).write_bytes((src / name).read_bytes())

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"x": Evil()}))
    proc = run_cli("embed", folder, "hello", subprocess_=True)
    err = refused(proc, "never runs pickled code")
    assert "weights_only=False" not in err and "pwned" not in proc.stdout


def test_cli_prints_internal_errors_without_traceback(monkeypatch, capsys):
    from multihead import cli

    def boom(args):
        raise RuntimeError("deliberate")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["backends"].set_defaults(fn=boom)
    assert cli.main(["backends"]) == 70
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: deliberate" in err and "bug" in err and "Traceback" not in err
