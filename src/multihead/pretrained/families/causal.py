"""Model families of pretrained causal LMs: how an HF ``config.json`` becomes our :class:`CausalLMConfig`, and the
name table between HF tensors and our parameters, in both directions (import and export share one table).

Gemma 3 (``model_type`` gemma3_text) has the Llama family's names plus ``pre_feedforward_layernorm`` (-> ``norms.1``)
and the sandwich's ``post_attention_layernorm`` / ``post_feedforward_layernorm`` (-> ``post_norms.0`` / ``.1``); its
norms multiply by ``1 + weight``, ours by ``weight`` (the one is added on import, removed on export).

Llama family (``model_type`` llama, mistral, qwen2, qwen3; HF ``LlamaForCausalLM`` and kin -> ours)::

    model.embed_tokens                      -> embed
    model.layers.{i}.input_layernorm        -> decoder.layers.{i}.norms.0
    model.layers.{i}.self_attn.q_proj       -> decoder.layers.{i}.self_attn.w_q     (k_proj, v_proj, o_proj alike)
    model.layers.{i}.self_attn.q_norm       -> decoder.layers.{i}.self_attn.q_norm  (Qwen3; k_norm alike)
    model.layers.{i}.post_attention_layernorm -> decoder.layers.{i}.norms.1
    model.layers.{i}.mlp.gate_proj          -> decoder.layers.{i}.ffn.w_gate
    model.layers.{i}.mlp.up_proj            -> decoder.layers.{i}.ffn.w_1
    model.layers.{i}.mlp.down_proj          -> decoder.layers.{i}.ffn.w_2
    model.norm                              -> decoder.final_norm
    lm_head                                 -> lm_head (absent when tied)

GPT-2 (``model_type`` gpt2; its ``Conv1D`` weights are stored ``(in, out)``: transposed here, and the fused
``c_attn`` split into q, k, v)::

    transformer.wte / wpe                   -> embed / pos.embedding
    transformer.h.{i}.ln_1 / ln_2           -> decoder.layers.{i}.norms.0 / norms.1
    transformer.h.{i}.attn.c_attn           -> decoder.layers.{i}.self_attn.w_q, w_k, w_v (split, transposed)
    transformer.h.{i}.attn.c_proj           -> decoder.layers.{i}.self_attn.w_o (transposed)
    transformer.h.{i}.mlp.c_fc / c_proj     -> decoder.layers.{i}.ffn.w_1 / w_2 (transposed)
    transformer.ln_f                        -> decoder.final_norm

A new family plugs in here: one :class:`Family` with its config reader, writer and name table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Callable

import torch
from torch import Tensor

from ...models.seq2seq import CausalLM, CausalLMConfig
from ...modules.decoder import DecoderConfig
from ...modules.variants import AttentionConfig
from ..errors import LMError
from . import base


# ---------------------------------------------------------------------------------------------------- helpers
def _int(hf: dict, key: str, default=None, *, low: int = 1) -> int:
    value = hf.get(key, default)
    if value is None:
        raise LMError(f"config.json lacks {key!r}; it is not a complete config of this model family")
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise LMError(f"config.json: {key}={value!r}; it must be an integer >= {low}")
    return value


def _float(hf: dict, key: str, default: float) -> float:
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LMError(f"config.json: {key}={value!r}; it must be a number")
    return float(value)


def _rope(hf: dict, default: float, layer_type: str = "full_attention") -> tuple[float, dict | None]:
    """``(rotary base, rope scaling)`` as either transformers line writes them: 4.x's top-level ``rope_theta`` and
    ``rope_scaling``; 5.x's ``rope_parameters`` (``rope_theta`` and the scaling's own keys beside ``rope_type``), or
    one such dict per layer type (Gemma 3: ``full_attention`` and ``sliding_attention``). Reading only the 4.x keys
    would give a 5.x folder the default base, silently another model."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    if "rope_theta" in hf or not isinstance(params, dict):
        theta = _float(hf, "rope_theta", default)
        scaling = hf.get("rope_scaling")
        if scaling is None and isinstance(params, dict) and params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return theta, scaling
    theta = _float(params, "rope_theta", default)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) == "default" and len(scaling) <= 1:
        scaling = None
    return theta, scaling


