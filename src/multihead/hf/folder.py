"""HF folders that multihead has no native reader for, loaded with transformers and attached.

The source registry (:func:`multihead.loading.kind`) sends an HF folder here when its ``model_type`` is no native
family's and transformers knows it. What the folder is read as -- a causal LM, a text encoder, a
sequence-to-sequence or an image model (:data:`ROLES`) -- is decided from its config alone (:func:`role_of`), never
by trying the causal-LM class first, and it is read with the class its config names where transformers' auto tables
list it for that type. Before any weight is read the folder's ``config.json`` goes through multihead's JSON reader
(size and depth bounded), the model is built on the meta device to count its parameters against the ceiling
(``MULTIHEAD_MAX_PARAMETERS``), and only safetensors weights are read (no pickle).

A causal LM (:func:`load`) comes back as a :class:`~multihead.pretrained.causal_lm.PretrainedLM` whose model is an
:class:`AttachedLM`: the attached HF model behind multihead's calling convention ``model(ids, keep) -> logits``, so
every verb of a causal LM takes it. The other kinds (:func:`load_folder`) come back as an
:class:`~multihead.hf.models.AttachedFolder`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from torch.utils.weak import WeakIdKeyDictionary

from . import lean
from .attach import AttachError, attach, why_not_skeleton
from .record import INSTALL
from ..modules import fastpath


def _model_type(path: Path) -> tuple[str | None, dict]:
    from ..pretrained.formats.hf import read_config

    hf = read_config(path)
    kind = hf.get("model_type")
    return (kind if isinstance(kind, str) else None), hf


def why_not_folder(path: str | Path) -> str | None:
    """Why the HF folder ``path`` cannot be loaded attached (None: it can be, in one of :data:`ROLES`), from its
    config alone."""
    kind, hf = _model_type(Path(path))
    role, why = _role(kind, hf)
    return why if role is None else None


def role_of(path: str | Path) -> str:
    """What the HF folder ``path`` is read as (a key of :data:`ROLES`), from its config alone; an
    :class:`~multihead.hf.attach.AttachError` with the reason where it is none of them."""
    kind, hf = _model_type(Path(path))
    role, why = _role(kind, hf)
    if role is None:
        raise AttachError(f"{path}: {why}")
    return role


# What an HF folder with no native family is read as, and what that is called.
ROLES = {
    "causal": "an HF causal LM",
    "encoder": "an HF text encoder",
    "seq2seq": "an HF sequence-to-sequence model",
    "vision": "an HF vision model",
}
# role -> transformers' auto table whose class reads a folder whose config names none of its own
_DEFAULT_TABLE = {
    "causal": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "encoder": "MODEL_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "vision": "MODEL_MAPPING_NAMES",
}


def _class_for(kind: str, archs: list[str], role: str) -> str | None:
    """The transformers class that reads a folder of ``model_type`` ``kind``: the architecture its config names
    where transformers' auto tables list it for that type (so a classifier's head is read, not dropped), else the
    role's default class. Only transformers' own classes: a name from the config is never looked up elsewhere."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    known = {
        name
        for table in dir(auto)
        if table.endswith("MAPPING_NAMES") and table != "CONFIG_MAPPING_NAMES"
        for name in _names(getattr(auto, table).get(kind))
    }
    for a in archs:
        if a in known and hasattr(transformers, a):
            return a
    default = _names(getattr(auto, _DEFAULT_TABLE[role]).get(kind))
    return next((d for d in default if hasattr(transformers, d)), None)


