"""BERT-family pretrained weights in our own modules, with no HF ``transformers`` at run time.

``load("minilm")`` (or a folder path) reads a BERT-layout folder -- ``config.json``, ``model.safetensors`` (or
``pytorch_model.bin``, read with ``torch.load(weights_only=True)``: no pickled code runs), ``tokenizer.json`` or
``vocab.txt`` -- and builds a :class:`~multihead.models.TextEncoder`: learned positions, token-type embeddings,
embedding LayerNorm, post-LN :class:`~multihead.EncoderBlock` s with GELU, our :class:`~multihead.MultiHeadAttention`.
:func:`export` writes an encoder back in HF layout (``BertModel.from_pretrained`` reads it, pruned heads included).

Name map (HF ``BertModel`` -> ours)::

    embeddings.word_embeddings          -> embed
    embeddings.position_embeddings      -> pe.embedding
    embeddings.token_type_embeddings    -> token_type
    embeddings.LayerNorm                -> embed_norm
    encoder.layer.{i}.attention.self.{query,key,value} -> encoder.layers.{i}.attn.{w_q,w_k,w_v}
    encoder.layer.{i}.attention.output.dense           -> encoder.layers.{i}.attn.w_o
    encoder.layer.{i}.attention.output.LayerNorm       -> encoder.layers.{i}.norm1
    encoder.layer.{i}.intermediate.dense               -> encoder.layers.{i}.ffn.w_1
    encoder.layer.{i}.output.dense                     -> encoder.layers.{i}.ffn.w_2
    encoder.layer.{i}.output.LayerNorm                 -> encoder.layers.{i}.norm2

One module over the usual size on purpose: import and export of one folder format, each check beside the field it
reads, so that the two directions cannot drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..._config import check_ranges, from_fields
from ..._io import read_json_file
from ...models.text_encoder import TextEncoder, TextEncoderConfig
from ...modules.encoder import EncoderConfig
from ...modules.variants import AttentionConfig
from .. import names
from ..errors import PretrainedError, raised_as
from ..formats import hf as hf_format
from .base import Adapter, Family

SHORT_NAMES = names.SHORT_NAMES  # the one table of short names (every family's)

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_WHY_NOT = {
    "roberta": "RoBERTa offsets position ids by padding_idx + 1 and has its own tokenizer",
    "xlm-roberta": "XLM-RoBERTa offsets position ids by padding_idx + 1 and uses SentencePiece",
    "camembert": "CamemBERT is RoBERTa-style (offset positions, SentencePiece)",
    "distilbert": "DistilBERT has different parameter names and no token types",
    "albert": "ALBERT shares one layer's weights across layers and factorises the embeddings",
    "electra": "ELECTRA's embedding width differs from its hidden width",
    "gpt2": "GPT-2 is a causal decoder: load it with multihead.lm.load (the LM commands take its folder)",
    "llama": "Llama is a causal decoder: load it with multihead.lm.load (the LM commands take its folder)",
    "qwen2": "Qwen2 is a causal decoder: load it with multihead.lm.load (the LM commands take its folder)",
    "mistral": "Mistral is a causal decoder: load it with multihead.lm.load (the LM commands take its folder)",
}
_LAYER_MAP = [  # HF suffix under encoder.layer.{i}. -> ours under encoder.layers.{i}.
    ("attention.self.query", "attn.w_q"),
    ("attention.self.key", "attn.w_k"),
    ("attention.self.value", "attn.w_v"),
    ("attention.output.dense", "attn.w_o"),
    ("attention.output.LayerNorm", "norm1"),
    ("intermediate.dense", "ffn.w_1"),
    ("output.dense", "ffn.w_2"),
    ("output.LayerNorm", "norm2"),
]
_EMBED_MAP = [
    ("embeddings.word_embeddings", "embed"),
    ("embeddings.position_embeddings", "pe.embedding"),
    ("embeddings.token_type_embeddings", "token_type"),
    ("embeddings.LayerNorm", "embed_norm"),
]
NATIVE = "multihead_text_encoder"  # model_type of an encoder folder in our own layout (not BERT's)
_IGNORED = re.compile(r"^(pooler\.|cls\.|classifier\.|qa_outputs\.|embeddings\.position_ids$)")


# ---------------------------------------------------------------------------------------------------- locating
def resolve(name_or_path: str | Path) -> Path:
    """A folder path, or a short name (``minilm``) resolved to the folder its Python package installs; a finished
    ``multihead pretrain`` run resolves to its exported encoder."""
    text = str(name_or_path)
    if names.short_name(text) is None and not Path(text).exists():
        encoders = ", ".join(n for n, e in names.SHORT_NAMES.items() if e.family == "bert")
        raise PretrainedError(
            f"{text!r} is neither a known short name ({encoders}) nor a folder{names.suggest(text)}; pass a folder "
            "holding config.json and model.safetensors"
        )
    path = names.resolve(text, PretrainedError)
    if names.short_name(text) is None and not path.is_dir():
        raise PretrainedError(f"{text!r} is not a folder; pass a folder holding config.json and model.safetensors")
    if _is_pretraining_run(path):  # a `multihead pretrain` run: its exported encoder
        if not (path / "encoder" / "config.json").is_file():
            raise PretrainedError(
                f"{text!r} is a pretraining run that has not finished (no encoder/ yet); finish it "
                f"with: multihead pretrain --out {text} --resume"
            )
        return path / "encoder"
    return path


def _is_pretraining_run(path: Path) -> bool:
    try:
        return "pretrain" in read_json_file(path / "config.json")
    except (OSError, ValueError, TypeError):
        return False


# ---------------------------------------------------------------------------------------------------- config
def read_hf_config(folder: Path) -> dict:
    with raised_as(PretrainedError):
        return hf_format.read_config(folder)


def encoder_config(hf: dict, *, backend: str = "auto") -> TextEncoderConfig:
    """Our :class:`TextEncoderConfig` for an HF BERT ``config.json`` dict; unsupported models fail with the reason."""
    kind = hf.get("model_type")
    if kind == NATIVE:
        return _native_config(hf, backend)
    if kind != "bert":
        why = _WHY_NOT.get(kind, "only BERT-family encoders are imported")
        raise PretrainedError(
            f"model_type {kind!r} is not supported: {why}. multihead imports BERT-layout encoders "
            "(model_type 'bert': BERT, MiniLM, all-MiniLM-L6-v2, ...)"
        )
    sizes = (
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    )
    missing = [k for k in sizes if k not in hf]
    if missing:
        raise PretrainedError(f"config.json lacks {missing}; it is not a complete BERT config")
    wrong = [f"{k}={hf[k]!r}" for k in sizes if isinstance(hf[k], bool) or not isinstance(hf[k], int) or hf[k] < 1]
    if wrong:
        raise PretrainedError(f"config.json: {', '.join(wrong)}; these sizes must be positive integers")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise PretrainedError(
            f"position_embedding_type {hf['position_embedding_type']!r} is not supported; "
            "only 'absolute' (learned positions) is"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise PretrainedError("decoder / cross-attention BERT configs are not supported; use an encoder checkpoint")
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise PretrainedError(f"hidden_act {act!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
    enc = EncoderConfig(
        d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        num_layers=hf["num_hidden_layers"],
        d_ff=hf["intermediate_size"],
        dropout=hf.get("hidden_dropout_prob", 0.1),
        # Attention-weight dropout (BERT's attention_probs_dropout_prob) is off: it forces PyTorch's slow CPU
        # kernel. Inference is unaffected; fine-tuning keeps residual/FFN/embedding dropout.
        attention=AttentionConfig(dropout=0.0, backend=backend),
        activation=_ACTIVATIONS[act],
        norm_first=False,
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        bias=True,
        pruned_heads=_pruned_heads(hf) or None,
    )
    try:
        config = TextEncoderConfig(
            vocab_size=hf["vocab_size"],
            max_len=hf["max_position_embeddings"],
            positional="learned",
            pooling="mean",
            pad_id=hf.get("pad_token_id", 0),
            embed_init_std=hf.get("initializer_range", 0.02),
            type_vocab_size=hf.get("type_vocab_size", 2),
            embed_norm=True,
            encoder=enc,
        )
        check_ranges(config.encoder, "config.json encoder")
        check_ranges(config, "config.json")  # sizes within the ceilings before anything is allocated
    except (ValueError, TypeError) as exc:
        raise PretrainedError(f"config.json: {exc}") from None
    return config


def _native_config(hf: dict, backend: str) -> TextEncoderConfig:
    own = hf.get("multihead")
    if not isinstance(own, dict) or not isinstance(own.get("encoder"), dict):
        raise PretrainedError(
            f"config.json has model_type {NATIVE!r} but no 'multihead' object with an 'encoder' "
            "section; the folder was not written by multihead (or is corrupt): export it again"
        )
    try:
        encoder = from_fields(EncoderConfig, own["encoder"], "encoder").to_dict()  # older files: flat fields
        encoder["attention"]["backend"] = backend
        config = TextEncoderConfig.from_dict({**own, "encoder": encoder})
        check_ranges(config.encoder, "config.json encoder")
        check_ranges(config, "config.json")
    except (ValueError, TypeError) as exc:
        raise PretrainedError(f"config.json: {exc}") from None
    return config


def _pruned_heads(hf: dict) -> dict[int, list[int]]:
    return {int(k): sorted(int(h) for h in v) for k, v in (hf.get("pruned_heads") or {}).items()}


# ---------------------------------------------------------------------------------------------------- weights
def read_weights(folder: Path) -> dict[str, Tensor]:
    """HF tensors from ``model.safetensors`` (or its shards) or ``pytorch_model.bin`` (``weights_only=True``: no
    code runs); the policy is the HF folder format's (:mod:`multihead.pretrained.formats.hf`)."""
    with raised_as(PretrainedError):
        return {k: v.get() for k, v in hf_format.read_tensors(Path(folder)).items()}


