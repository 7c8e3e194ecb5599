"""TransformerLens's habits on multihead's models: a notebook written for TransformerLens runs with its import and
its model line changed.

::

    from multihead.interpret.causal.lens import HookedTransformer, utils   # was: from transformer_lens import ...
    model = HookedTransformer.from_pretrained("smollm2")            # a native LM, an HF folder, hf:FOLDER (attached)

    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    cache["pattern", 3]                                              # (batch, head, query, key)
    model.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(utils.get_act_name("z", 0), ablate)])

What carries over: TransformerLens's hook names (``blocks.{L}.hook_resid_pre``, ``hook_resid_mid``,
``hook_attn_out``, ``hook_mlp_out``, ``hook_resid_post``; ``blocks.{L}.attn.hook_q/k/v/z/pattern``) as aliases of
the model's own hook points; its tensor layout (``q/k/v/z``: ``(batch, pos, head, d_head)``; multihead's own is
``(batch, head, pos, d_head)``: ``layout="multihead"`` keeps it); ``run_with_hooks(fwd_hooks=[(name or filter,
fn)])`` with ``fn(activation, hook)`` reading ``hook.name`` and ``hook.layer()`` and returning a replacement or None;
``run_with_cache(names_filter=..., remove_batch_dim=..., device=..., return_cache_object=...)``; the forward's
``return_type`` (``"logits"``, ``"loss"``, ``"both"`` or None), ``loss_per_token``, ``prepend_bos`` and
``stop_at_layer``; ``cache["pattern", 0, "attn"]``; ``cfg.n_layers``, ``n_heads``, ``d_head``, ``d_model``,
``d_vocab``, ``device``; ``to_tokens``, ``to_str_tokens``, ``to_single_token``, ``to_string`` (special tokens spelled
out), ``get_token_position``, ``loss_fn``, ``generate``; ``utils.get_act_name`` (TransformerLens's spelling rules:
``"k6"``, ``"attn"`` for the pattern, ``"in"``), ``utils.test_prompt``, ``utils.get_device`` and ``utils.to_numpy``.
TransformerLens 4's bridge names of the same points (``blocks.L.hook_in`` for ``hook_resid_pre``, ``hook_out``,
``ln2.hook_in``, ``attn.hook_out``, ``mlp.hook_out``, ``attn.q/k/v.hook_out``, ``attn.o.hook_in`` for ``hook_z``,
``embed.hook_out``) reach the same points, and a hook is told the name it was attached by, so ``clean_cache[hook.name]``
finds it. An option TransformerLens has and this layer does not take
(``fold_ln``, ``pos_slice``, ``start_at_layer``, ...) is refused by name with what to do instead, and a keyword
TransformerLens does not have either is refused as unknown: nothing is silently ignored. ``from_pretrained`` reads
the weights as they are (TransformerLens's ``from_pretrained_no_processing``), so the logits are the model's own.

The cache stacks the residual stream as TransformerLens's ``ActivationCache`` does: ``accumulated_resid`` (the
logit lens, with ``apply_ln``), ``decompose_resid`` (``embed``, then each layer's ``attn_out`` and ``mlp_out``) and
``apply_ln_to_stack`` at the final norm, with ``pos_slice``; ``model.W_U``, ``b_U``, ``W_E``, ``final_norm`` and
``tokens_to_residual_directions`` (and ``model.unembed.W_U``, ``model.embed.W_E``) are there for direct logit
attribution, and ``stack_head_results`` splits each layer's attention output into its heads' ``z_h W_O^h``. A native block has no point between its
two residual additions: its ``resid_mid`` in a cache is ``resid_pre + attn_out``, the same sum its forward makes.

What does not (yet): the weight aliases of the blocks (``W_Q``, ``W_O``...), ``FactoredMatrix`` and ``model.OV``,
the hook points inside the norms, the rotary embedding and the MLP (``ln1.hook_scale``, ``attn.hook_attn_scores``,
``mlp.hook_pre``),
``apply_ln_to_stack`` at a block's own norm, backward hooks, and a hook name the model has no point for: asked for,
each is refused with the reason. Hooks are attached for one call and removed after it, whatever happens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...modules.anatomy import anatomy
from ...modules.hooks import hook_points

LAYOUTS = ("transformer_lens", "multihead")
_PER_HEAD = ("hook_q", "hook_k", "hook_v", "hook_z")  # (B, H, L, D) here, (B, L, H, D) in TransformerLens
_BLOCK = ("hook_resid_pre", "hook_resid_mid", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
_ATTN = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_pattern")


class _Stopped(Exception):  # noqa: N818  (a signal, not an error: the forward stopped at stop_at_layer)
    def __init__(self, residual: Tensor) -> None:
        super().__init__("stopped")
        self.residual = residual


# TransformerLens options this layer does not take, with why (what to do instead); anything else is not TL's
_FORWARD = {
    "start_at_layer": "start from a residual stream with run_with_hooks on blocks.L.hook_resid_pre instead",
    "shortformer_pos_embed": "the models here add their positions themselves (rotary or learned)",
    "past_kv_cache": "decode with model.generate (the model's own cache) instead",
    "attention_mask": "pass rows of one length (to_tokens refuses texts of different lengths)",
    "padding_side": "pass rows of one length (to_tokens refuses texts of different lengths)",
    "tokens": "pass the token ids as the first argument",
}
_FORWARD_NAMES = ("loss_per_token", "prepend_bos", "stop_at_layer")
_RUN_WITH_CACHE = {
    **_FORWARD,
    "incl_bwd": "backward hooks are not supported here; read gradients with torch.autograd.grad",
    "pos_slice": "slice the cached tensors, or use the cache's accumulated_resid/decompose_resid(pos_slice=...)",
    "reset_hooks_end": "hooks here are attached for one call and always removed after it",
    "clear_contexts": "hooks here are attached for one call and always removed after it",
}
_FROM_PRETRAINED = {
    "fold_ln": "the weights are read as they are (from_pretrained_no_processing); the logits are the model's own",
    "center_writing_weights": "the weights are read as they are (from_pretrained_no_processing)",
    "center_unembed": "the weights are read as they are (from_pretrained_no_processing); the logits are not centred",
    "fold_value_biases": "the weights are read as they are (from_pretrained_no_processing)",
    "refactor_factored_attn_matrices": "the weights are read as they are (from_pretrained_no_processing)",
    "hf_model": "attach an HF model with multihead.hf.attach and pass it to HookedTransformer(model, tokenizer)",
    "tokenizer": "pass the tokenizer to HookedTransformer(model, tokenizer)",
    "n_devices": "one device here: pass device=",
    "move_to_device": "pass device= (the model moves there)",
    "default_prepend_bos": "pass prepend_bos= to each call",
    "default_padding_side": "pass rows of one length",
    "first_n_layers": "read the whole model; stop a forward early with stop_at_layer=",
    "checkpoint_index": "one checkpoint: the files the source names",
    "checkpoint_value": "one checkpoint: the files the source names",
}
_GENERATE = {
    "use_past_kv_cache": "the model's own cache is always used",
    "padding_side": "pass rows of one length",
    "freq_penalty": "not implemented here; sample with temperature, top_k and top_p",
}


def _refuse(options: dict, call: str, known: dict[str, str]) -> None:
    """Refuse ``options`` that ``call`` does not take: TransformerLens's own with why, others as unknown."""
    for name in options:
        if name in known:
            raise ValueError(f"{call}({name}=...) is TransformerLens's and not taken here: {known[name]}")
        raise ValueError(f"{call}() takes no option {name!r} (TransformerLens has none by that name either)")