def _bool(hf: dict, key: str, default: bool) -> bool:
    value = hf.get(key, default)
    if not isinstance(value, bool):
        raise LMError(f"config.json: {key}={value!r}; it must be true or false")
    return value


def _checked(build: Callable[[], CausalLMConfig]) -> CausalLMConfig:
    """The config, with sizes checked against the ceilings (nothing is allocated before this passes)."""
    from ..._config import check_ranges, check_size

    try:
        config = build()
        check_ranges(config.decoder.attention, "config.json attention")
        check_ranges(config.decoder, "config.json decoder")
        check_ranges(config, "config.json")
        check_size(config.parameter_estimate(), "this model")
    except (ValueError, TypeError) as exc:
        raise LMError(f"config.json: {exc}") from None
    return config


# ---------------------------------------------------------------------------------------------------- Llama family
LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_LLAMA_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_tanh": "geglu"}
_LLAMA_LAYER = [  # HF suffix under model.layers.{i}. -> ours under decoder.layers.{i}.
    ("input_layernorm", "norms.0"),
    ("post_attention_layernorm", "norms.1"),
    ("self_attn.q_proj", "self_attn.w_q"),
    ("self_attn.k_proj", "self_attn.w_k"),
    ("self_attn.v_proj", "self_attn.w_v"),
    ("self_attn.o_proj", "self_attn.w_o"),
    ("self_attn.q_norm", "self_attn.q_norm"),
    ("self_attn.k_norm", "self_attn.k_norm"),
    ("mlp.gate_proj", "ffn.w_gate"),
    ("mlp.up_proj", "ffn.w_1"),
    ("mlp.down_proj", "ffn.w_2"),
]


def llama_config(hf: dict, *, backend: str = "auto") -> CausalLMConfig:
    kind = hf.get("model_type")
    e, heads = _int(hf, "hidden_size"), _int(hf, "num_attention_heads")
    kv = _int(hf, "num_key_value_heads", heads)
    head_dim = hf.get("head_dim")
    if head_dim is not None:
        head_dim = _int(hf, "head_dim")
    elif e % heads:
        raise LMError(
            f"config.json: hidden_size {e} is not divisible by num_attention_heads {heads} and no head_dim is given"
        )
    act = hf.get("hidden_act", "silu")
    if act not in _LLAMA_ACT:
        raise LMError(
            f"config.json: hidden_act {act!r} is not supported for a gated MLP; supported: {sorted(_LLAMA_ACT)}"
        )
    if hf.get("pretraining_tp", 1) not in (1, None):
        raise LMError(
            "config.json: pretraining_tp > 1 (tensor-parallel slices of the MLP) is not supported; "
            "set it to 1 (the weights are the same)"
        )
    max_len = _int(hf, "max_position_embeddings", 4096)
    window = hf.get("sliding_window")
    if window is not None and kind != "mistral" and hf.get("use_sliding_window", False):
        raise LMError(
            "config.json: use_sliding_window with max_window_layers (Qwen2's layer split) is not "
            "supported; set use_sliding_window to false"
        )
    window = _int(hf, "sliding_window") if window is not None and kind == "mistral" else None  # every layer
    # Qwen2 puts biases on q, k, v but not on the output; Llama's attention_bias covers all four
    qkv_bias = True if kind == "qwen2" else _bool(hf, "attention_bias", False)
    out_bias = False if kind == "qwen2" else qkv_bias
    attention = AttentionConfig(
        num_kv_heads=kv, dropout=0.0, backend=backend, head_dim=head_dim, qk_norm=kind == "qwen3"
    )
    decoder = DecoderConfig(
        d_model=e,
        num_heads=heads,
        num_layers=_int(hf, "num_hidden_layers"),
        d_ff=_int(hf, "intermediate_size"),
        dropout=0.0,
        activation=_LLAMA_ACT[act],
        norm_first=True,
        norm="rms",
        layer_norm_eps=_float(hf, "rms_norm_eps", 1e-6),
        bias=qkv_bias,
        out_bias=out_bias,
        ffn_bias=_bool(hf, "mlp_bias", False),
        cross_attention=False,
        attention=attention,
        rope_theta=_rope(hf, 10000.0)[0],
        rope_scaling=_rope(hf, 10000.0)[1],
        sliding_window=window,
    )
    pad = hf.get("pad_token_id")
    pad = hf.get("eos_token_id") if not isinstance(pad, int) else pad
    config = _checked(
        lambda: CausalLMConfig(
            vocab_size=_int(hf, "vocab_size"),
            max_len=max_len,
            positional="rope",
            pad_id=pad if isinstance(pad, int) and pad >= 0 else 0,
            tie_embeddings=_bool(hf, "tie_word_embeddings", False),  # HF default: untied
            decoder=decoder,
        )
    )
    if _float(hf, "partial_rotary_factor", 1.0) != 1.0:  # after the sizes: a huge width is named as such
        raise LMError("config.json: partial_rotary_factor != 1 (rotary on part of each head) is not supported")
    return config


