"""Built-in datasets, user files, the fixed split, the tokenizer's edge cases, bucketed batching."""

import json

import pytest

from multihead import data as D


def test_builtin_rotten_tomatoes_card_and_fixed_split():
    ds = D.load("rotten_tomatoes")
    assert len(ds) == 8530 and ds.label_names == ["negative", "positive"]
    s1, s2 = D.split(ds, seed=0), D.split(ds, seed=0)
    assert s1.record == s2.record  # fixed across runs
    assert (len(s1.train), len(s1.validation), len(s1.test)) == (6826, 852, 852)
    assert set(s1.record["test"]).isdisjoint(s1.record["train"])
    # stratified: the test split keeps the 50/50 balance
    assert s1.test.labels.count("positive") == s1.test.labels.count("negative")
    assert D.split(ds, seed=1).record["test"] != s1.record["test"]
    card = D.card(ds, s1)
    assert card["classes"] == {"negative": 4265, "positive": 4265} and card["words"]["p50"] > 10


@pytest.mark.parametrize("name,classes", [("bbc_news", 5), ("bbc_headlines", 5), ("imdb", 2)])
def test_other_builtins_load_and_dedupe(name, classes):
    ds = D.load(name)
    assert len(ds.label_names) == classes
    assert ds.stats["duplicates_removed"] > 0  # these sources really contain duplicate texts
    assert len({" ".join(t.split()) for t in ds.texts}) == len(ds)
    if name == "imdb":
        assert not any("<br" in t for t in ds.texts[:500])
    if name == "bbc_headlines":
        assert max(len(t.split()) for t in ds.texts) < 20


def write_rows(path, rows, fmt):
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        sep = "\t" if fmt == "tsv" else ","
        lines = [sep.join(rows[0])] + [sep.join(str(v) for v in r.values()) for r in rows]
        path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_user_files_with_custom_columns(tmp_path, fmt):
    rows = [{"review": f"text number {i}", "stars": "pos" if i % 2 else "neg"} for i in range(40)]
    rows.append(dict(rows[0]))  # a duplicate
    path = tmp_path / f"d.{fmt}"
    write_rows(path, rows, fmt)
    ds = D.load(str(path), text_column="review", label_column="stars")
    assert len(ds) == 40 and ds.label_names == ["neg", "pos"] and ds.stats["duplicates_removed"] == 1


def test_conflicting_duplicates_are_dropped(tmp_path):
    path = tmp_path / "d.jsonl"
    write_rows(
        path,
        [
            {"text": "same", "label": "a"},
            {"text": "same ", "label": "b"},
            {"text": "x", "label": "a"},
            {"text": "y", "label": "b"},
        ],
        "jsonl",
    )
    ds = D.load(str(path))
    assert "same" not in ds.texts and ds.stats["conflicting_dropped"] == 1


def test_data_errors_name_the_fix(tmp_path):
    with pytest.raises(D.DataError, match="does not exist"):
        D.load(str(tmp_path / "missing.csv"))
    with pytest.raises(D.DataError, match="unknown dataset 'nope'.*rotten_tomatoes"):
        D.load("nope")
    path = tmp_path / "d.csv"
    path.write_text("text,label\nhello,a\n")
    with pytest.raises(D.DataError, match=r"no column 'body'; its columns are \['text', 'label'\]"):
        D.load(str(path), text_column="body")
    empty = tmp_path / "e.csv"
    empty.write_text("text,label\n")
    with pytest.raises(D.DataError, match="empty"):
        D.load(str(empty))
    with pytest.raises(D.DataError, match="single class"):
        D.split(D.load(str(path)))
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "a", "label": "x"}\n{oops\n')
    with pytest.raises(D.DataError, match="b.jsonl:2: not valid JSON"):
        D.load(str(bad))
    with pytest.raises(D.DataError, match="use .csv, .tsv or .jsonl"):
        (tmp_path / "x.parquet").write_text("")
        D.load(str(tmp_path / "x.parquet"))


def test_apply_split_refuses_changed_data():
    ds = D.load("bbc_headlines")
    record = D.split(ds).record
    changed = ds.subset(list(range(len(ds) - 1)))
    with pytest.raises(D.DataError, match="differs from the one this run was split on"):
        D.apply_split(changed, record)


def test_tokenizer_edge_cases():
    texts = ["the cat sat on the mat", "a good film", "a bad film", "the mat was good"] * 10
    tok = D.train_tokenizer(texts, vocab_size=200, min_frequency=1)
    assert tok.token_to_id("[PAD]") == 0
    enc = D.encode(
        tok, ["", "The cat sat on the mat.", "😀 🎬 great", "猫が座った", "Ünïcödé film", "word " * 500], max_len=16
    )
    assert enc.ids[0] == [tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")]  # empty string
    assert D.tokenizer.display_tokens(tok, enc.ids[1])[:4] == ["[CLS]", "the", "cat", "sat"]
    assert tok.token_to_id("[UNK]") in enc.ids[2] and tok.token_to_id("[UNK]") in enc.ids[3]  # unseen scripts
    assert all(len(x) <= 16 for x in enc.ids) and enc.ids[5][-1] == tok.token_to_id("[SEP]")
    assert enc.truncated == 1
    with pytest.raises(ValueError, match="max_len must be at least 3"):
        D.encode(tok, ["x"], max_len=2)


def test_bucketed_batches_are_deterministic_and_padding_is_local():
    lengths = [i % 37 + 1 for i in range(1000)]
    a = D.bucketed_batches(lengths, 32, seed=3, epoch=1)
    assert a == D.bucketed_batches(lengths, 32, seed=3, epoch=1)
    assert a != D.bucketed_batches(lengths, 32, seed=3, epoch=2)
    assert sorted(i for b in a for i in b) == list(range(1000))
    # bucketing: padding waste is far below that of random batches
    waste = sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in a)
    assert waste < 0.05 * sum(lengths)
    ids, mask = D.collate([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[True] * 3, [True, False, False]]


def test_tokenizer_training_is_deterministic_across_processes():
    """Same texts -> same vocabulary in a fresh process (tokenizers' WordPiece trainer is not: #1794)."""
    import subprocess
    import sys

    code = (
        "from multihead import data as D; s = D.split(D.load('rotten_tomatoes')); "
        "import hashlib, json; v = D.train_tokenizer(s.train.texts[:3000], 3000).get_vocab(); "
        "print(hashlib.sha256(json.dumps(sorted(v.items())).encode()).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(digests) == 1