# TransformerLens 4's own names for the same points (its TransformerBridge calls a hook by these inside the hook:
# ``hook.name`` is ``blocks.3.hook_in`` for ``blocks.3.hook_resid_pre``), and the classic name each one is here
_BRIDGE_NAMES = (
    (r"blocks\.(\d+)\.hook_in", r"blocks.\1.hook_resid_pre"),
    (r"blocks\.(\d+)\.hook_out", r"blocks.\1.hook_resid_post"),
    (r"blocks\.(\d+)\.ln2\.hook_in", r"blocks.\1.hook_resid_mid"),
    (r"blocks\.(\d+)\.attn\.hook_out", r"blocks.\1.hook_attn_out"),
    (r"blocks\.(\d+)\.mlp\.hook_out", r"blocks.\1.hook_mlp_out"),
    (r"blocks\.(\d+)\.attn\.([qkv])\.hook_out", r"blocks.\1.attn.hook_\2"),
    (r"blocks\.(\d+)\.attn\.o\.hook_in", r"blocks.\1.attn.hook_z"),
    (r"embed\.hook_out", "hook_embed"),
)


def canonical(name: str) -> str:
    """The classic TransformerLens name of ``name``: TransformerLens 4's bridge names (``blocks.L.hook_in``,
    ``blocks.L.hook_out``, ``blocks.L.attn.o.hook_in``, ...) as ``hook_resid_pre``, ``hook_resid_post``,
    ``attn.hook_z``, ...; any other name as it is."""
    for pattern, classic in _BRIDGE_NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, classic, name)
    return name


