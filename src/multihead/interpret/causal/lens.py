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
``run_with_cache(names_filter=...)``; ``return_type`` ``"logits"``, ``"loss"`` or None; ``cfg.n_layers``,
``n_heads``, ``d_head``, ``d_model``, ``d_vocab``; ``to_tokens``, ``to_str_tokens``.

The cache stacks the residual stream as TransformerLens's ``ActivationCache`` does: ``accumulated_resid`` (the
logit lens, with ``apply_ln``), ``decompose_resid`` (``embed``, then each layer's ``attn_out`` and ``mlp_out``) and
``apply_ln_to_stack`` at the final norm, with ``pos_slice``; ``model.W_U``, ``b_U``, ``W_E``, ``final_norm`` and
``tokens_to_residual_directions`` are there for direct logit attribution. A native block has no point between its
two residual additions: its ``resid_mid`` in a cache is ``resid_pre + attn_out``, the same sum its forward makes.

What does not (yet): the per-head stacks (``stack_head_results``) and the other weight aliases (``W_Q``, ``W_O``...),
``apply_ln_to_stack`` at a block's own norm, backward hooks, and a hook name the model has no point for: asked for,
each is refused with the reason. Hooks are attached for one call and removed after it, whatever happens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...modules.anatomy import anatomy
from ...modules.hooks import hook_points

LAYOUTS = ("transformer_lens", "multihead")
_PER_HEAD = ("hook_q", "hook_k", "hook_v", "hook_z")  # (B, H, L, D) here, (B, L, H, D) in TransformerLens
_BLOCK = ("hook_resid_pre", "hook_resid_mid", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
_ATTN = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_pattern")


class utils:  # noqa: N801  (TransformerLens's module name: ``utils.get_act_name``)
    @staticmethod
    def get_act_name(name: str, layer: int | None = None) -> str:
        """TransformerLens's short names: ``get_act_name("z", 3) == "blocks.3.attn.hook_z"``."""
        short = name.removeprefix("hook_")
        if short in ("q", "k", "v", "z", "pattern"):
            return f"blocks.{layer}.attn.hook_{short}"
        if short in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"):
            return f"blocks.{layer}.hook_{short}"
        raise ValueError(
            f"get_act_name does not know {name!r} here; the names are q, k, v, z, pattern, resid_pre, resid_mid, "
            "resid_post, attn_out and mlp_out"
        )


@dataclass
class Hook:
    """What a hook function gets as ``hook``: the TransformerLens name and its layer."""

    name: str

    def layer(self) -> int:
        found = re.match(r"blocks\.(\d+)\.", self.name)
        if found is None:
            raise ValueError(f"{self.name} is not inside a block")
        return int(found.group(1))


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
            key = utils.get_act_name(*key)
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
        )

    @classmethod
    def from_pretrained(cls, source, *, layout: str = "transformer_lens", **_) -> HookedTransformer:
        """A causal LM multihead reads (``smollm2``, a ``.gguf`` file, an HF folder; ``hf:FOLDER`` attached)."""
        from ...loading import load

        loaded = load(source, text=True)
        if loaded.kind != "lm":
            raise ValueError(f"{source} is a {loaded.kind} model; HookedTransformer here takes causal LMs")
        return cls(loaded.model, loaded.tokenizer, layout=layout, bos_id=getattr(loaded.detail, "bos_id", None))

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
        hook = Hook(name)

        def call(t: Tensor) -> Tensor | None:
            shown = self._to_lens(name, t)
            out = fn(shown, hook=hook)
            return None if out is None else self._to_lens(name, out)  # the transpose is its own inverse

        if kind == "input":

            def before(module, args, kwargs):
                out = call(args[0])
                return None if out is None else ((out, *args[1:]), kwargs)

            return module.register_forward_pre_hook(before, with_kwargs=True)
        return module.register_forward_hook(lambda m, args, out: call(out))

    # ------------------------------------------------------------------------------------------------- running
    def forward(self, tokens, return_type: str | None = "logits", **_) -> Tensor | None:
        """``return_type``: ``"logits"`` ``(batch, pos, vocab)``, ``"loss"`` (mean next-token cross-entropy) or
        None."""
        ids = self.to_tokens(tokens) if isinstance(tokens, (str, list)) else tokens
        logits = self.model(ids)
        logits = getattr(logits, "logits", logits)
        if return_type == "logits":
            return logits
        if return_type == "loss":
            return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        if return_type is None:
            return None
        raise ValueError(f"return_type {return_type!r}: choose 'logits', 'loss' or None")

    def run_with_hooks(self, tokens, *, fwd_hooks=(), bwd_hooks=(), return_type: str | None = "logits", **kw):
        """TransformerLens's ``run_with_hooks``: forward hooks for this call only."""
        if bwd_hooks:
            raise ValueError("backward hooks are not supported here; read gradients with torch.autograd.grad")
        with self.hooks(fwd_hooks):
            return self(tokens, return_type=return_type, **kw)

    def run_with_cache(self, tokens, *, names_filter=None, return_type: str | None = "logits", **kw):
        """``(output, cache)``: every activation ``names_filter`` picks (a name, names, a function of the name or
        None: all), detached, in the chosen layout."""
        cache = LensCache()
        cache.model = self

        def keep(t: Tensor, hook: Hook) -> None:
            cache[hook.name] = t.detach()

        with self.hooks([(name, keep) for name in self._names(names_filter)]):
            out = self(tokens, return_type=return_type, **kw)
        return out, cache

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

    def to_str_tokens(self, text, prepend_bos: bool = True) -> list[str]:
        ids = self.to_tokens(text, prepend_bos)[0] if isinstance(text, str) else torch.as_tensor(text).flatten()
        return [self.tokenizer.decode([int(i)]) for i in ids]


__all__ = ["LAYOUTS", "Config", "Hook", "HookedTransformer", "LensCache", "utils"]