def _role(kind: str | None, hf: dict | None) -> tuple[str | None, str]:
    """``(role, transformers class)`` of a folder of ``model_type`` ``kind`` (config ``hf``), decided by what the
    config says the model is; ``(None, why)`` where multihead's command line reads it as none of :data:`ROLES`."""
    why = _why_not_type(kind, hf)
    hf = hf or {}
    if why is None:
        return "causal", "AutoModelForCausalLM"
    from transformers.models.auto import modeling_auto as auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    if kind not in CONFIG_MAPPING_NAMES:
        return None, why
    parts = set(getattr(CONFIG_MAPPING[kind], "sub_configs", None) or {}) | {
        k for k, v in hf.items() if isinstance(v, dict)
    }
    if any(k.endswith(("vision_config", "audio_config", "text_config")) for k in parts):
        return None, (
            f"{kind} is a multimodal model ({', '.join(sorted(k for k in parts if k.endswith('_config')))}); "
            f"{_FROM_PYTHON}"
        )
    archs = [a for a in _names(hf.get("architectures")) if isinstance(a, str)]
    if hf.get("is_encoder_decoder") is True or kind in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        role = "seq2seq" if kind in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES else None
    elif kind in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES or kind in getattr(
        auto, "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES", {}
    ):
        role = "encoder"
    elif kind in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES or (
        kind in auto.MODEL_MAPPING_NAMES and "patch_size" in hf and "image_size" in hf
    ):
        role = "vision"
    else:
        role = None
    if role is None:
        return None, (
            f"{kind} is not a causal LM, a text encoder, a text sequence-to-sequence model or an image model, the "
            f"kinds the command line reads attached; {_FROM_PYTHON}"
        )
    named = _class_for(kind, archs, role)
    if named is None:
        return None, f"transformers has no class that reads {kind} as {ROLES[role]}; {_FROM_PYTHON}"
    return role, named


_FROM_PYTHON = (
    "the command line reads causal LMs, text encoders, text sequence-to-sequence and image models (and BERT, DINOv2, "
    "Whisper natively); any attachable model is read from Python: "
    "multihead.hf.attach(<the right Auto class>.from_pretrained(...))"
)


def _names(value) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) if isinstance(value, str) else ()