class utils:  # noqa: N801  (TransformerLens's module name: ``utils.get_act_name``)
    _NAME_ALIASES = {
        "attn": "pattern",
        "attn_logits": "attn_scores",
        "key": "k",
        "query": "q",
        "value": "v",
        "mlp_pre": "pre",
        "mlp_mid": "mid",
        "mlp_post": "post",
    }
    _TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}

    @staticmethod
    def get_act_name(name: str, layer: int | str | None = None, layer_type: str | None = None) -> str:
        """TransformerLens's short names, spelled as TransformerLens spells them: ``get_act_name("z", 3) ==
        "blocks.3.attn.hook_z"``, ``get_act_name("k6") == "blocks.6.attn.hook_k"``, ``get_act_name("attn", 0)`` is the
        pattern, ``get_act_name("in", 2) == "blocks.2.hook_in"`` (TransformerLens 4's name of ``hook_resid_pre``); a
        full name comes back as it is. Whether the model has the point is checked where the name is used."""
        if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
            return name
        split = re.match(r"([a-z]+)(\d+)([a-z]?.*)", name)
        if split is not None:
            name, layer, layer_type = split.group(1), int(split.group(2)), split.group(3) or None
        name = utils._NAME_ALIASES.get(name, name)
        if name in ("k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores"):
            layer_type = "attn"
        elif name in ("pre", "post", "mid", "pre_linear"):
            layer_type = "mlp"
        elif layer_type in utils._TYPE_ALIASES:
            layer_type = utils._TYPE_ALIASES[layer_type]
        full = (f"blocks.{layer}." if layer is not None else "") + (f"{layer_type}." if layer_type else "")
        full += f"hook_{name}"
        if name in ("scale", "normalized") and layer is None:
            full = f"ln_final.{full}"
        return full

    @staticmethod
    def get_device() -> str:
        """The device TransformerLens would pick, by name: ``"cuda"`` where there is one, else ``"cpu"`` (Apple's
        MPS only when ``TRANSFORMERLENS_ALLOW_MPS=1``, as TransformerLens chooses)."""
        import os

        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available() and os.environ.get("TRANSFORMERLENS_ALLOW_MPS", "") == "1":
            return "mps"
        return "cpu"

    @staticmethod
    def to_numpy(tensor):
        """A tensor (or a list of them, or a number) as a NumPy array, detached and on the CPU."""
        import numpy as np

        if isinstance(tensor, Tensor):
            return tensor.detach().cpu().numpy()
        if isinstance(tensor, (list, tuple)):
            return np.array([utils.to_numpy(t) for t in tensor])
        return np.array(tensor)

    @staticmethod
    def test_prompt(
        prompt: str,
        answer: str | list[str],
        model: HookedTransformer,
        prepend_space_to_answer: bool = True,
        print_details: bool = True,
        prepend_bos: bool | None = None,
        top_k: int = 10,
    ) -> list[tuple[str, int]]:
        """TransformerLens's ``utils.test_prompt``: how the model ranks each token of ``answer`` after ``prompt``
        (printed as TransformerLens prints it: the tokens, each answer token's rank, logit and probability, and the
        ``top_k`` tokens at each answer position). Returns ``[(answer token, rank)]``."""
        answers = [answer] if isinstance(answer, str) else list(answer)
        bos = True if prepend_bos is None else prepend_bos
        ranks: list[tuple[str, int]] = []
        for text in answers:
            text = (" " + text.lstrip()) if prepend_space_to_answer else text
            prompt_ids = model.to_tokens(prompt, prepend_bos=bos)
            answer_ids = model.to_tokens(text, prepend_bos=False)
            ids = torch.cat([prompt_ids, answer_ids], 1)
            with torch.no_grad():
                logits = model(ids)[0].float()
            if print_details:
                print("Tokenized prompt:", model.to_str_tokens(prompt_ids[0]))
                print("Tokenized answer:", model.to_str_tokens(answer_ids[0]))
            for i, token in enumerate(answer_ids[0].tolist()):
                row = logits[prompt_ids.shape[1] - 1 + i]
                probs = row.softmax(-1)
                rank = int((row > row[token]).sum())
                shown = model.tokenizer.decode([token])
                ranks.append((shown, rank))
                if print_details:
                    print(
                        f"Performance on answer token:\nRank: {rank:<8} Logit: {row[token]:5.2f} Prob: "
                        f"{probs[token]:6.2%} Token: |{shown}|"
                    )
                    for k, t in enumerate(row.topk(top_k).indices.tolist()):
                        print(
                            f"Top {k}th token. Logit: {row[t]:5.2f} Prob: {probs[t]:6.2%} Token: "
                            f"|{model.tokenizer.decode([t])}|"
                        )
        if print_details:
            print("Ranks of the answer tokens:", ranks)
        return ranks


@dataclass
class Hook:
    """What a hook function gets as ``hook``: the TransformerLens name and its layer."""

    name: str

    def layer(self) -> int:
        found = re.match(r"blocks\.(\d+)\.", self.name)
        if found is None:
            raise ValueError(f"{self.name} is not inside a block")
        return int(found.group(1))


HookPoint = Hook  # TransformerLens's name for what a hook function gets (its notebooks annotate with it)


@dataclass
class Config:
    """TransformerLens's ``cfg`` fields that analyses read."""

    n_layers: int
    n_heads: int
    n_key_value_heads: int
    d_head: int
    d_model: int
    d_vocab: int
    n_ctx: int
    device: torch.device = torch.device("cpu")