def _layer_names(config: CausalLMConfig, layer: list[tuple[str, str]]) -> dict[str, str]:
    """HF name -> ours for a model with HF's ``model.layers.{i}`` layout and the per-layer table ``layer``."""
    table = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "decoder.final_norm.weight"}
    if not config.tie_embeddings:
        table["lm_head.weight"] = "lm_head.weight"
    for i in range(config.decoder.num_layers):
        for hf, ours in layer:
            for p in ("weight", "bias"):
                table[f"model.layers.{i}.{hf}.{p}"] = f"decoder.layers.{i}.{ours}.{p}"
    return table


def llama_names(config: CausalLMConfig) -> dict[str, str]:
    return _layer_names(config, _LLAMA_LAYER)


def llama_import(tensors: dict[str, Tensor], config: CausalLMConfig) -> dict[str, Tensor]:
    return _rename(tensors, llama_names(config), _LLAMA_IGNORED)


def llama_export(state: dict[str, Tensor], config: CausalLMConfig) -> dict[str, Tensor]:
    back = {ours: hf for hf, ours in llama_names(config).items()}
    return {back[k]: v for k, v in state.items() if k in back}


def llama_hf_config(config: CausalLMConfig, model: CausalLM) -> dict:
    d, a = config.decoder, config.decoder.attention
    first = model.decoder.layers[0].self_attn
    kind = (
        "qwen3"
        if a.qk_norm
        else "qwen2"
        if d.bias and d.out_bias is False
        else "mistral"
        if d.sliding_window is not None
        else "llama"
    )
    hf = {
        "architectures": [
            {
                "llama": "LlamaForCausalLM",
                "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM",
                "mistral": "MistralForCausalLM",
            }[kind]
        ],
        "model_type": kind,
        "hidden_size": d.d_model,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": a.num_kv_heads or d.num_heads,
        "head_dim": first.head_dim,
        "intermediate_size": model.decoder.layers[0].ffn.w_1.out_features,
        "hidden_act": {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}[d.activation],
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": d.layer_norm_eps,
        "rope_theta": d.rope_theta,
        "rope_scaling": d.rope_scaling,
        "tie_word_embeddings": config.tie_embeddings,
        "vocab_size": config.vocab_size,
        "attention_bias": bool(d.bias),
        "mlp_bias": bool(d.bias if d.ffn_bias is None else d.ffn_bias),
        "attention_dropout": 0.0,
        "pad_token_id": config.pad_id,
        "torch_dtype": "float32",
    }
    if kind != "llama":
        hf.pop("attention_bias")
        hf.pop("mlp_bias")
        hf["use_sliding_window"] = False
        hf["sliding_window"] = d.sliding_window
    return hf


