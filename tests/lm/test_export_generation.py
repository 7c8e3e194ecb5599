"""An exported LM folder keeps everything generation needs: the stop token (EOS), BOS, the chat template and the
special tokens, read back by multihead and by HF transformers; generation through the export stops where
generation from the source does."""

from __future__ import annotations

import json

import gguf
import pytest
import torch

from gguf_edits import rewrite
from hf_families import hf_model, write_gguf
from multihead import lm
from multihead.cli import main
from multihead.data.batching import as_batch
from multihead.models.generation import generate


def greedy(p, prompt: str, n: int = 8) -> list[int]:
    return generate(p.model, as_batch(p.encode(prompt)), None, max_new_tokens=n, stop_tokens=p.eos_ids).tokens[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A GGUF file whose EOS is a token greedy decoding emits after "the cat" (the first after the first token that
    it has not emitted before): generation stops there. Returns the file and how many tokens come before the stop."""
    folder = tmp_path_factory.mktemp("export")
    plain = write_gguf(hf_model("llama", rope_scaling=None), folder / "plain.gguf")
    p = lm.load(plain)
    free = generate(p.model, as_batch(p.encode("the cat")), None, max_new_tokens=8, stop_tokens=()).tokens[0]
    at = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    eos = {"tokenizer.ggml.eos_token_id": (free[at], gguf.GGUFValueType.UINT32)}
    return rewrite(plain, folder / "eos.gguf", meta=eos), at


def test_generation_through_the_export_stops_where_the_source_does(source, tmp_path, capsys):
    source, at = source
    out = tmp_path / "hf"
    assert main(["export", str(source), "--out", str(out)]) == 0
    original, exported = lm.load(source), lm.load(out)
    assert exported.eos_ids == original.eos_ids and exported.bos_id == original.bos_id
    assert exported.chat_template == original.chat_template and exported.special == original.special
    tokens = greedy(original, "the cat")
    assert len(tokens) == at  # stopped at the EOS (which is not included)
    assert greedy(exported, "the cat") == tokens
    assert exported.chat("hello") == original.chat("hello")
    written = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= written
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == original.eos_ids[0]


def test_hf_transformers_reads_the_stop_token_and_chat_template(source, tmp_path):
    import transformers as T

    source, _ = source
    out = tmp_path / "hf"
    assert main(["export", str(source), "--out", str(out)]) == 0
    original = lm.load(source)
    model = T.AutoModelForCausalLM.from_pretrained(out)
    tokenizer = T.AutoTokenizer.from_pretrained(out)
    assert model.generation_config.eos_token_id == original.eos_ids[0]
    assert tokenizer.chat_template == original.chat_template
    assert tokenizer.eos_token == original.special["eos_token"]
    ids = torch.tensor([original.encode("the cat")])
    hf = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :].tolist()
    assert hf == [*greedy(original, "the cat"), original.eos_ids[0]]  # HF keeps the EOS it stopped at