def _why_not_type(kind: str | None, hf: dict | None = None) -> str | None:
    """Why a folder of ``model_type`` ``kind`` (config ``hf``) is not read as a causal LM. The class is decided by
    what the config says the model is -- ``is_encoder_decoder``, ``architectures``, its sub-models -- and never by
    trying the causal-LM class first: transformers' causal-LM table also holds the decoder half of seq2seq models
    (``BartForCausalLM`` drops BART's encoder) and decoder variants of encoders (``RobertaForCausalLM``)."""
    try:
        import transformers
        from transformers.models.auto import modeling_auto as auto
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return f"reading it needs transformers, which is not installed: {INSTALL}"
    hf = hf or {}
    if kind not in CONFIG_MAPPING_NAMES:
        return (
            f"model_type {kind!r} is not an architecture transformers {transformers.__version__} knows "
            "(nor multihead); a folder made by another library, or a newer transformers release"
        )
    causal = _names(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(kind))
    if not causal:
        return f"{kind} is not a causal LM; {_FROM_PYTHON}"
    seq2seq = getattr(auto, "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", {})
    if hf.get("is_encoder_decoder") is True or kind in seq2seq:
        return (
            f"{kind} is a sequence-to-sequence model (an encoder and a decoder); read as a causal LM it would "
            f"lose its encoder ({causal[0]} is the decoder alone), so it is not; {_FROM_PYTHON} "
            "(AutoModelForSeq2SeqLM)"
        )
    parts = sorted(k for k, v in hf.items() if k.endswith(("vision_config", "audio_config")) and isinstance(v, dict))
    if parts:
        return (
            f"{kind} is a multimodal model ({', '.join(parts)}); read as a causal LM it would lose those parts, so "
            f"it is not; {_FROM_PYTHON}"
        )
    archs = [a for a in _names(hf.get("architectures")) if isinstance(a, str)]
    # an encoder family (BERT, RoBERTa, ELECTRA...) is a causal LM only where the config says so
    if kind in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not (
        any(a in causal or a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
        or (not archs and hf.get("is_decoder") is True)
    ):
        named = (
            f"names the architecture {', '.join(archs)}" if archs else "names no architecture and sets no is_decoder"
        )
        return (
            f"{kind} is an encoder (its config {named}); reading it as {causal[0]} would run it as a left-to-right "
            f"decoder, so it is not; {_FROM_PYTHON}"
        )
    return None


def _parameters(fn) -> set[str]:
    import inspect

    return set(inspect.signature(fn).parameters)


class AttachedLM(nn.Module):
    """An attached HF causal LM called as multihead's LMs are: ``model(ids, keep=None, head_mask=None) ->
    logits (B, L, V)``. ``head_mask`` ``(layers, H)`` (or ``(B, layers, H)``) scales each head's output (``hook_z``),
    as multihead's ``head_mask`` does. ``config`` holds what the analyses read: ``max_len``, ``pad_id``,
    ``vocab_size``, ``positional``."""

    def __init__(self, model: nn.Module, pad_id: int):
        super().__init__()
        self.hf = model
        c = model.config
        rotary = getattr(c, "rope_theta", None) is not None or "rope" in str(getattr(c, "rope_scaling", "") or "")
        rotary = rotary or getattr(c, "rotary_pct", None) is not None or getattr(c, "rope_parameters", None)
        self.config = SimpleNamespace(
            max_len=int(getattr(c, "max_position_embeddings", 0) or getattr(c, "n_positions", 0) or 2048),
            pad_id=pad_id,
            vocab_size=int(c.vocab_size),
            positional="rotary" if rotary else "learned",
            model_type=c.model_type,
        )
        # the caches of the generations that decode through multihead's step over HF's weights (hf.lean), each
        # with that view; held weakly (a finished generation's cache is dropped with it)
        self._lean = WeakIdKeyDictionary()
        self.train(model.training)  # the wrapper's mode is the model's (a new module would say training)

    def forward(self, ids: Tensor, keep: Tensor | None = None, head_mask: Tensor | None = None, cache=None) -> Tensor:
        """Logits ``(B, L, V)``. ``cache``: one of :meth:`new_cache`: a
        :class:`~multihead.hf.stream.StreamCache` (HF's own cache is then off and the tokens get the cache's
        positions) or a KV-policy cache (multihead's :class:`~multihead.modules.kv.KVCache`, run through HF's
        cache API: :class:`~multihead.hf.cache.PolicyCache`)."""
        from .attach import attached

        att = attached(self.hf)
        if cache is not None and hasattr(cache, "self_attn"):  # a KV-policy cache: HF's cache API
            return self._policy_forward(ids, keep, head_mask, cache)
        handles = []
        if head_mask is not None:
            for i, rec in enumerate(att.layers.values()):
                scale = head_mask[..., i, :]  # (H,) or (B, H)
                shape = (1, -1, 1, 1) if scale.dim() == 1 else (scale.shape[0], -1, 1, 1)
                scale = scale.reshape(shape)
                handles.append(rec.hook_z.add_hook(lambda z, hook, s=scale: z * s.to(z.dtype)))
        extra = {}
        if cache is not None:
            extra = {"position_ids": cache.positions(ids.shape[1]).to(ids.device), "use_cache": False}
            att.kv = cache
        try:
            return self.hf(input_ids=ids, attention_mask=keep, **extra).logits
        finally:
            att.kv = None
            for h in handles:
                h.remove()

    def new_cache(
        self,
        *,
        window: int | None = None,
        sinks: int = 4,
        policy=None,
        budget: int | None = None,
        record=False,
        extrapolate: bool = False,
        prompt_only: bool = False,
        **options,
    ):
        """A cache for feeding tokens in turn (``extrapolate``: accepted as a native LM's; HF's positions run on as
        far as the model's rotary embedding goes). With ``policy`` (a name of
        :data:`~multihead.modules.kv.KV_POLICIES`), ``budget`` and its options, or ``record=True`` (every key,
        the prompt's scores kept for :meth:`~multihead.modules.kv.KVCache.compress`; a list of policies: what those
        read only): multihead's KV-policy
        cache, as a native model's ``new_cache`` makes it, run through HF's cache API. Otherwise every token
        (``window=None``: positions run on), or the first ``sinks`` plus the last ``window`` (StreamingLLM, positions
        within the cache): a :class:`~multihead.hf.stream.StreamCache`. ``prompt_only``: the policy evicts once,
        after the prompt, then keeps every new token (kvpress's protocol)."""
        if policy is not None or record or budget is not None or options:
            if window is not None:
                raise ValueError("pass a KV policy or a streaming window, not both")
            from .cache import policy_layers

            return policy_layers(self.hf, policy or "full", budget, record=record, prompt_only=prompt_only, **options)
        from .stream import StreamCache

        return StreamCache(self.hf, window=window, sinks=0 if window is None else sinks)

    def prefill(self, ids: Tensor, keep: Tensor | None = None, cache=None):
        """Read the prompt ``ids`` ``(B, L)`` once through ``cache`` (default: every key): the last position's
        logits ``(B, V)`` and the filled cache, as a native LM's ``prefill``. Rows of one length only (a KV-policy
        cache counts positions per call, not per row). With the default cache, a model of a family multihead reads
        is decoded through multihead's own step over HF's weights where nothing needs HF's layers
        (:mod:`multihead.hf.lean`: :func:`~multihead.hf.lean.why_not` says why not); HF's layers otherwise."""
        unpadded = keep is None or bool(keep.all())
        if cache is None and unpadded and lean.why_not(self.hf) is None:
            native = lean.view(self.hf)
            logits, cache = native.prefill(ids)
            self._lean[cache] = native
            return logits, cache
        if not torch.is_grad_enabled():
            fastpath.prepare(self.hf)  # the weights laid out for decoding, once (a no-op off the CPU)
        cache = self.new_cache(policy="full") if cache is None else cache
        if hasattr(cache, "self_attn"):  # a KV-policy cache: the head reads the last position only
            return self._policy_forward(ids, keep, None, cache, last=True)[:, -1], cache
        return self(ids, keep, cache=cache)[:, -1], cache

    def decoding_model(self):
        """multihead's causal LM over this model's own weights (:func:`multihead.hf.lean.view`), whose step decodes
        it where nothing needs HF's layers: what ``fast_decode.compile`` compiles for it. ValueError with the reason
        where there is none (a family multihead does not read, say)."""
        why = lean.why_not_view(self.hf)
        if why is not None:
            raise ValueError(f"this attached model decodes through HF's own layers: {why}")
        return lean.view(self.hf)

    def step(self, tokens: Tensor, cache) -> Tensor:
        """Feed one token per row ``(B,)`` through ``cache``; its logits ``(B, V)`` (as a native LM's ``step``). A
        generation :meth:`prefill` began on multihead's step goes on there until something needs HF's layers (a
        hook added, say); from then on HF's layers read the same cache."""
        native = self._lean.get(cache)
        if native is not None:
            if lean.why_not_step(self.hf) is None:
                return native.step(tokens, cache)
            del self._lean[cache]  # the rest of this generation through HF's layers (their positions are the cache's)
        return self(tokens[:, None], cache=cache)[:, -1]

    def _check_policy(self) -> None:
        """Deprecated spelling of :meth:`check_policy`."""
        import warnings

        warnings.warn("AttachedLM._check_policy is deprecated; use check_policy()", DeprecationWarning, 2)
        self.check_policy()

    def head_layout(self) -> tuple[int, int, int]:
        """``(layers, query heads, key/value heads)`` of the attention layers (the first layer's counts)."""
        from .heads import head_layout

        return head_layout(self.hf)

    def pruned(self, heads: dict[int, list[int]]) -> AttachedLM:
        """A copy with ``heads`` (``{layer: [query heads]}``, whole GQA groups) removed from its weights."""
        from .heads import prune_heads

        clone = self.clone()
        prune_heads(clone.hf, heads)
        return clone

    def why_not_save_pruned(self) -> str | None:
        """Why :meth:`save_pruned` cannot write this model (None: it can)."""
        return None

    def save_pruned(self, folder, *, tokenizer_from=None) -> dict:
        """Write this (pruned) model into ``folder`` as an HF folder of its own architecture, checked against
        plain transformers (:func:`multihead.hf.heads.write_pruned`)."""
        from .heads import write_pruned

        return write_pruned(self.hf, folder, tokenizer_from=tokenizer_from)

    def check_policy(self) -> None:
        """Refuse, before any work, a model whose layers a KV-policy cache cannot follow (with the reason)."""
        from .cache import policy_layers

        policy_layers(self.hf, "full")
        if getattr(self.hf.config, "alibi", False) or self.hf.config.model_type in ("bloom", "mpt"):
            raise ValueError(
                "KV policies keep keys at their original positions, and ALiBi's per-head distances are built into "
                "the mask of the whole call: use a rotary model, or the full cache"
            )

    def _policy_forward(
        self, ids: Tensor, keep: Tensor | None, head_mask: Tensor | None, cache, *, last: bool = False
    ) -> Tensor:
        """The logits of ``ids`` read through the KV-policy cache ``cache`` (HF's cache API, multihead's layers);
        ``last``: the last position's only, where the model's forward takes ``logits_to_keep``."""
        from .cache import PolicyCache, cache_argument

        if head_mask is not None:
            raise ValueError("head_mask and a KV-policy cache do not combine here; mask heads without a cache")
        if keep is not None and not bool(keep.all()):
            raise ValueError(
                "a KV-policy cache reads unpadded rows (each row's positions are its own count); pass rows of one "
                "length, or one row at a time"
            )
        hf_cache = PolicyCache.of(cache, self.hf)
        extra = {"logits_to_keep": 1} if last and "logits_to_keep" in _parameters(self.hf.forward) else {}
        return self.hf(input_ids=ids, use_cache=True, **cache_argument(self.hf, hf_cache), **extra).logits

    def clone(self) -> AttachedLM:
        """An independent copy: the same architecture built from the config, the weights copied in (strictly:
        every tensor), attached with the same backend. ``self`` is untouched, hooks included."""
        import copy

        from transformers import AutoModelForCausalLM

        from .attach import attach, attached

        att = attached(self.hf)
        backend = next(iter(att.layers.values())).backend
        own = att.configs[0][1] if att.configs else None  # the implementation before attaching
        param = next(self.hf.parameters())
        hf = AutoModelForCausalLM.from_config(copy.deepcopy(self.hf.config), attn_implementation=own)
        hf.load_state_dict(self.hf.state_dict(), strict=True)
        hf = hf.to(device=param.device, dtype=param.dtype).eval()
        attach(hf, backend=backend)
        return AttachedLM(hf, self.config.pad_id)

    @property
    def embed(self) -> nn.Module:
        """The token embedding (``weight`` ``(V, E)``), as multihead's LMs name it."""
        return self.hf.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        """The unembedding (``weight`` ``(V, E)``)."""
        return self.hf.get_output_embeddings()

    @torch.no_grad()
    def generate(
        self,
        ids: Tensor,
        *,
        strategy: str = "greedy",
        max_new_tokens: int = 32,
        stop_tokens=(),
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        streamer=None,
    ) -> Tensor:
        """Continue ``ids`` ``(B, L)`` with HF's own ``generate`` loop (its KV cache) running multihead's attention;
        the options are :func:`multihead.models.generation.generate`'s (greedy or sampling), and ``streamer(tokens
        (B,), alive (B,))`` is called with every new token. Returns the new tokens ``(B, n)``."""
        from transformers.generation.streamers import BaseStreamer

        if strategy not in ("greedy", "sample"):
            raise ValueError(f"an attached HF model decodes greedy or sample, not {strategy!r}")

        class Stream(BaseStreamer):
            prompt_seen = False

            def put(self, value) -> None:
                if not self.prompt_seen:  # HF hands the prompt over first
                    self.prompt_seen = True
                    return
                if streamer is not None:
                    tokens = value.view(-1)
                    streamer(tokens, torch.ones_like(tokens, dtype=torch.bool))

            def end(self) -> None:
                pass

        if seed is not None:  # as multihead's sampling: a seed makes it repeatable, none draws a fresh one
            torch.manual_seed(seed)
        fastpath.prepare(self.hf)  # every weight column-major: a decoding step streams them twice as fast here
        sample = strategy == "sample"
        out = self.hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=temperature if sample else None,
            top_k=(top_k or None) if sample else None,
            top_p=top_p if sample else None,
            eos_token_id=list(stop_tokens) or None,
            pad_token_id=self.config.pad_id,
            streamer=Stream(),
        )
        return out[:, ids.shape[1] :]