def _sliced(t: Tensor, pos_slice, dim: int = -2) -> Tensor:
    """TransformerLens's ``Slice``: None keeps the axis, an int picks one position (the axis goes), a tuple is a
    ``slice(*tuple)``, a list or tensor picks those positions."""
    if pos_slice is None:
        return t
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    elif isinstance(pos_slice, (list, Tensor)):
        pos_slice = torch.as_tensor(pos_slice)
    index = [slice(None)] * t.dim()
    index[dim] = pos_slice
    return t[tuple(index)]


class LensCache(dict):
    """Activations by TransformerLens name; ``cache["pattern", 3]`` is ``cache["blocks.3.attn.hook_pattern"]``.
    From :meth:`HookedTransformer.run_with_cache`, it also stacks the residual stream as TransformerLens's
    ``ActivationCache`` does (:meth:`accumulated_resid`, :meth:`decompose_resid`, :meth:`apply_ln_to_stack`)."""

    model: HookedTransformer | None = None

    def __getitem__(self, key):
        if isinstance(key, tuple):
            if len(key) > 1 and isinstance(key[1], int) and key[1] < 0 and self.model is not None:
                key = (key[0], key[1] + self.model.cfg.n_layers, *key[2:])  # -1: the last layer
            key = utils.get_act_name(*key)
        key = canonical(key)
        if key not in self and key.endswith("hook_resid_mid") and self.model is not None:
            layer = int(key.split(".")[1])
            pre, attn = f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.hook_attn_out"
            if pre in self and attn in self and self.model._pre_norm(layer):
                return super().__getitem__(pre) + super().__getitem__(attn)  # one sum in the block's own forward
        return super().__getitem__(key)

    def _lens(self) -> HookedTransformer:
        if self.model is None:
            raise ValueError("this cache was not made by HookedTransformer.run_with_cache; it has no model to ask")
        return self.model

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice=None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ):
        """The residual stream before each layer up to ``layer`` (None or -1: all, and the final one), as
        TransformerLens stacks it: ``(component, batch, [pos,] d_model)``; ``apply_ln`` passes each through the
        final norm (the logit lens)."""
        n = self._lens().cfg.n_layers
        layer = n if layer is None or layer == -1 else layer
        parts, labels = [], []
        for l in range(layer + 1):
            if l == n:
                parts.append(self["resid_post", n - 1])
                labels.append("final_post")
                continue
            parts.append(self["resid_pre", l])
            labels.append(f"{l}_pre")
            if (incl_mid and l < layer) or (mlp_input and l == layer):
                parts.append(self["resid_mid", l])
                labels.append(f"{l}_mid")
        stack = torch.stack([_sliced(p, pos_slice) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, recompute_ln=layer == n)
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice=None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ):
        """What each part wrote into the residual stream up to ``layer``: the embedding (rotary models add no
        position vector), then each layer's attention and MLP output, ``(component, batch, [pos,] d_model)``; they
        add up to the stream."""
        n = self._lens().cfg.n_layers
        layer = n if layer is None or layer == -1 else layer
        parts, labels = [], []
        if incl_embeds:
            parts.append(self["hook_embed"])
            labels.append("embed")
        for l in range(layer):
            if mode != "mlp":
                parts.append(self["attn_out", l])
                labels.append(f"{l}_attn_out")
            if mode != "attn":
                parts.append(self["mlp_out", l])
                labels.append(f"{l}_mlp_out")
        if mlp_input and mode != "mlp":
            parts.append(self["attn_out", layer])
            labels.append(f"{layer}_attn_out")
        stack = torch.stack([_sliced(p, pos_slice) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, mlp_input=mlp_input)
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice=None,
        apply_ln: bool = False,
    ):
        """What each head of the layers before ``layer`` (-1 or None: all) wrote into the residual stream, ``z_h
        W_O^h`` without the output bias, stacked as TransformerLens stacks it: ``(layer * head, batch, [pos,]
        d_model)``, labelled ``L{layer}H{head}``; ``apply_ln`` divides by the final norm's scale."""
        if incl_remainder:
            raise ValueError(
                "stack_head_results(incl_remainder=True) is TransformerLens's and not taken here: subtract the stack's "
                "sum from cache.accumulated_resid() yourself"
            )
        lens = self._lens()
        n = lens.cfg.n_layers
        layer = n if layer is None or layer == -1 else layer
        parts, labels = [], []
        for l in range(layer):
            z = self["z", l]
            if lens.layout == "multihead":
                z = z.transpose(-3, -2)  # (..., pos, head, d_head), as TransformerLens keeps it
            out = lens.__dict__["_sites"][l].head_outputs(z)  # (..., pos, head, d_model)
            parts.extend(_sliced(out.select(-2, h), pos_slice) for h in range(out.shape[-2]))
            labels.extend(f"L{l}H{h}" for h in range(out.shape[-2]))
        stack = torch.stack(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self,
        residual_stack: Tensor,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice=None,
        batch_slice=None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
    ) -> Tensor:
        """The final norm applied to a stack as TransformerLens applies it: each component divided by the norm's
        scale of the whole final residual stream (centred first for a LayerNorm), or with ``recompute_ln`` the norm
        module run on each component (the logit lens). The norm's weight is not applied, as in TransformerLens
        without weight processing; ``model.W_U`` is likewise the raw unembedding."""
        lens = self._lens()
        n = lens.cfg.n_layers
        if not (layer is None or layer in (-1, n)):
            raise ValueError(
                f"apply_ln_to_stack: layer {layer}; here the final norm only (layer=-1): a block's own norm scale "
                "is not cached"
            )
        if mlp_input:
            raise ValueError("apply_ln_to_stack: mlp_input applies to a block's norm; here the final norm only")
        norm = lens.final_norm
        if norm is None:
            return residual_stack
        if recompute_ln:
            return torch.stack([norm(c) for c in residual_stack])
        final = self["resid_post", n - 1]
        if batch_slice is not None:
            final = _sliced(final, batch_slice, dim=0)
        if isinstance(norm, nn.LayerNorm):
            residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
            final = final - final.mean(-1, keepdim=True)
        eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))  # (HF's RMSNorm names it so)
        eps = torch.finfo(final.dtype).eps if eps is None else eps
        scale = (final.pow(2).mean(-1, keepdim=True) + eps).sqrt()  # LayerNorm: centred above, so this is its std
        return residual_stack / _sliced(scale, pos_slice)