def llama_problems(config: CausalLMConfig) -> list[str]:
    d, a = config.decoder, config.decoder.attention
    problems = []
    if config.positional != "rope" or d.norm != "rms" or not d.norm_first:
        problems.append("Llama-layout models have rotary positions, RMSNorm and pre-norm blocks")
    if d.activation not in ("swiglu", "geglu"):
        problems.append(f"activation {d.activation!r} (Llama family: swiglu)")
    if any(getattr(a, n) for n in ("gate", "alibi", "sinks", "differential", "talking_heads", "mla_latent")):
        problems.append("an attention variant HF's Llama family does not have")
    if config.embed_scale or d.sandwich_norm or (d.sliding_window is not None and d.global_every):
        problems.append("scaled embeddings, sandwich norms or local and global layers (Gemma's)")
    if d.sliding_window is not None and (d.bias or a.qk_norm):
        problems.append("a sliding window with Qwen's biases or QK-norm (only Mistral has one)")
    if d.bias and d.out_bias is None:
        pass  # Llama with attention_bias
    elif d.bias and d.out_bias is not False:
        problems.append("biases that match neither Llama nor Qwen2")
    if a.qk_norm and d.bias:
        problems.append("QK-norm with projection biases (Qwen3 has none)")
    return problems


_LLAMA_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias)$")


# ---------------------------------------------------------------------------------------------------- Gemma 3
GEMMA3_TYPES = ("gemma3_text",)
_GEMMA3_LAYER = [  # HF suffix under model.layers.{i}. -> ours under decoder.layers.{i}.
    ("input_layernorm", "norms.0"),
    ("post_attention_layernorm", "post_norms.0"),
    ("pre_feedforward_layernorm", "norms.1"),
    ("post_feedforward_layernorm", "post_norms.1"),
    ("self_attn.q_proj", "self_attn.w_q"),
    ("self_attn.k_proj", "self_attn.w_k"),
    ("self_attn.v_proj", "self_attn.w_v"),
    ("self_attn.o_proj", "self_attn.w_o"),
    ("self_attn.q_norm", "self_attn.q_norm"),
    ("self_attn.k_norm", "self_attn.k_norm"),
    ("mlp.gate_proj", "ffn.w_gate"),
    ("mlp.up_proj", "ffn.w_1"),
    ("mlp.down_proj", "ffn.w_2"),
]


def _global_every(hf: dict, layers: int) -> int:
    """Gemma 3's layer pattern as ``global_every`` (every Nth layer global); other patterns are refused."""
    types = hf.get("layer_types")
    if types is None:
        n = _int(hf, "sliding_window_pattern", 6)
        return n
    if not isinstance(types, list) or len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise LMError("config.json: layer_types must list 'sliding_attention' / 'full_attention' for every layer")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if not full:
        return 0
    n = full[0] + 1
    if full != list(range(n - 1, layers, n)):
        raise LMError(f"config.json: global layers at {full} are not every {n}th layer; only that pattern is supported")
    return n


def gemma3_config(hf: dict, *, backend: str = "auto") -> CausalLMConfig:
    e, heads = _int(hf, "hidden_size"), _int(hf, "num_attention_heads")
    layers = _int(hf, "num_hidden_layers")
    head_dim = _int(hf, "head_dim", 256)
    act = hf.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise LMError(f"config.json: hidden_activation {act!r} is not supported (Gemma 3: gelu_pytorch_tanh)")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if hf.get(key) is not None:
            raise LMError(f"config.json: {key}={hf[key]} (logit soft-capping) is not supported")
    if hf.get("use_bidirectional_attention"):
        raise LMError("config.json: use_bidirectional_attention=true (an embedding model) is not supported")
    if _float(hf, "query_pre_attn_scalar", head_dim) != head_dim:
        raise LMError(
            f"config.json: query_pre_attn_scalar={hf['query_pre_attn_scalar']} differs from head_dim "
            f"{head_dim}; only the 1/sqrt(head_dim) scale is supported"
        )
    attention = AttentionConfig(
        num_kv_heads=_int(hf, "num_key_value_heads", heads),
        dropout=0.0,
        backend=backend,
        head_dim=head_dim,
        qk_norm=True,
    )
    window = hf.get("sliding_window")
    decoder = DecoderConfig(
        d_model=e,
        num_heads=heads,
        num_layers=layers,
        d_ff=_int(hf, "intermediate_size"),
        dropout=0.0,
        activation="geglu",
        norm_first=True,
        norm="rms",
        layer_norm_eps=_float(hf, "rms_norm_eps", 1e-6),
        bias=_bool(hf, "attention_bias", False),
        ffn_bias=False,
        cross_attention=False,
        attention=attention,
        rope_theta=_rope(hf, 1e6)[0],
        rope_scaling=_rope(hf, 1e6)[1],
        sandwich_norm=True,
        sliding_window=None if window is None else _int(hf, "sliding_window"),
        global_every=_global_every(hf, layers) if window is not None else 0,
        rope_local_theta=(
            _float(hf, "rope_local_base_freq", 10000.0)
            if "rope_local_base_freq" in hf or not isinstance(hf.get("rope_parameters"), dict)
            else _rope(hf, 10000.0, "sliding_attention")[0]
        ),
    )
    pad = hf.get("pad_token_id", 0)
    return _checked(
        lambda: CausalLMConfig(
            vocab_size=_int(hf, "vocab_size"),
            max_len=_int(hf, "max_position_embeddings", 32768),
            positional="rope",
            pad_id=pad if isinstance(pad, int) and pad >= 0 else 0,
            embed_scale=True,
            tie_embeddings=_bool(hf, "tie_word_embeddings", True),
            decoder=decoder,
        )
    )