def _names(num_layers: int) -> dict[str, str]:
    """HF parameter name -> ours, for an encoder of ``num_layers`` layers (the table in the module docstring)."""
    table = list(_EMBED_MAP) + [
        (f"encoder.layer.{i}.{hf}", f"encoder.layers.{i}.{ours}") for i in range(num_layers) for hf, ours in _LAYER_MAP
    ]
    return {f"{hf}.{p}": f"{ours}.{p}" for hf, ours in table for p in ("weight", "bias")}


def _hf_key(name: str) -> str:
    """An HF tensor name in BertModel's spelling: ``bert.`` dropped (BertFor* checkpoints nest the model under it),
    old TF-style ``LayerNorm.gamma/beta`` as ``weight/bias``."""
    name = name[5:] if name.startswith("bert.") else name
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def hf_to_ours(
    tensors: dict[str, Tensor], num_layers: int, *, native: bool = False
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename HF tensors to our parameter names; returns (state dict, names of HF tensors ignored). A ``native``
    folder (``model_type`` :data:`NATIVE`) already uses our names."""
    if native:
        return dict(tensors), []
    lookup = _names(num_layers)
    out, ignored = {}, []
    for name, t in tensors.items():
        name = _hf_key(name)
        if name in lookup:
            out[lookup[name]] = t
        elif _IGNORED.match(name):
            ignored.append(name)
        else:
            raise PretrainedError(
                f"unexpected tensor {name!r} {tuple(t.shape)}: not part of a BERT encoder with "
                f"{num_layers} layers; config.json and the weights disagree"
            )
    return out, ignored


def ours_to_hf(state: dict[str, Tensor], num_layers: int) -> dict[str, Tensor]:
    back = {ours: hf for hf, ours in _names(num_layers).items()}
    return {back[k]: v for k, v in state.items() if k in back}


def load_weights_into(model: TextEncoder, folder: Path, hf: dict | None = None) -> list[str]:
    """Copy an HF BERT folder's weights into ``model`` (shapes checked first); returns the HF tensors not used."""
    from ..state import check_state

    tensors = read_weights(Path(folder))
    hf = read_hf_config(Path(folder)) if hf is None else hf
    native = hf.get("model_type") == NATIVE
    kept = {k: v for k, v in tensors.items() if native or not _IGNORED.search(_hf_key(k))}
    ignored = sorted(set(tensors) - set(kept))
    state, _ = hf_to_ours(kept, model.config.encoder.num_layers, native=native)
    own = model.state_dict()
    with raised_as(PretrainedError):
        check_state(
            {k: tuple(v.shape) for k, v in own.items() if not k.startswith("fc.")},  # a classifier keeps its head
            {k: tuple(v.shape) for k, v in state.items()},
            folder,
            optional=("token_type.weight",),
        )
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v.to(own[k].dtype))
    return ignored


