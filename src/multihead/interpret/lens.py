"""TransformerLens's habits on multihead's models: a notebook written for TransformerLens runs with its import and
its model line changed.

::

    from multihead.interpret.lens import HookedTransformer, utils   # was: from transformer_lens import ...
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

What does not (yet): the ``ActivationCache`` methods that fold the final norm into stacks (``accumulated_resid``,
``decompose_resid``, ``apply_ln_to_stack``), ``W_U`` and the other weight aliases, backward hooks, and a hook name the
model has no point for (``hook_resid_mid`` of a native block, whose two residual additions are one expression):
asked for, each is refused with the reason. Hooks are attached for one call and removed after it, whatever happens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..modules.capture import _block_of, attention_modules
from ..modules.hooks import hook_points

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


class LensCache(dict):
    """Activations by TransformerLens name; ``cache["pattern", 3]`` is ``cache["blocks.3.attn.hook_pattern"]``."""

    def __getitem__(self, key):
        if isinstance(key, tuple):
            key = utils.get_act_name(*key)
        return super().__getitem__(key)


class HookedTransformer(nn.Module):
    """A multihead causal LM (native or attached) called as TransformerLens calls its models (module docstring)."""

    def __init__(self, model: nn.Module, tokenizer=None, *, layout: str = "transformer_lens", bos_id=None) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
        self.model, self.tokenizer, self.layout, self.bos_id = model.eval(), tokenizer, layout, bos_id
        named = dict(model.named_modules())
        points = hook_points(model)
        attns = attention_modules(model)
        blocks = [_block_of(name, named) for name, _ in attns]
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
        from ..loading import load

        loaded = load(source, text=True)
        if loaded.kind != "lm":
            raise ValueError(f"{source} is a {loaded.kind} model; HookedTransformer here takes causal LMs")
        return cls(loaded.model, loaded.tokenizer, layout=layout, bos_id=getattr(loaded.detail, "bos_id", None))

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