def gemma3_names(config: CausalLMConfig) -> dict[str, str]:
    return _layer_names(config, _GEMMA3_LAYER)


def _is_norm(name: str) -> bool:
    return name.endswith(("norm.weight", "layernorm.weight"))


def gemma3_import(tensors: dict[str, Tensor], config: CausalLMConfig) -> dict[str, Tensor]:
    """Gemma's RMSNorm multiplies by ``1 + weight``; ours by ``weight``: the one is added here (and taken off on
    export), in float32 as HF adds it at run time."""
    table = gemma3_names(config)
    out = _rename(tensors, table, _LLAMA_IGNORED)
    back = {v: k for k, v in table.items()}
    return {k: (v.float() + 1.0 if _is_norm(back[k]) else v) for k, v in out.items()}


def gemma3_export(state: dict[str, Tensor], config: CausalLMConfig) -> dict[str, Tensor]:
    back = {ours: hf for hf, ours in gemma3_names(config).items()}
    return {back[k]: (v - 1.0 if _is_norm(back[k]) else v) for k, v in state.items() if k in back}


def gemma3_hf_config(config: CausalLMConfig, model: CausalLM) -> dict:
    d, a = config.decoder, config.decoder.attention
    n = d.global_every
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": d.d_model,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": a.num_kv_heads or d.num_heads,
        "head_dim": model.decoder.layers[0].self_attn.head_dim,
        "query_pre_attn_scalar": model.decoder.layers[0].self_attn.head_dim,
        "intermediate_size": model.decoder.layers[0].ffn.w_1.out_features,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": d.layer_norm_eps,
        "rope_theta": d.rope_theta,
        "rope_local_base_freq": d.rope_local_theta or d.rope_theta,
        "rope_scaling": d.rope_scaling,
        "sliding_window": d.sliding_window,
        "tie_word_embeddings": config.tie_embeddings,
        "layer_types": ["full_attention" if not d.is_local(i) else "sliding_attention" for i in range(d.num_layers)]
        if n or d.sliding_window
        else None,
        "vocab_size": config.vocab_size,
        "attention_bias": bool(d.bias),
        "pad_token_id": config.pad_id,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "torch_dtype": "float32",
    }


def gemma3_problems(config: CausalLMConfig) -> list[str]:
    d, a = config.decoder, config.decoder.attention
    if not (config.embed_scale and d.sandwich_norm and a.qk_norm and d.activation == "geglu" and d.norm == "rms"):
        return ["Gemma 3 has scaled embeddings, sandwich norms, QK-norm and GeGLU"]
    return []


# ---------------------------------------------------------------------------------------------------- GPT-2
_GPT2_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_GPT2_IGNORED = re.compile(r"(\.attn\.bias|\.attn\.masked_bias)$")


