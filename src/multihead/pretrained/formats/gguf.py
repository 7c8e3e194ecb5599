"""GGUF files (llama.cpp's format) into our models: the header checked first, metadata read into an HF-style config,
tensors dequantised with the ``gguf`` package (llama.cpp's own reader: every quantisation type it knows, memory-mapped,
so nothing is read before it is needed), and the tokenizer rebuilt from the file's vocabulary and merges with
``tokenizers``.

RoPE layout: llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` so that its kernel can rotate adjacent
pairs ``(x[2i], x[2i+1])``; our rotary (and HF's) rotates ``(x[i], x[i + D/2])``. :func:`unpermute` undoes the
permutation per head, so that one rotary implementation serves both sources. A wrong layout gives a model that
runs and talks nonsense, so the tests check it both ways.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import LMError
from ..state import Lazy
from . import Read, gguf_layout as layout
from .gguf_layout import scan

MAGIC = layout.MAGIC
_LAYER = {  # GGUF suffix under blk.{i}. -> HF suffix under model.layers.{i}.
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_LAYER = {
    **_LAYER,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_LAYERS = {"llama": _LAYER, "gemma3": _GEMMA3_LAYER}
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# pre-tokenizer regexes by tokenizer.ggml.pre, as llama.cpp applies them (llama-vocab.cpp)
_GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
_LLAMA3_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PRE_TOKENIZERS = {  # name -> (split digits one by one first, regex)
    "gpt-2": (False, _GPT2_REGEX),
    "default": (False, _GPT2_REGEX),
    "smollm": (True, _GPT2_REGEX),
    "starcoder": (True, _GPT2_REGEX),
    "refact": (True, _GPT2_REGEX),
    "llama-bpe": (False, _LLAMA3_REGEX),
    "llama3": (False, _LLAMA3_REGEX),
}


def check_header(path: Path) -> None:
    """The file's layout (header, metadata, tensor index, data section) checked before the ``gguf`` package reads
    it: :func:`multihead.pretrained.formats.gguf_layout.scan`."""
    scan(path)


# what each metadata entry multihead reads must hold (keys under the architecture's prefix without it)
_KINDS = {
    "block_count": "int",
    "embedding_length": "int",
    "feed_forward_length": "int",
    "context_length": "int",
    "vocab_size": "int",
    "attention.head_count": "int",
    "attention.head_count_kv": "int",
    "attention.key_length": "int",
    "attention.value_length": "int",
    "attention.sliding_window": "int",
    "rope.dimension_count": "int",
    "rope.scaling.original_context_length": "int",
    "attention.layer_norm_rms_epsilon": "float",
    "rope.freq_base": "float",
    "rope.scaling.factor": "float",
    "rope.scaling.type": "str",
    "general.architecture": "str",
    "tokenizer.ggml.model": "str",
    "tokenizer.ggml.pre": "str",
    "tokenizer.chat_template": "str",
    "tokenizer.ggml.tokens": "str[]",
    "tokenizer.ggml.merges": "str[]",
    "tokenizer.ggml.token_type": "int[]",
    "tokenizer.ggml.scores": "float[]",
    "tokenizer.ggml.bos_token_id": "int",
    "tokenizer.ggml.eos_token_id": "int",
    "tokenizer.ggml.padding_token_id": "int",
    "tokenizer.ggml.unknown_token_id": "int",
    "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_space_prefix": "bool",
}
_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "a boolean",
    "str[]": "an array of strings",
    "int[]": "an array of integers",
    "float[]": "an array of numbers",
}


def _holds(f: layout.Field, kind: str) -> bool:
    if kind == "int":
        return f.vtype in layout.INTEGERS
    if kind == "float":
        return f.vtype in layout.FLOATS | layout.INTEGERS
    if kind == "str":
        return f.vtype == layout.STRING
    if kind == "bool":
        return f.vtype == 7
    items = {"str[]": {layout.STRING}, "int[]": layout.INTEGERS, "float[]": layout.FLOATS | layout.INTEGERS}[kind]
    return f.vtype == layout.ARRAY and (f.count == 0 or f.item in items)


def _kind(key: str) -> str | None:
    if key in _KINDS:
        return _KINDS[key]
    return _KINDS.get(key.split(".", 1)[1]) if "." in key and not key.startswith("tokenizer.") else None


# tensor types: norms are F32 (llama.cpp's converter never quantises a 1-D tensor); every other weight is a float type
# or a quantisation type the gguf package dequantises (integer types hold no weights)
_FLOAT_TYPES = {"F32", "F16", "BF16"}


def _allowed_types() -> set[str]:
    from gguf import quants

    return _FLOAT_TYPES | {t.name for t in quants._type_traits}


class GGUFFile:
    """A GGUF file's metadata and tensor index (memory-mapped; tensors are read when asked for). The layout is
    checked first (:mod:`.gguf_layout`); metadata is typed on access; each tensor's type is checked for its role."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        self.layout = scan(self.path)
        try:
            self.reader = gguf.GGUFReader(self.path)
        except (
            ValueError,
            IndexError,
            KeyError,
            TypeError,
            OverflowError,
            RecursionError,
            struct.error,
            OSError,
        ) as exc:
            raise LMError(
                f"{self.path} could not be read as GGUF ({type(exc).__name__}: {str(exc)[:160]}); the file "
                "is truncated or corrupt: download or convert it again"
            ) from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        self._check_types()

    def _check_types(self) -> None:
        allowed = _allowed_types()
        for name, t in self.tensors.items():
            kind = t.tensor_type.name
            if name.endswith("norm.weight") and kind != "F32":
                raise LMError(
                    f"{self.path}: tensor {name!r} is stored as {kind}; norm weights are F32 in every GGUF file "
                    "llama.cpp writes: the file was altered or converted wrongly, convert it again"
                )
            if kind not in allowed:
                raise LMError(
                    f"{self.path}: tensor {name!r} is stored as {kind}, which holds no weights; weights are F32, F16, "
                    "BF16 or a quantisation type (Q4_0, Q8_0, Q4_K, ...): the file is corrupt, convert it again"
                )

    def get(self, key: str, default=None):
        """The value of metadata ``key`` (``default`` when absent), refused when it is not of the type multihead
        reads there (a string epsilon, an integer chat template, integers for tokens)."""
        field = self.reader.fields.get(key)
        if field is None:
            return default
        kind, entry = _kind(key), self.layout.fields.get(key)
        if kind is not None and entry is not None and not _holds(entry, kind):
            raise LMError(
                f"{self.path}: metadata {key} is {layout.type_name(entry.vtype, entry.item)} but must be "
                f"{_KIND_WORDS[kind]}; the file is corrupt or was written by a converter multihead does not know: "
                "convert it again with llama.cpp's convert_hf_to_gguf.py"
            )
        try:
            return field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise LMError(f"{self.path}: metadata {key!r} is unreadable ({exc}); the file is corrupt") from None

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", "?"))

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape in PyTorch order (GGUF lists dimensions innermost first)."""
        return tuple(int(n) for n in reversed(list(self.tensors[name].shape)))

    def tensor(self, name: str) -> Tensor:
        """One tensor, dequantised to float32, in PyTorch order."""
        from gguf import quants

        t = self.tensors[name]
        try:
            array = quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError, TypeError, quants.QuantError) as exc:
            raise LMError(
                f"{self.path}: tensor {name!r} of type {t.tensor_type.name} cannot be dequantised ({exc})"
            ) from None
        # a copy: unquantised tensors come back as views of the read-only memory map
        return torch.from_numpy(np.array(array, dtype=np.float32)).reshape(self.shape(name))


def hf_config(g: GGUFFile) -> dict:
    """The HF ``config.json`` a GGUF file's metadata describes (``llama`` architecture)."""
    arch = g.architecture
    if arch == "gemma3":
        return _gemma3_config(g)
    if arch != "llama":
        raise LMError(
            f"{g.path}: GGUF architecture {arch!r} is not supported; multihead reads 'llama' (Llama, "
            "SmolLM2, Mistral conversions) and 'gemma3' GGUF files; for other models use an HF folder"
        )

    def need(key: str):
        value = g.get(f"llama.{key}")
        if value is None:
            raise LMError(f"{g.path}: metadata llama.{key} is missing; the file is not a complete llama GGUF")
        return value

    heads = need("attention.head_count")
    e = need("embedding_length")
    for k, v in (("embedding_length", e), ("attention.head_count", heads)):
        if not isinstance(v, int) or v < 1:
            raise LMError(f"{g.path}: llama.{k}={v!r}; it must be a positive integer")
    rope_dims = g.get("llama.rope.dimension_count", e // heads)
    if "rope_freqs.weight" in g.tensors:
        raise LMError(f"{g.path}: per-frequency rope factors (rope_freqs, Llama 3.1 style) are not supported yet")
    tokens = g.get("tokenizer.ggml.tokens")
    hf = {
        "model_type": "llama",
        "hidden_size": e,
        "num_attention_heads": heads,
        "num_key_value_heads": g.get("llama.attention.head_count_kv", heads),
        "num_hidden_layers": need("block_count"),
        "intermediate_size": need("feed_forward_length"),
        "max_position_embeddings": g.get("llama.context_length", 2048),
        "rms_norm_eps": float(g.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(g.get("llama.rope.freq_base", 10000.0)),
        "vocab_size": g.get("llama.vocab_size", len(tokens) if tokens else None),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "hidden_act": "silu",
        "partial_rotary_factor": rope_dims / (e // heads) if e >= heads else 1.0,  # refused by the family unless 1
        "bos_token_id": g.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": g.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": g.get("tokenizer.ggml.padding_token_id"),
    }
    scaling = g.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        factor = g.get("llama.rope.scaling.factor")
        if scaling not in ("linear", "yarn"):
            raise LMError(f"{g.path}: rope scaling {scaling!r} is not supported (linear and yarn are)")
        hf["rope_scaling"] = {"rope_type": scaling, "factor": factor}
        if scaling == "yarn":
            hf["rope_scaling"]["original_max_position_embeddings"] = g.get("llama.rope.scaling.original_context_length")
    return hf


def _gemma3_config(g: GGUFFile) -> dict:
    """Gemma 3's metadata as an HF ``gemma3_text`` config: every 6th layer global (llama.cpp's rule for Gemma 3),
    the local layers' rotary base 1e4 (not stored in the file)."""

    def need(key: str):
        value = g.get(f"gemma3.{key}")
        if value is None:
            raise LMError(f"{g.path}: metadata gemma3.{key} is missing; the file is not a complete gemma3 GGUF")
        return value

    layers = need("block_count")
    head_dim = g.get("gemma3.attention.key_length", 256)
    if g.get("gemma3.attention.value_length", head_dim) != head_dim:
        raise LMError(f"{g.path}: key and value widths differ; not supported")
    tokens = g.get("tokenizer.ggml.tokens")
    window = g.get("gemma3.attention.sliding_window")
    return {
        "model_type": "gemma3_text",
        "hidden_size": need("embedding_length"),
        "num_attention_heads": need("attention.head_count"),
        "num_key_value_heads": g.get("gemma3.attention.head_count_kv", need("attention.head_count")),
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "num_hidden_layers": layers,
        "intermediate_size": need("feed_forward_length"),
        "max_position_embeddings": g.get("gemma3.context_length", 32768),
        "rms_norm_eps": float(g.get("gemma3.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g.get("gemma3.rope.freq_base", 1e6)),
        "rope_local_base_freq": 10000.0,
        "sliding_window": window,
        "sliding_window_pattern": 6,
        "vocab_size": len(tokens) if tokens else None,
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "hidden_activation": "gelu_pytorch_tanh",
        "bos_token_id": g.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": g.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": g.get("tokenizer.ggml.padding_token_id"),
    }


def hf_names(g: GGUFFile, layers: int) -> dict[str, str]:
    """GGUF tensor name -> HF name; an unknown tensor is refused with its name."""
    table = _LAYERS.get(g.architecture, _LAYER)
    out = {}
    for name in g.tensors:
        if name in _GLOBAL:
            out[name] = _GLOBAL[name]
            continue
        parts = name.split(".")
        if (
            len(parts) == 4
            and parts[0] == "blk"
            and parts[1].isdigit()
            and parts[2] in table
            and int(parts[1]) < layers
        ):
            out[name] = f"model.layers.{parts[1]}.{table[parts[2]]}.{parts[3]}"
        else:
            raise LMError(
                f"{g.path}: unexpected tensor {name!r}: not part of a {layers}-layer {g.architecture} "
                "model; the metadata and the tensors disagree"
            )
    return out


def permute(w: Tensor, heads: int) -> Tensor:
    """llama.cpp's converter's row order for q/k weights (HF half-split -> adjacent pairs), per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def unpermute(w: Tensor, heads: int) -> Tensor:
    """The inverse of :func:`permute`: GGUF q/k rows back to the half-split layout HF and we rotate."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def hf_shapes(g: GGUFFile, hf: dict) -> dict[str, tuple[int, ...]]:
    return {hf_name: g.shape(name) for name, hf_name in hf_names(g, hf["num_hidden_layers"]).items()}


def _hf_tensor(g: GGUFFile, name: str, hf_name: str, hf: dict) -> Tensor:
    """One tensor under its HF name, q/k rows unpermuted (see the module docstring)."""
    t = g.tensor(name)
    if g.architecture == "gemma3":  # half-split rotary (no permutation); norms stored as 1 + HF's weight
        if name.endswith("norm.weight"):
            t = t - 1.0
    elif hf_name.endswith("self_attn.q_proj.weight"):
        t = unpermute(t, hf["num_attention_heads"])
    elif hf_name.endswith("self_attn.k_proj.weight"):
        t = unpermute(t, hf["num_key_value_heads"])
    return t


def hf_tensors(g: GGUFFile, hf: dict, *, progress: bool = False):
    """Yield ``(hf_name, float32 tensor)``, q/k rows unpermuted (see the module docstring)."""
    from tqdm import tqdm

    names = hf_names(g, hf["num_hidden_layers"])
    for name, hf_name in tqdm(names.items(), desc="dequantise", disable=not progress, leave=False):
        yield hf_name, _hf_tensor(g, name, hf_name, hf)


def claims(path: Path) -> bool:
    if not path.is_file():
        return False
    if path.suffix == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def read(path: Path) -> Read:
    """The file's HF-style config, its tensors under HF names (dequantised when fetched) and, in ``meta``, the open
    file (its tokenizer and special tokens are read by the LM bundle)."""
    g = GGUFFile(path)
    hf = hf_config(g)
    tensors = {
        hf_name: Lazy(g.shape(name), lambda name=name, hf_name=hf_name: _hf_tensor(g, name, hf_name, hf))
        for name, hf_name in hf_names(g, hf["num_hidden_layers"]).items()
    }
    return Read(Path(path), "gguf", hf, tensors, {"gguf": g})


def tokenizer(g: GGUFFile):
    """A ``tokenizers.Tokenizer`` from the file's own vocabulary, merges and pre-tokenizer name (byte-level BPE,
    ``tokenizer.ggml.model == "gpt2"``); control tokens are special (never split); BOS is added when the file says
    so (``tokenizer.ggml.add_bos_token``)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    kind = g.get("tokenizer.ggml.model")
    if kind == "llama":
        return _sentencepiece(g)
    if kind != "gpt2":
        raise LMError(
            f"{g.path}: tokenizer model {kind!r} is not supported; multihead rebuilds byte-level BPE "
            "('gpt2') and SentencePiece ('llama') tokenizers from GGUF metadata"
        )
    tokens, merges = g.get("tokenizer.ggml.tokens"), g.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise LMError(f"{g.path}: the GGUF metadata lacks tokenizer.ggml.tokens or .merges")
    pre = g.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise LMError(
            f"{g.path}: pre-tokenizer {pre!r} is not known to multihead (known: "
            f"{', '.join(sorted(PRE_TOKENIZERS))}); an unknown one would split text differently from the "
            "model's training"
        )
    digits, regex = PRE_TOKENIZERS[pre]
    vocab = _vocabulary(g, tokens)
    pairs = _merges(g, merges, vocab)
    try:
        tok = Tokenizer(BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    except Exception as exc:  # noqa: BLE001  (the tokenizers library raises plain Exception)
        raise LMError(
            f"{g.path}: the vocabulary and merges do not make a tokenizer ({exc}); the file is corrupt"
        ) from None
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    types = _token_types(g, len(tokens))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k in (3, 4)]
    )  # control and user-defined tokens stay whole
    bos = g.get("tokenizer.ggml.bos_token_id")
    if g.get("tokenizer.ggml.add_bos_token", False) and isinstance(bos, int) and 0 <= bos < len(tokens):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)]
        )
    return tok


def _vocabulary(g: GGUFFile, tokens: list[str]) -> dict[str, int]:
    """Token -> id; a token listed twice is refused (the tokenizer would give one of its ids and never the other)."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise LMError(
                f"{g.path}: token {t[:40]!r} is listed twice in tokenizer.ggml.tokens (ids {vocab[t]} and {i}); "
                "the vocabulary is corrupt: convert the model again"
            )
        vocab[t] = i
    return vocab


def _merges(g: GGUFFile, merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Each merge ``"a b"`` as ``(a, b)``; both parts and their join must be tokens of the vocabulary."""
    pairs = []
    for i, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2 or not all(parts):
            raise LMError(
                f"{g.path}: merge {i} of tokenizer.ggml.merges is {m[:40]!r}, not two tokens separated by one "
                "space; the tokenizer is corrupt: convert the model again"
            )
        for t in (*parts, parts[0] + parts[1]):
            if t not in vocab:
                raise LMError(
                    f"{g.path}: merge {i} ({m[:40]!r}) uses {t[:40]!r}, which is not in tokenizer.ggml.tokens; the "
                    "tokenizer is corrupt: convert the model again"
                )
        pairs.append((parts[0], parts[1]))
    return pairs


def _token_types(g: GGUFFile, n: int) -> list[int]:
    types = g.get("tokenizer.ggml.token_type")
    if types is None:
        return [1] * n
    if len(types) != n:
        raise LMError(
            f"{g.path}: tokenizer.ggml.token_type has {len(types):,} entries for {n:,} tokens; the file is corrupt"
        )
    return types


def _sentencepiece(g: GGUFFile):
    """A SentencePiece vocabulary (``tokenizer.ggml.model == "llama"``, Gemma) as a ``tokenizers`` Unigram model
    over the file's tokens and scores, with byte fallback: spaces become ``▁`` (no prefix space unless the file asks),
    control tokens stay whole, BOS is added when the file says so. This is how HF transformers reads the same file;
    llama.cpp merges greedily by score instead, which can split a rare word differently."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import Unigram

    tokens, scores = g.get("tokenizer.ggml.tokens"), g.get("tokenizer.ggml.scores")
    if not tokens or scores is None or len(scores) != len(tokens):
        raise LMError(f"{g.path}: the GGUF metadata lacks tokenizer.ggml.tokens or .scores (or they differ in length)")
    _vocabulary(g, tokens)
    vocab = []
    for t, score in zip(tokens, scores):
        if t == "<0x09>":
            t = "\t"
        elif t and not t.strip(" "):
            t = "▁" * len(t)
        vocab.append((t, float(score)))
    unk = g.get("tokenizer.ggml.unknown_token_id", 0)
    tok = Tokenizer(
        Unigram(vocab, unk_id=unk if isinstance(unk, int) and 0 <= unk < len(tokens) else 0, byte_fallback=True)
    )
    tok.normalizer = normalizers.Replace(" ", "▁")
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if g.get("tokenizer.ggml.add_space_prefix", False):
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    types = _token_types(g, len(tokens))
    # control tokens (<bos>, <start_of_turn>, ...) and non-blank user-defined ones stay whole, under their own ids
    tok.add_special_tokens(
        [
            AddedToken(v[0], special=k == 3, normalized=False)
            for v, k in zip(vocab, types)
            if (k == 3 or (k == 4 and v[0].strip("▁"))) and v[0]
        ]
    )
    bos = g.get("tokenizer.ggml.bos_token_id")
    if g.get("tokenizer.ggml.add_bos_token", False) and isinstance(bos, int) and 0 <= bos < len(tokens):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{vocab[bos][0]} $A", pair=f"{vocab[bos][0]} $A $B", special_tokens=[(vocab[bos][0], bos)]
        )
    return tok


__all__ = ["GGUFFile", "check_header", "hf_config", "hf_tensors", "permute", "tokenizer", "unpermute"]
