"""The blocks around an attached model's attention layers (their residual-stream hook points), the final norm,
and the anatomy source ``"hf"`` that every analysis reads. Part of :mod:`multihead.hf.attach`."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ..modules.anatomy import FINAL_NORM_NAMES, MLP_NAMES, Anatomy, blocks_of, child, register_source
from ..modules.anatomy import token_embedding
from ..modules.hooks import HookPoint
from .record import AttachError, Attached, _ATTACHED

# The norm whose input is the residual stream between attention and MLP, per model type: only sequential pre-norm
# blocks have one (parallel blocks such as GPT-NeoX's and Phi's, and post-norm blocks, have no such point).
_MID_NORM = {
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen3", "granite", "phi3", "starcoder2", "persimmon", "stablelm"),
        "post_attention_layernorm",
    ),
    **dict.fromkeys(("gemma2", "gemma3", "gemma3_text"), "pre_feedforward_layernorm"),
    **dict.fromkeys(("gpt2", "gpt_bigcode"), "ln_2"),
    **dict.fromkeys(("opt", "whisper"), "final_layer_norm"),
}


def _block_of(name: str, named: dict[str, nn.Module]) -> str | None:
    """The entry of a layer list holding ``name`` (``model.layers.3``); the outermost one that is a module of its
    own, not a list (T5's ``block.3`` holds a list of sub-layers; PVT's ``block.0`` is a list of a stage's
    layers, whose ``block.0.1`` is the block)."""
    parts = name.split(".")
    containers = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
    for i in range(1, len(parts) + 1):
        parent = ".".join(parts[: i - 1]) if i > 1 else ""
        entry = ".".join(parts[:i])
        if (
            isinstance(named.get(parent), nn.ModuleList)
            and parts[i - 1].isdigit()
            and not isinstance(named.get(entry), containers)
        ):
            return entry
    return None


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _replace_first(x, new):
    return (new, *x[1:]) if isinstance(x, tuple) else new


def _hook_blocks(att: Attached, named: dict[str, nn.Module], model_type: str) -> None:
    """The block hook points around every attached layer (:func:`_hook_block`), each block once."""
    for name in att.layers:
        block = _block_of(name, named)
        if block is None or block in att.blocks:
            continue
        att.blocks.append(block)
        child = name[len(block) + 1 :].split(".")[0] if name != block else None
        _hook_block(att, block, named[block], child, model_type)


def _hook_block(att: Attached, name: str, block: nn.Module, attn_child: str | None, model_type: str) -> None:
    def add(obj: nn.Module, hook: str) -> HookPoint:
        if hook in obj._modules or hasattr(obj, hook):
            raise AttachError(f"{name} already has an attribute {hook!r}; multihead will not overwrite it")
        hp = HookPoint()
        obj.add_module(hook, hp)
        att.added.append((obj, hook))
        return hp

    pre, post = add(block, "hook_resid_pre"), add(block, "hook_resid_post")

    def before(mod, args, kwargs):
        if not pre.active:
            return None
        if args:
            return (pre(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": pre(kwargs["hidden_states"])}
        return None

    def after(mod, args, kwargs, out):
        return _replace_first(out, post(_first(out))) if post.active else None

    att.handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
    att.handles.append(block.register_forward_hook(after, with_kwargs=True))

    def output_hook(child: nn.Module, hook: str) -> None:
        hp = add(block, hook)
        att.handles.append(
            child.register_forward_hook(lambda m, a, out: _replace_first(out, hp(_first(out))) if hp.active else None)
        )

    if attn_child is not None:
        output_hook(block.get_submodule(attn_child), "hook_attn_out")
    mlp = child(block, MLP_NAMES)
    if mlp is not None:
        output_hook(mlp, "hook_mlp_out")
    norm = getattr(block, _MID_NORM.get(model_type, ""), None)
    if isinstance(norm, nn.Module) and not getattr(getattr(block, "config", None), "use_parallel_residual", False):
        mid = add(block, "hook_resid_mid")
        att.handles.append(
            norm.register_forward_pre_hook(lambda m, args: (mid(args[0]), *args[1:]) if mid.active else None)
        )


def final_norm(model: nn.Module) -> nn.Module | None:
    """The norm an HF causal LM applies to the residual stream before its unembedding (None: none found)."""
    base = getattr(model, "base_model", model)
    for name in FINAL_NORM_NAMES:
        m = getattr(base, name, None)
        if isinstance(m, nn.Module) and getattr(m, "weight", None) is not None:
            return m
    return None


def _anatomy(model: nn.Module) -> Anatomy | None:
    """The anatomy source of attached HF models (:mod:`multihead.modules.anatomy`): the layers seen calling HF's
    attention registry, the blocks around them, the final norm and the output embedding. Recognises an attached
    model and multihead's wrappers of one (``.hf``)."""
    hf = getattr(model, "hf", model)
    att = _ATTACHED.get(hf) if isinstance(hf, nn.Module) else None
    if att is None:
        return None
    # names as the model handed in spells them (a wrapper holds the HF model as ``hf``)
    prefix = "" if hf is model else next(n for n, m in model.named_modules() if m is hf) + "."
    sites, blocks = blocks_of(model, [(prefix + n, rec) for n, rec in att.layers.items()], lambda block: None)
    enc, dec = att.probe_lengths.get("input_ids"), att.probe_lengths.get("decoder_input_ids")
    if enc is not None and dec is not None and enc != dec:  # an encoder-decoder: each layer placed by its shapes
        roles = {(enc, enc): "encoder", (dec, dec): "decoder", (dec, enc): "cross"}
        sites = [replace(s, role=roles.get(rec.probe_lengths)) for s, rec in zip(sites, att.layers.values())]
    get = getattr(hf, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return Anatomy(
        "hf",
        hf,
        tuple(sites),
        tuple(blocks),
        token_embedding(model),
        final_norm(hf),
        head if isinstance(head, nn.Module) else None,
    )


register_source("hf", _anatomy)