def gpt2_config(hf: dict, *, backend: str = "auto") -> CausalLMConfig:
    e, heads = _int(hf, "n_embd"), _int(hf, "n_head")
    if e % heads:
        raise LMError(f"config.json: n_embd {e} is not divisible by n_head {heads}")
    act = hf.get("activation_function", "gelu_new")
    if act not in _GPT2_ACT:
        raise LMError(f"config.json: activation_function {act!r} is not supported; supported: {sorted(_GPT2_ACT)}")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise LMError(f"config.json: {flag}=true is not supported (GPT-2 as released has it off)")
    if not _bool(hf, "scale_attn_weights", True):
        raise LMError("config.json: scale_attn_weights=false (unscaled dot products) is not supported")
    inner = hf.get("n_inner")
    decoder = DecoderConfig(
        d_model=e,
        num_heads=heads,
        num_layers=_int(hf, "n_layer"),
        d_ff=4 * e if inner is None else _int(hf, "n_inner"),
        dropout=_float(hf, "resid_pdrop", 0.1),
        activation=_GPT2_ACT[act],
        norm_first=True,
        norm="layer",
        layer_norm_eps=_float(hf, "layer_norm_epsilon", 1e-5),
        bias=True,
        cross_attention=False,
        attention=AttentionConfig(dropout=0.0, backend=backend),
    )
    pad = hf.get("pad_token_id", hf.get("eos_token_id", 0))
    return _checked(
        lambda: CausalLMConfig(
            vocab_size=_int(hf, "vocab_size"),
            max_len=_int(hf, "n_positions", hf.get("n_ctx", 1024)),
            positional="learned",
            pad_id=pad if isinstance(pad, int) and pad >= 0 else 0,
            tie_embeddings=_bool(hf, "tie_word_embeddings", True),
            decoder=decoder,
        )
    )


def _gpt2_key(name: str) -> str:
    return name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"  # GPT2Model: no prefix


def gpt2_import(tensors: dict[str, Tensor], config: CausalLMConfig) -> dict[str, Tensor]:
    e = config.decoder.d_model
    out = {}
    for raw, t in tensors.items():
        name = _gpt2_key(raw)
        if _GPT2_IGNORED.search(name):
            continue
        if name == "lm_head.weight" and config.tie_embeddings:
            continue  # the tied copy of wte
        m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)\.(weight|bias)", name)
        if name in (
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "transformer.ln_f.weight",
            "transformer.ln_f.bias",
            "lm_head.weight",
        ):
            out[
                {
                    "transformer.wte.weight": "embed.weight",
                    "transformer.wpe.weight": "pos.embedding.weight",
                    "transformer.ln_f.weight": "decoder.final_norm.weight",
                    "transformer.ln_f.bias": "decoder.final_norm.bias",
                    "lm_head.weight": "lm_head.weight",
                }[name]
            ] = t
        elif m is not None and int(m.group(1)) < config.decoder.num_layers:
            i, part, p = int(m.group(1)), m.group(2), m.group(3)
            ours = f"decoder.layers.{i}."
            if part in ("ln_1", "ln_2"):
                out[f"{ours}norms.{0 if part == 'ln_1' else 1}.{p}"] = t
            elif part == "attn.c_attn":
                _expect(raw, t, (e, 3 * e) if p == "weight" else (3 * e,))
                parts = (t.t() if p == "weight" else t).split(e, dim=0)  # (3E, E) -> 3 x (E, E)
                for w, piece in zip(("w_q", "w_k", "w_v"), parts):
                    out[f"{ours}self_attn.{w}.{p}"] = piece.contiguous()
            elif part in ("attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                target = {"attn.c_proj": "self_attn.w_o", "mlp.c_fc": "ffn.w_1", "mlp.c_proj": "ffn.w_2"}[part]
                out[f"{ours}{target}.{p}"] = t.t().contiguous() if p == "weight" else t
            else:
                raise _unexpected(raw, t, config)
        else:
            raise _unexpected(raw, t, config)
    return out


def gpt2_export(state: dict[str, Tensor], config: CausalLMConfig) -> dict[str, Tensor]:
    out = {
        "transformer.wte.weight": state["embed.weight"],
        "transformer.wpe.weight": state["pos.embedding.weight"],
        "transformer.ln_f.weight": state["decoder.final_norm.weight"],
        "transformer.ln_f.bias": state["decoder.final_norm.bias"],
    }
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(config.decoder.num_layers):
        ours, hf = f"decoder.layers.{i}.", f"transformer.h.{i}."
        for n, part in ((0, "ln_1"), (1, "ln_2")):
            for p in ("weight", "bias"):
                out[f"{hf}{part}.{p}"] = state[f"{ours}norms.{n}.{p}"]
        out[f"{hf}attn.c_attn.weight"] = (
            torch.cat([state[f"{ours}self_attn.{w}.weight"] for w in ("w_q", "w_k", "w_v")]).t().contiguous()
        )
        out[f"{hf}attn.c_attn.bias"] = torch.cat([state[f"{ours}self_attn.{w}.bias"] for w in ("w_q", "w_k", "w_v")])
        for part, target in (("attn.c_proj", "self_attn.w_o"), ("mlp.c_fc", "ffn.w_1"), ("mlp.c_proj", "ffn.w_2")):
            out[f"{hf}{part}.weight"] = state[f"{ours}{target}.weight"].t().contiguous()
            out[f"{hf}{part}.bias"] = state[f"{ours}{target}.bias"]
    return out


def gpt2_hf_config(config: CausalLMConfig, model: CausalLM) -> dict:
    d = config.decoder
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": d.d_model,
        "n_head": d.num_heads,
        "n_layer": d.num_layers,
        "n_inner": model.decoder.layers[0].ffn.w_1.out_features,
        "n_positions": config.max_len,
        "n_ctx": config.max_len,
        "vocab_size": config.vocab_size,
        "activation_function": {v: k for k, v in _GPT2_ACT.items() if k != "gelu_pytorch_tanh"}[d.activation],
        "layer_norm_epsilon": d.layer_norm_eps,
        "resid_pdrop": d.dropout,
        "embd_pdrop": d.dropout,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": "float32",
    }