class HookedTransformer(nn.Module):
    """A multihead causal LM (native or attached) called as TransformerLens calls its models (module docstring)."""

    def __init__(self, model: nn.Module, tokenizer=None, *, layout: str = "transformer_lens", bos_id=None) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
        self.model, self.tokenizer, self.layout, self.bos_id = model.eval(), tokenizer, layout, bos_id
        body = anatomy(model)
        named = dict(model.named_modules())
        points = hook_points(model)
        attns = [(s.name, s.module) for s in body.sites]
        blocks = [body.site_block(i).name for i in range(len(attns))]
        self._points: dict[str, tuple[str, nn.Module]] = {}  # TL name -> ("point" | "input", module)
        for i, (block, (attn_name, _)) in enumerate(zip(blocks, attns)):
            for hook in _BLOCK:
                if f"{block}.{hook}" in points:
                    self._points[f"blocks.{i}.{hook}"] = ("point", points[f"{block}.{hook}"])
            if f"blocks.{i}.hook_resid_pre" not in self._points:  # the block's input: a pre-hook on the block
                self._points[f"blocks.{i}.hook_resid_pre"] = ("input", named[block])
            for hook in _ATTN:
                if f"{attn_name}.{hook}" in points:
                    self._points[f"blocks.{i}.attn.{hook}"] = ("point", points[f"{attn_name}.{hook}"])
        self.__dict__["_blocks"] = [named[b] for b in blocks]  # plain attributes: not registered twice
        self.__dict__["_sites"] = list(body.sites)
        self.__dict__["_adds"] = [body.site_block(i).adds for i in range(len(attns))]
        embed = body.embed
        if embed is not None:
            self._points["hook_embed"] = ("output", embed)
        self.__dict__["_embed"] = embed
        self.__dict__["_final_norm"] = body.final_norm
        config = getattr(model, "config", None)
        a = attns[0][1]
        self.cfg = Config(
            n_layers=len(blocks),
            n_heads=a.num_heads,
            n_key_value_heads=a.num_kv_heads,
            d_head=a.head_dim,
            d_model=int(getattr(a, "d_model", a.num_heads * a.head_dim)),
            d_vocab=int(getattr(config, "vocab_size", 0)),
            n_ctx=int(getattr(config, "max_len", 0)),
            device=next(model.parameters()).device,
        )

    @classmethod
    def from_pretrained(
        cls, source, *, layout: str = "transformer_lens", device=None, dtype=None, **options
    ) -> HookedTransformer:
        """A causal LM multihead reads (``smollm2``, a ``.gguf`` file, an HF folder; ``hf:FOLDER`` attached), on
        ``device`` in ``dtype``. TransformerLens's weight processing options are refused by name where asked for:
        this layer reads the model's weights as they are (as TransformerLens's ``from_pretrained_no_processing``
        does), so its logits are the model's own."""
        _refuse(options, "from_pretrained", _FROM_PRETRAINED)
        from ...loading import load

        loaded = load(source, text=True)
        if loaded.kind != "lm":
            raise ValueError(f"{source} is a {loaded.kind} model; HookedTransformer here takes causal LMs")
        model = loaded.model.to(device=device, dtype=dtype)
        return cls(model, loaded.tokenizer, layout=layout, bos_id=getattr(loaded.detail, "bos_id", None))

    @classmethod
    def from_pretrained_no_processing(cls, source, **options) -> HookedTransformer:
        """TransformerLens's name for reading the weights as they are: :meth:`from_pretrained` here."""
        return cls.from_pretrained(source, **options)

    # ------------------------------------------------------------------------------------------------- weights
    @property
    def final_norm(self) -> nn.Module | None:
        """The norm before the unembedding (TransformerLens's ``ln_final``)."""
        return self.__dict__["_final_norm"]

    @property
    def W_U(self) -> Tensor:  # noqa: N802  (TransformerLens's name)
        """The unembedding ``(d_model, d_vocab)``, as stored (no norm weight folded in)."""
        return self.model.lm_head.weight.T

    @property
    def b_U(self) -> Tensor:  # noqa: N802
        bias = getattr(self.model.lm_head, "bias", None)
        return bias if bias is not None else torch.zeros(self.W_U.shape[1], dtype=self.W_U.dtype)

    @property
    def W_E(self) -> Tensor:  # noqa: N802
        """The token embedding ``(d_vocab, d_model)``."""
        return self.__dict__["_embed"].weight

    @property
    def unembed(self) -> SimpleNamespace:
        """TransformerLens's ``model.unembed``: ``W_U`` and ``b_U``."""
        return SimpleNamespace(W_U=self.W_U, b_U=self.b_U)

    @property
    def embed(self) -> SimpleNamespace:
        """TransformerLens's ``model.embed``: ``W_E``."""
        return SimpleNamespace(W_E=self.W_E)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TransformerLens's switch for per-head outputs. Here nothing needs switching on: the cache's
        :meth:`LensCache.stack_head_results` computes each head's ``z_h W_O^h`` from ``hook_z`` when asked."""
        if not isinstance(use_attn_result, bool):
            raise ValueError(f"set_use_attn_result takes True or False, not {use_attn_result!r}")

    def tokens_to_residual_directions(self, tokens) -> Tensor:
        """Each token's unembedding column as a residual-stream direction: ``W_U[:, tokens].T``."""
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens, prepend_bos=False)[0]
        tokens = torch.as_tensor(tokens)
        return self.W_U[:, tokens].T if tokens.dim() else self.W_U[:, tokens]

    def _pre_norm(self, layer: int) -> bool:
        """Whether block ``layer`` adds attention then the MLP to an unnormalised stream (so that ``resid_mid`` is
        ``resid_pre + attn_out``)."""
        return bool(self.__dict__["_adds"][layer])

    # ------------------------------------------------------------------------------------------------- names
    @property
    def hook_dict(self) -> dict[str, str]:
        """Every TransformerLens name this model answers, with where it reads (a hook point, or a block's input)."""
        return {n: kind for n, (kind, _) in self._points.items()}

    def _names(self, names) -> list[str]:
        if names is None:
            return list(self._points)
        if isinstance(names, str):
            names = [names]
        if callable(names):
            return [n for n in self._points if names(n)]
        chosen = list(names)
        for n in chosen:
            self._resolve(n)
        return chosen

    def _resolve(self, name: str) -> tuple[str, nn.Module]:
        name = canonical(name)
        try:
            return self._points[name]
        except KeyError:
            if re.fullmatch(r"blocks\.\d+\.hook_resid_mid", name):
                raise ValueError(
                    f"{name}: this model's blocks add the attention and the MLP to the residual in one expression, "
                    "so there is no point between them; read blocks.L.hook_attn_out and hook_resid_pre instead"
                ) from None
            raise ValueError(
                f"{name} is not a hook point of this model; it has {len(self._points)}, e.g. "
                + ", ".join(list(self._points)[:6])
            ) from None

    # ------------------------------------------------------------------------------------------------- hooks
    def _to_lens(self, name: str, t: Tensor) -> Tensor:
        return t.transpose(1, 2) if self.layout == "transformer_lens" and name.endswith(_PER_HEAD) else t

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[str | Callable[[str], bool], Callable]] = ()):
        """Attach ``fwd_hooks`` (``(name or filter, fn)``) for the block; removed after it, whatever happens."""
        handles = []
        try:
            for name_or_filter, fn in fwd_hooks:
                names = self._names(name_or_filter) if callable(name_or_filter) else [name_or_filter]
                for name in names:
                    handles.append(self._attach(name, fn))
            yield self
        finally:
            for h in handles:
                h.remove()

    def _attach(self, name: str, fn: Callable):
        kind, module = self._resolve(name)
        hook, classic = Hook(name), canonical(name)  # the hook is told the name it was asked by

        def call(t: Tensor) -> Tensor | None:
            shown = self._to_lens(classic, t)
            out = fn(shown, hook=hook)
            return None if out is None else self._to_lens(classic, out)  # the transpose is its own inverse

        if kind == "input":

            def before(module, args, kwargs):
                out = call(args[0])
                return None if out is None else ((out, *args[1:]), kwargs)

            return module.register_forward_pre_hook(before, with_kwargs=True)
        return module.register_forward_hook(lambda m, args, out: call(out))

    # ------------------------------------------------------------------------------------------------- running
    def forward(
        self,
        tokens,
        return_type: str | None = "logits",
        *,
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        stop_at_layer: int | None = None,
        **options,
    ):
        """TransformerLens's forward. ``return_type``: ``"logits"`` ``(batch, pos, vocab)``, ``"loss"`` (mean
        next-token cross-entropy; ``loss_per_token=True``: ``(batch, pos - 1)``), ``"both"`` (logits, loss) or None.
        ``prepend_bos`` for text input (default: the model's BOS where it has one). ``stop_at_layer``: run the
        embedding and blocks ``0 .. stop_at_layer - 1`` only (negative counts from the end) and return the residual
        stream there, ``(batch, pos, d_model)``. Other TransformerLens options are refused by name."""
        _refuse(options, "forward", _FORWARD)
        if isinstance(tokens, (str, list)):
            ids = self.to_tokens(tokens, prepend_bos=True if prepend_bos is None else prepend_bos)
        else:
            ids = tokens
        if stop_at_layer is not None:
            return self._run_to(ids, stop_at_layer)
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type {return_type!r}: choose 'logits', 'loss', 'both' or None")
        logits = self.model(ids)
        logits = getattr(logits, "logits", logits)
        if return_type is None:
            return None
        if return_type == "logits":
            return logits
        loss = self.loss_fn(logits, ids, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    @staticmethod
    def loss_fn(logits: Tensor, tokens: Tensor, attention_mask=None, per_token: bool = False) -> Tensor:
        """TransformerLens's ``loss_fn``: the next-token cross-entropy of ``logits`` on ``tokens``, the mean or
        ``(batch, pos - 1)`` with ``per_token``."""
        if attention_mask is not None:
            raise ValueError(
                "loss_fn(attention_mask=...) is TransformerLens's and not taken here: pass rows of one length"
            )
        tokens = torch.as_tensor(tokens, device=logits.device)
        per = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="none")
        per = per.view(tokens.shape[0], -1)
        return per if per_token else per.mean()

    def _run_to(self, ids: Tensor, stop_at_layer: int) -> Tensor:
        """The residual stream entering block ``stop_at_layer`` (after the last block, before the final norm, at
        ``n_layers``): the forward is stopped there, and nothing after it runs."""
        n = self.cfg.n_layers
        stop = stop_at_layer + n if stop_at_layer < 0 else stop_at_layer
        if not 0 <= stop <= n:
            raise ValueError(f"stop_at_layer={stop_at_layer}: this model has {n} blocks (0..{n}, or -{n}..-1)")
        where = self.__dict__["_blocks"][stop] if stop < n else (self.final_norm or self.model.lm_head)

        def halt(module, args):
            raise _Stopped(args[0])

        handle = where.register_forward_pre_hook(halt)
        try:
            self.model(ids)
        except _Stopped as stopped:
            return stopped.residual
        finally:
            handle.remove()
        raise RuntimeError(f"the forward never reached {type(where).__name__}")  # the model skipped its own block

    def run_with_hooks(self, tokens, *, fwd_hooks=(), bwd_hooks=(), return_type: str | None = "logits", **kw):
        """TransformerLens's ``run_with_hooks``: forward hooks for this call only."""
        if bwd_hooks:
            raise ValueError("backward hooks are not supported here; read gradients with torch.autograd.grad")
        with self.hooks(fwd_hooks):
            return self(tokens, return_type=return_type, **kw)

    def run_with_cache(
        self,
        tokens,
        *,
        names_filter=None,
        return_type: str | None = "logits",
        remove_batch_dim: bool = False,
        device=None,
        return_cache_object: bool = True,
        **kw,
    ):
        """``(output, cache)``: every activation ``names_filter`` picks (a name, names, a function of the name or
        None: all), detached, in the chosen layout. ``remove_batch_dim`` (one row only) drops the batch axis of
        every cached tensor, ``device`` moves them, ``return_cache_object=False`` gives a plain dict; the rest goes
        to :meth:`forward` (``stop_at_layer``, ``loss_per_token``, ``prepend_bos``), which refuses what it does not
        take by name."""
        _refuse({k: v for k, v in kw.items() if k not in _FORWARD_NAMES}, "run_with_cache", _RUN_WITH_CACHE)
        if remove_batch_dim:
            given = self.to_tokens(tokens) if isinstance(tokens, (str, list)) else torch.as_tensor(tokens)
            if given.shape[0] != 1:
                raise ValueError(f"remove_batch_dim=True takes one row; these tokens have {given.shape[0]}")
        cache = LensCache()
        cache.model = self

        def keep(t: Tensor, hook: Hook) -> None:
            t = t.detach()
            t = t[0] if remove_batch_dim else t
            cache[canonical(hook.name)] = t if device is None else t.to(device)

        with self.hooks([(name, keep) for name in self._names(names_filter)]):
            out = self(tokens, return_type=return_type, **kw)
        return out, (cache if return_cache_object else dict(cache))

    def to_single_token(self, string: str) -> int:
        """The id of ``string`` where it is one token (no BOS); a ValueError naming its tokens otherwise."""
        ids = self.to_tokens(string, prepend_bos=False)[0]
        if ids.numel() != 1:
            raise ValueError(f"{string!r} is {ids.numel()} tokens here ({self.to_str_tokens(string, False)}), not one")
        return int(ids[0])

    def get_token_position(self, single_token, input, mode: str = "first", prepend_bos: bool | None = None) -> int:  # noqa: A002
        """Where ``single_token`` (a string that is one token, or an id) first (``mode="first"``) or last
        (``"last"``) occurs in ``input`` (a text, tokenized with ``prepend_bos``, or one row of ids)."""
        if mode not in ("first", "last"):
            raise ValueError(f"get_token_position: mode {mode!r}; choose 'first' or 'last'")
        token = self.to_single_token(single_token) if isinstance(single_token, str) else int(single_token)
        ids = (
            self.to_tokens(input, prepend_bos=True if prepend_bos is None else prepend_bos)
            if isinstance(input, str)
            else torch.as_tensor(input)
        )
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError(f"get_token_position takes one row; these tokens have {ids.shape[0]}")
            ids = ids[0]
        where = (ids == token).nonzero().flatten().tolist()
        if not where:
            raise ValueError(f"the token {self._decode([token])!r} ({token}) is not in the input")
        return where[0] if mode == "first" else where[-1]

    def to_string(self, tokens) -> str | list[str]:
        """Token ids back to text: one string for a 1-D sequence, one per row for a batch."""
        t = torch.as_tensor(tokens)
        if t.dim() == 2:
            return [self._decode(row.tolist()) for row in t]
        return self._decode(t.flatten().tolist())

    @torch.no_grad()
    def generate(
        self,
        input="",  # noqa: A002  (TransformerLens's name)
        max_new_tokens: int = 10,
        *,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        stop_at_eos: bool = True,
        eos_token_id: int | None = None,
        prepend_bos: bool | None = None,
        return_type: str = "input",
        verbose: bool = True,
        seed: int | None = None,
        **options,
    ):
        """TransformerLens's ``generate``: ``input`` text or ids; ``return_type`` ``"input"`` (text for text, ids
        for ids), ``"str"`` or ``"tokens"`` (the prompt's ids and the new ones). Greedy where ``do_sample=False``,
        else sampled with ``temperature``, ``top_k``, ``top_p`` (``seed`` for repeatable draws), through the model's
        own cache."""
        _refuse(options, "generate", _GENERATE)
        if return_type not in ("input", "str", "tokens"):
            raise ValueError(f"return_type {return_type!r}: choose 'input', 'str' or 'tokens'")
        from ...models.generation import generate

        text = isinstance(input, str)
        given = self.to_tokens(input, prepend_bos=True if prepend_bos is None else prepend_bos) if text else input
        ids = torch.as_tensor(given)
        ids = ids[None] if ids.dim() == 1 else ids
        eos = eos_token_id if eos_token_id is not None else getattr(self.tokenizer, "eos_id", None)
        made = generate(
            self.model,
            ids,
            strategy="sample" if do_sample else "greedy",
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k or 0,
            top_p=top_p or 1.0,
            stop_tokens=(eos,) if stop_at_eos and eos is not None else (),
            seed=seed,
        )
        rows = [torch.cat([row, torch.tensor(new, dtype=row.dtype)]) for row, new in zip(ids, made.tokens)]
        if return_type == "tokens" or (return_type == "input" and not text):
            return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        strings = [self._decode(r.tolist()) for r in rows]
        return strings[0] if len(strings) == 1 else strings

    # ------------------------------------------------------------------------------------------------- tokens
    def to_tokens(self, text: str | list[str], prepend_bos: bool = True) -> Tensor:
        if self.tokenizer is None:
            raise ValueError("this model was built without a tokenizer; pass token ids")
        texts = [text] if isinstance(text, str) else list(text)
        rows = [self.tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
        if prepend_bos and self.bos_id is not None:
            rows = [[self.bos_id, *r] for r in rows]
        if len({len(r) for r in rows}) != 1:
            raise ValueError("the texts give different numbers of tokens; pass one text, or texts of equal length")
        return torch.tensor(rows)

    def _decode(self, ids: list[int]) -> str:
        """Token ids as text, special tokens spelled out (``<|im_start|>``), as TransformerLens shows them."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def to_str_tokens(self, text, prepend_bos: bool = True) -> list[str]:
        ids = self.to_tokens(text, prepend_bos)[0] if isinstance(text, str) else torch.as_tensor(text).flatten()
        return [self._decode([int(i)]) for i in ids]


ActivationCache = LensCache  # TransformerLens's name (its notebooks annotate with it)

__all__ = ["ActivationCache", "LAYOUTS", "Config", "Hook", "HookPoint", "HookedTransformer", "LensCache", "utils"]