def _hf_name(ours: str, num_layers: int) -> str:
    return {o: h for h, o in _names(num_layers).items()}.get(ours, ours)


# ---------------------------------------------------------------------------------------------------- tokenizer
def load_tokenizer(folder: Path):
    """HF ``tokenizers`` tokenizer from ``tokenizer.json`` (preferred) or ``vocab.txt`` (WordPiece, BERT
    normalisation), with padding and truncation switched off: callers add ``[CLS]``/``[SEP]`` and cut themselves."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    if (folder / "tokenizer.json").exists():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises plain Exception for a malformed file
            raise PretrainedError(
                f"{folder / 'tokenizer.json'} is not a readable tokenizer file "
                f"({str(exc).splitlines()[0][:200]}); it is corrupt"
            ) from None
    elif (folder / "vocab.txt").exists():
        lower = True
        if (folder / "tokenizer_config.json").exists():
            lower = hf_format.read_json(folder / "tokenizer_config.json", "tokenizer config").get("do_lower_case", True)
            if not isinstance(lower, bool):
                raise PretrainedError(
                    f"{folder / 'tokenizer_config.json'}: do_lower_case is {lower!r}, not true or false"
                )
        tok = Tokenizer(WordPiece.from_file(str(folder / "vocab.txt"), unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lower
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
    else:
        raise PretrainedError(f"{folder} has neither tokenizer.json nor vocab.txt")
    tok.no_padding()
    tok.no_truncation()
    missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]") if tok.token_to_id(t) is None]
    if missing:
        raise PretrainedError(f"the tokenizer in {folder} lacks BERT's special tokens {missing}")
    return tok


# ---------------------------------------------------------------------------------------------------- the model
@dataclass
class Pretrained:
    """A pretrained encoder with its tokenizer. ``model`` is a :class:`TextEncoder` in eval mode."""

    name: str
    path: Path
    model: TextEncoder
    tokenizer: object
    hf_config: dict
    max_seq_length: int  # texts are cut to this many tokens ([CLS]/[SEP] included), as sentence-transformers does
    ignored: list[str] = field(default_factory=list)  # HF tensors not used (pooler, pretraining heads)

    def encode(self, texts: list[str], max_len: int | None = None) -> tuple[Tensor, Tensor]:
        """``(input_ids, attention_mask)`` ``(B, L)`` for ``texts``: ``[CLS] tokens [SEP]``, padded with [PAD]."""
        from ...data import collate, encode

        enc = encode(self.tokenizer, list(texts), max_len or self.max_seq_length)
        return collate(enc.ids, pad_id=self.tokenizer.token_to_id("[PAD]"))

    def tokens(self, text: str) -> list[str]:
        ids, _ = self.encode([text])
        return [self.tokenizer.id_to_token(i) for i in ids[0].tolist()]

    def embed(
        self, texts: list[str], batch_size: int = 32, *, normalize: bool = True, progress: bool = False
    ) -> Tensor:
        """Sentence embeddings ``(N, E)`` (mean pooling over real tokens, L2-normalised), in input order."""
        return embed_texts(
            self.model,
            self.tokenizer,
            texts,
            self.max_seq_length,
            batch_size=batch_size,
            normalize=normalize,
            progress=progress,
        )


@torch.no_grad()
def embed_texts(
    model: TextEncoder,
    tokenizer,
    texts: list[str],
    max_len: int,
    *,
    batch_size: int = 32,
    normalize: bool = True,
    progress: bool = False,
) -> Tensor:
    """Sentence embeddings ``(N, E)`` from any :class:`TextEncoder` (a classifier's too): texts cut to ``max_len``
    tokens, batched by length, pooled with ``model.config.pooling``, L2-normalised by default; input order."""
    from tqdm import tqdm

    from ...data import encode, length_sorted

    model.eval()
    enc = encode(tokenizer, list(texts), max_len)
    device = next(model.parameters()).device
    out = torch.empty(len(texts), model.config.encoder.d_model)
    batches = length_sorted(enc.ids, batch_size, pad_id=tokenizer.token_to_id("[PAD]"))  # similar lengths
    for chunk, ids, mask in tqdm(batches, total=-(-len(texts) // batch_size), disable=not progress, desc="embed"):
        vec = model.sentence_embeddings(ids.to(device), mask.to(device), normalize=normalize)
        out[chunk] = vec.float().cpu()
    return out


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]] | None:
    """HF tensor names -> shapes from the weight files' headers (nothing read or allocated)."""
    with raised_as(PretrainedError):
        return {k: v.shape for k, v in hf_format.read_tensors(Path(folder)).items()}


def _expected_hf(config: TextEncoderConfig) -> dict[str, tuple[int, ...]]:
    """HF names and shapes of the encoder ``config`` describes (meta device: nothing allocated)."""
    from ..._weights import meta_shapes

    ours = meta_shapes(lambda: TextEncoder(config))
    table = {o: h for h, o in _names(config.encoder.num_layers).items()}
    return {table[k]: v for k, v in ours.items() if k in table}


def _to_ours(tensors: dict[str, Tensor], config: TextEncoderConfig) -> dict[str, Tensor]:
    return hf_to_ours(tensors, config.encoder.num_layers)[0]


def _native_expected(config: TextEncoderConfig) -> dict[str, tuple[int, ...]]:
    from ..._weights import meta_shapes

    return meta_shapes(lambda: TextEncoder(config))


FAMILY = Family(
    "bert",
    "encoder",
    "a BERT-family encoder",
    ("bert",),
    encoder_config,
    TextEncoder,
    {"hf": Adapter(_to_ours, _expected_hf, canonical=_hf_key, ignored=_IGNORED)},
    why_not={
        "gguf": "GGUF files hold causal LMs (llama.cpp's architectures); BERT is an encoder",
        "onnx": "the ONNX reader recognises HF Dinov2Model graphs only; export the encoder as an HF folder",
        "ct2": "CTranslate2 folders of BERT are not read; export the encoder as an HF folder",
    },
    error=PretrainedError,
    loader="families.bert:load",
)
NATIVE_FAMILY = Family(
    "multihead_encoder",
    "encoder",
    "an encoder in multihead's own layout",
    (NATIVE,),
    encoder_config,
    TextEncoder,
    {"hf": Adapter(lambda t, c: dict(t), _native_expected, optional=("token_type.weight",))},
    why_not={f: "multihead writes its own layout as HF-style folders only" for f in ("gguf", "onnx", "ct2")},
    error=PretrainedError,
    loader="families.bert:load",
)


def load(
    name_or_path: str | Path = "minilm", *, backend: str = "auto", device: str = "cpu", progress: bool = False
) -> Pretrained:
    """Build our encoder from a BERT-family folder or short name; see the module docstring. Sizes are checked
    against the ceilings and the weight file's header before the model is built."""
    from ..formats import Read

    folder = resolve(name_or_path)
    hf = read_hf_config(folder)
    config = encoder_config(hf, backend=backend)  # a refused model type or size says so before any weight is read
    family = NATIVE_FAMILY if hf.get("model_type") == NATIVE else FAMILY
    with raised_as(PretrainedError):
        tensors = hf_format.read_tensors(folder)
    ignored = sorted(k for k in tensors if family is FAMILY and _IGNORED.search(_hf_key(k)))
    model, _ = family.model_from(Read(folder, "hf", hf, tensors), config=config, progress=progress)
    return bundle(str(name_or_path), folder, model, hf, ignored, device)


def bundle(name: str, folder: Path, model: TextEncoder, hf: dict, ignored: list[str], device: str) -> Pretrained:
    """The encoder with its tokenizer and sentence length, checked to belong together."""
    config = model.config
    tokenizer = load_tokenizer(folder)
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise PretrainedError(
            f"the tokenizer has {tokenizer.get_vocab_size()} tokens but the model only "
            f"{config.vocab_size} embeddings; tokenizer and weights do not belong together"
        )
    max_seq = config.max_len
    st = folder / "sentence_bert_config.json"
    if st.exists():
        limit = hf_format.read_json(st, "sentence-transformers config").get("max_seq_length", max_seq)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise PretrainedError(f"{st}: max_seq_length is {limit!r}, not a positive integer")
        max_seq = min(max_seq, limit)
    return Pretrained(name, folder, model.to(device).eval(), tokenizer, hf, max_seq, ignored)


# ---------------------------------------------------------------------------------------------------- export
def bert_layout_problems(model: TextEncoder) -> list[str]:
    """Why ``model`` cannot be written as an HF ``BertModel`` (empty: it can)."""
    c, e = model.config, model.config.encoder
    problems = []
    if c.positional != "learned":
        problems.append(f"positional={c.positional!r} (BERT has learned positions)")
    if not c.embed_norm:
        problems.append("no embedding LayerNorm (embed_norm=False)")
    if e.norm_first:
        problems.append("pre-LN blocks (BERT is post-LN)")
    if e.attention.num_kv_heads not in (None, e.num_heads) or e.rotary or not e.bias:
        problems.append("grouped-query attention, rotary or bias-free projections")
    if e.activation not in ("gelu", "gelu_tanh", "relu"):
        problems.append(f"activation {e.activation!r}")
    return problems


def export(
    model: TextEncoder,
    tokenizer,
    folder: str | Path,
    *,
    extra_config: dict | None = None,
    overwrite: bool = False,
    sources: tuple = (),
    layout: str = "bert",
) -> Path:
    """Write ``model``'s encoder (a classifier's head is left out) as an HF ``BertModel`` folder: ``config.json``
    (with ``pruned_heads`` when heads were pruned), ``model.safetensors``, ``tokenizer.json`` and ``vocab.txt``.
    Only BERT-layout encoders can be exported to HF: learned positions, embedding LayerNorm, post-LN, no GQA/rotary;
    with ``layout="auto"`` any other encoder is written in our own layout (:data:`NATIVE`, see the module
    docstring), which :func:`load` and ``train --init`` read. The folder is built aside and swapped in whole; an
    existing folder that is not an HF model is refused unless ``overwrite``, and a folder being read (``sources``)
    always is."""
    from safetensors.torch import save

    from ..._io import Publish, atomic_write_bytes, atomic_write_json

    if layout not in ("bert", "auto"):
        raise ValueError(f"layout must be 'bert' or 'auto', got {layout!r}")
    c = model.config
    e = c.encoder
    problems = bert_layout_problems(model)
    if problems and layout == "bert":
        raise PretrainedError("only BERT-layout encoders can be exported to HF; this one has " + "; ".join(problems))
    folder = Path(folder)
    layers = len(model.encoder.layers)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    pruned = {
        str(i): list(layer.attn.pruned_heads) for i, layer in enumerate(model.encoder.layers) if layer.attn.pruned_heads
    }
    if problems:  # our own layout: our config and tensor names
        own = c.to_dict()
        own["encoder"] = {**own["encoder"], "pruned_heads": pruned or None, "backend": "auto"}
        tensors = state
        config = {
            "architectures": ["MultiheadTextEncoder"],
            "model_type": NATIVE,
            "multihead": own,
            "max_position_embeddings": c.max_len,
            "vocab_size": c.vocab_size,
            **(extra_config or {}),
        }
    else:
        tensors = ours_to_hf(state, layers)
        if model.token_type is None:  # BERT always has token types; zeros change nothing
            tensors["embeddings.token_type_embeddings.weight"] = torch.zeros(1, e.d_model)
        config = {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "hidden_size": e.d_model,
            "num_hidden_layers": layers,
            "num_attention_heads": e.num_heads,  # before pruning; pruned_heads says which are gone
            "intermediate_size": model.encoder.layers[0].ffn.w_1.out_features,
            "hidden_act": {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[e.activation],
            "hidden_dropout_prob": e.dropout,
            "attention_probs_dropout_prob": e.attention.dropout,
            "layer_norm_eps": e.layer_norm_eps,
            "max_position_embeddings": c.max_len,
            "type_vocab_size": max(c.type_vocab_size, 1),
            "vocab_size": c.vocab_size,
            "pad_token_id": c.pad_id if c.pad_id is not None else 0,
            "initializer_range": c.embed_init_std or 0.02,
            "position_embedding_type": "absolute",
            "pruned_heads": pruned,
            **(extra_config or {}),
        }
    target = folder
    with Publish(target, "hf", overwrite=overwrite, sources=sources) as folder:
        atomic_write_bytes(folder / "model.safetensors", save(tensors, metadata={"format": "pt"}))
        atomic_write_json(folder / "config.json", config)
        _write_tokenizer(folder, tokenizer, c.max_len)
    return target


def _write_tokenizer(folder: Path, tokenizer, max_len: int) -> None:
    from ..._io import atomic_write_bytes, atomic_write_json

    if tokenizer is not None:
        atomic_write_bytes(folder / "tokenizer.json", tokenizer.to_str().encode())
        vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        if [i for _, i in vocab] == list(range(len(vocab))):
            atomic_write_bytes(folder / "vocab.txt", "".join(t + "\n" for t, _ in vocab).encode())
        atomic_write_json(
            folder / "tokenizer_config.json",
            {
                "tokenizer_class": "BertTokenizer",
                "do_lower_case": True,
                "model_max_length": max_len,
                "unk_token": "[UNK]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "cls_token": "[CLS]",
                "mask_token": "[MASK]",
            },
        )


__all__ = [
    "NATIVE",
    "Pretrained",
    "PretrainedError",
    "SHORT_NAMES",
    "bert_layout_problems",
    "embed_texts",
    "encoder_config",
    "export",
    "load",
    "load_tokenizer",
    "load_weights_into",
    "read_weights",
    "resolve",
]