def gpt2_problems(config: CausalLMConfig) -> list[str]:
    d, a = config.decoder, config.decoder.attention
    problems = []
    if config.positional != "learned" or d.norm != "layer" or not d.norm_first or not d.bias:
        problems.append("GPT-2 has learned positions, LayerNorm, pre-norm blocks and biases")
    if config.embed_scale or d.sandwich_norm or d.sliding_window is not None:
        problems.append("scaled embeddings, sandwich norms or sliding-window layers")
    if d.activation not in ("gelu_tanh", "gelu", "relu"):
        problems.append(f"activation {d.activation!r}")
    if (a.num_kv_heads or d.num_heads) != d.num_heads or a.head_dim or a.qk_norm:
        problems.append("grouped-query attention, a head_dim of its own or QK-norm")
    if any(getattr(a, n) for n in ("gate", "alibi", "sinks", "differential", "talking_heads", "mla_latent")):
        problems.append("an attention variant GPT-2 does not have")
    return problems


# ---------------------------------------------------------------------------------------------------- the table
def _expect(name: str, t, shape: tuple) -> None:
    if tuple(t.shape) != shape:
        raise LMError(
            f"tensor {name!r} has shape {tuple(t.shape)} but config.json implies {shape}; config.json and "
            "the weights disagree"
        )


def _unexpected(name: str, t, config: CausalLMConfig) -> LMError:
    return LMError(
        f"unexpected tensor {name!r} {tuple(t.shape)}: not part of a {config.decoder.num_layers}-layer "
        "model of this family; config.json and the weights disagree"
    )


def _rename(tensors: dict[str, Tensor], table: dict[str, str], ignored: re.Pattern) -> dict[str, Tensor]:
    out = {}
    for name, t in tensors.items():
        if name in table:
            out[table[name]] = t
        elif ignored.search(name):
            continue
        elif name == "lm_head.weight":  # a tied checkpoint that stores the copy anyway
            continue
        else:
            raise LMError(
                f"unexpected tensor {name!r} {tuple(t.shape)}: not part of the model config.json "
                "describes; config.json and the weights disagree"
            )
    return out