def _check_files(path: Path, float_params: set[str]) -> None:
    """The folder's weight files, read as headers only before transformers sees them: safetensors only (never a
    pickle), each a regular, whole file whose header agrees with its size (a truncated file, a symlink to a file that
    is no safetensors, or a header claiming more bytes than the file holds are refused here, by name), and no
    integer tensor where the model has a float parameter (a cast would make another model)."""
    from safetensors import safe_open

    from ..pretrained.formats.hf import read_tensors, weight_files

    files = weight_files(path)  # one file, or the shards its index names
    if any(f.suffix == ".bin" for f in files):
        raise AttachError(
            f"{path} holds pytorch_model.bin (a pickle file), which multihead does not open for an attached model; "
            "save the model with save_pretrained(..., safe_serialization=True)"
        )
    read_tensors(path)  # every header parsed and checked against its file's size; refused with the reason
    for f in files:
        with safe_open(str(f), "pt") as h:
            for name in h.keys():
                dtype = h.get_slice(name).get_dtype()
                if dtype in ("F64", "F32", "F16", "BF16"):
                    continue
                if any(p == name or p.endswith("." + name) or name.endswith("." + p) for p in float_params):
                    raise AttachError(
                        f"{f}: {name} is stored as {dtype}, but the model's parameter is a float; integer weights "
                        "are packed or quantised values that a cast would turn into another model: export the "
                        "weights in float32, float16 or bfloat16"
                    )