@dataclass(frozen=True)
class LMFamily:
    """One causal-LM family: reads its ``config.json`` (``config``), renames tensors both ways, writes the config
    back, and says why a model of ours cannot be written in its layout (``problems``)."""

    name: str
    model_types: tuple[str, ...]
    config: Callable[..., CausalLMConfig]
    to_ours: Callable[[dict, CausalLMConfig], dict]
    to_hf: Callable[[dict, CausalLMConfig], dict]
    hf_config: Callable[[CausalLMConfig, CausalLM], dict]
    problems: Callable[[CausalLMConfig], list]
    title: str = ""
    gguf: bool = True  # read from GGUF files (multihead's GGUF reader maps this architecture)

    def expected_hf(self, config: CausalLMConfig) -> dict[str, tuple[int, ...]]:
        """HF tensor names and shapes of the model ``config`` describes (meta device: nothing allocated)."""
        from ..._weights import unique_state

        with torch.device("meta"):
            model = CausalLM(config)
        return {k: tuple(v.shape) for k, v in self.to_hf(unique_state(model), config).items()}

    def as_family(self) -> base.Family:
        """This family at the model-source seam: read from HF folders and (Llama, Gemma 3) GGUF files."""
        hf = base.Adapter(
            self.to_ours,
            self.expected_hf,
            canonical=_gpt2_file_name if self.name == "gpt2" else base._same,
            ignored=_FILE_IGNORED,
            tolerated=("lm_head.weight",),  # a tied checkpoint that stores the copy anyway
        )
        adapters = {"hf": hf, "gguf": base.Adapter(self.to_ours, self.expected_hf)} if self.gguf else {"hf": hf}
        why_not = {
            "onnx": "the ONNX reader recognises HF Dinov2Model graphs only",
            "ct2": "CTranslate2 folders are read for Whisper only",
        }
        if not self.gguf:
            why_not["gguf"] = "multihead's GGUF reader maps the llama and gemma3 architectures only"
        return base.Family(
            self.name,
            "lm",
            self.title,
            self.model_types,
            self.config,
            CausalLM,
            adapters,
            why_not,
            error=LMError,
            loader="causal_lm:load",
        )


_FILE_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.attn\.bias|\.attn\.masked_bias)$")


def _gpt2_file_name(k: str) -> str:
    """GPT-2 checkpoints store the model with or without its ``transformer.`` prefix."""
    return k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"


FAMILIES = {
    "llama": LMFamily(
        "llama",
        LLAMA_TYPES,
        llama_config,
        llama_import,
        llama_export,
        llama_hf_config,
        llama_problems,
        "a Llama-family causal LM (Llama, Mistral, Qwen2, Qwen3)",
    ),
    "gpt2": LMFamily(
        "gpt2",
        ("gpt2",),
        gpt2_config,
        gpt2_import,
        gpt2_export,
        gpt2_hf_config,
        gpt2_problems,
        "a GPT-2 model",
        gguf=False,
    ),
    "gemma3": LMFamily(
        "gemma3",
        GEMMA3_TYPES,
        gemma3_config,
        gemma3_import,
        gemma3_export,
        gemma3_hf_config,
        gemma3_problems,
        "a Gemma 3 text model",
    ),
}
Family = LMFamily  # the name this table's class had
_WHY_NOT = {
    "gemma": "Gemma scales embeddings by sqrt(d) and offsets its norms by one; not supported yet",
    "gemma2": "Gemma 2 soft-caps its logits and alternates sliding-window layers; not supported yet",
    "phi3": "Phi-3 fuses qkv and gate/up projections; not supported yet",
    "gpt_neox": "GPT-NeoX uses parallel attention/MLP blocks and partial rotary; not supported yet",
    "bert": "BERT is an encoder: load it with multihead.pretrained.load (or any command that takes minilm)",
}


def family_of(hf: dict) -> Family:
    kind = hf.get("model_type")
    for family in FAMILIES.values():
        if kind in family.model_types:
            return family
    known = sorted(t for f in FAMILIES.values() for t in f.model_types)
    why = _WHY_NOT.get(kind, "")
    raise LMError(
        f"model_type {kind!r} is not a supported causal LM"
        + (f" ({why})" if why else "")
        + f"; supported model types: {', '.join(known)}"
    )


def family_for_model(config: CausalLMConfig) -> Family:
    """The family whose HF layout can hold ``config`` (refused, with every reason, when none can)."""
    reasons = {}
    for family in FAMILIES.values():
        problems = family.problems(config)
        if not problems:
            return family
        reasons[family.name] = problems
    raise LMError("this model fits no HF layout: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in reasons.items()))


__all__ = ["FAMILIES", "Family", "LMError", "LMFamily", "family_for_model", "family_of"]