def _check_loaded(path: Path, model: nn.Module, info: dict, version: str) -> None:
    """The load report of an attached folder, as strict as the native readers': a weight the model expects but the
    files lack (transformers would initialise it at random), a tensor the files hold that the model has no place
    for (ignored otherwise), a shape that did not fit, and any non-finite weight are refused by name."""
    from ..pretrained.state import check_weight

    problems = [
        (what, sorted(map(str, info.get(key) or ())))
        for key, what in (
            ("missing_keys", "missing from the files (it would be initialised at random)"),
            ("unexpected_keys", "in the files but not in the model (it would be ignored)"),
            ("mismatched_keys", "of another shape than the model's"),
        )
    ]
    for what, names in problems:
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise AttachError(
                f"{path}: {shown} {'is' if len(names) == 1 else 'are'} {what}, read by transformers {version}; the "
                "folder does not hold the model its config describes: export it again (save_pretrained)"
            )
    with torch.no_grad():
        for name, p in model.named_parameters():
            check_weight(p, name, path)


def _read_model(path: Path, kind: str, hf: dict, class_name: str, backend: str) -> nn.Module:
    """The folder's model as transformers' class ``class_name`` (one of its own, from its auto tables) builds it,
    attached: the config and the sizes checked before anything is allocated, the weight files as headers, the load
    report as strictly as the native readers'."""
    from .._config import check_size

    import transformers
    from transformers import AutoConfig

    cls = getattr(transformers, class_name)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001  transformers 5 validates with huggingface_hub's own error classes
        raise AttachError(f"{path / 'config.json'}: transformers cannot read it ({str(exc)[:300]})") from None
    with torch.device("meta"):  # sizes first: nothing is allocated for a config that would not fit
        try:
            build = getattr(cls, "from_config", None) or cls._from_config  # an Auto class, or a model class
            skeleton = build(config)
        except Exception as exc:  # noqa: BLE001  (as above: whatever a hostile config makes the constructors raise)
            raise AttachError(
                f"{path / 'config.json'} describes no buildable {kind} model ({str(exc)[:300]})"
            ) from None
    check_size(sum(p.numel() for p in skeleton.parameters()), f"{path} ({kind})")
    why = why_not_skeleton(skeleton)
    if why is not None:
        raise AttachError(f"{path}: {why}")
    _check_files(path, {n for n, p in skeleton.named_parameters() if p.is_floating_point()})
    del skeleton
    from safetensors import SafetensorError

    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a folder of a few files: transformers' per-tensor bar is noise here
    try:
        model, info = cls.from_pretrained(
            path, local_files_only=True, use_safetensors=True, dtype=torch.float32, output_loading_info=True
        )
    except (ValueError, TypeError, KeyError, OSError, RuntimeError, SafetensorError) as exc:
        raise AttachError(f"{path}: transformers cannot read the weights ({str(exc).splitlines()[0][:300]})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    _check_loaded(path, model, info, transformers.__version__)
    with torch.no_grad():  # out of the file's memory map into the process's own: decoding streamed them ~10% slower
        for p in model.parameters():  # (tied parameters are one object: they stay tied)
            p.data = p.data.clone()
    attach(model.eval(), backend=backend)
    return model


def load(path: str | Path, *, backend: str = "auto", device: str = "cpu"):
    """The HF causal-LM folder ``path`` read by transformers (safetensors only), attached, with its tokenizer, as
    a :class:`~multihead.pretrained.causal_lm.PretrainedLM` (family ``hf:<model_type>``)."""
    from ..pretrained.causal_lm import _folder_tokenizer, bundle

    path = Path(path)
    kind, hf = _model_type(path)
    why = _why_not_type(kind, hf)
    if why is not None:
        raise AttachError(f"{path}: {why}")
    tok_info = _folder_tokenizer(path, hf)  # checked against the config before the weights are read
    model = _read_model(path, kind, hf, "AutoModelForCausalLM", backend)
    config = model.config
    pad = getattr(config, "pad_token_id", None)
    wrapper = AttachedLM(model, pad if isinstance(pad, int) and 0 <= pad < config.vocab_size else 0)
    return bundle(str(path), path, wrapper, hf, f"hf:{kind}", tok_info, device)


def load_folder(path: str | Path, *, backend: str = "auto", device: str = "cpu"):
    """Any HF folder multihead reads attached: a causal LM as :func:`load` gives it, an encoder, a
    sequence-to-sequence or a vision model as an :class:`~multihead.hf.models.AttachedFolder` (the model of the
    class its config names, attached, with its tokenizer or its image preprocessing)."""
    from .models import AttachedFolder

    path = Path(path)
    kind, hf = _model_type(path)
    role, named = _role(kind, hf)
    if role is None:
        raise AttachError(f"{path}: {named}")
    if role == "causal":
        return load(path, backend=backend, device=device)
    tokenizer = None if role == "vision" else _text_tokenizer(path, kind)
    model = _read_model(path, kind, hf, named, backend).to(device)
    return AttachedFolder(path, role, model, tokenizer, f"hf:{kind}", hf)


def _text_tokenizer(path: Path, kind: str):
    """The folder's tokenizer, as the ``tokenizers`` library reads ``tokenizer.json`` (with its post-processor: the
    special tokens the model was trained with), or BERT's ``vocab.txt``."""
    from tokenizers import Tokenizer

    if (path / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # noqa: BLE001  the tokenizers library raises plain Exception for a malformed file
            raise AttachError(
                f"{path / 'tokenizer.json'} is not a readable tokenizer file ({str(exc).splitlines()[0][:200]})"
            ) from None
        tok.no_padding()
        tok.no_truncation()
        return tok
    if (path / "vocab.txt").is_file():  # BERT's original files: WordPiece, [CLS] text [SEP]
        from tokenizers.processors import BertProcessing

        from ..pretrained import load_tokenizer

        tok = load_tokenizer(path)
        tok.post_processor = BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
        return tok
    raise AttachError(
        f"{path} has no tokenizer.json (nor a WordPiece vocab.txt), so the {kind} model cannot read text; save "
        "its fast tokenizer into the folder (AutoTokenizer.from_pretrained(...).save_pretrained(folder))"
    )


__all__ = ["AttachedLM", "load", "load_folder", "role_of", "why_not_folder"]
