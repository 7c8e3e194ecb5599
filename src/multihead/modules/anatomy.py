"""A model's anatomy, worked out once and read by every analysis: its attention sites in layer order, the blocks
that hold them, the embedding, the final norm and the unembedding.

::

    a = anatomy(model)                    # multihead's own model, or an HF model after multihead.hf.attach
    a.sites[3].module.hook_z              # every site carries the hook points (hook_q/k/v/z/pattern/stats)
    a.sites[3].num_heads, a.sites[3].w_o  # its heads and output projection (E, H * D)
    a.blocks[a.sites[3].block].module     # the block around it (hook_resid_post, hook_mlp_out, ...)
    a.final_norm, a.unembed, a.logits(ids)

Where the anatomy comes from is a *source*: a function that recognises a model and describes it, registered with
:func:`register_source`. multihead's own modules are one source (below); an HF model attached with
:func:`multihead.hf.attach` is another (registered by ``multihead.hf``). An analysis asks :func:`anatomy` and never
which source served: a new kind of model plugs in here, not in every analysis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

# A block's feed-forward module (multihead's, most HF decoders', Mixtral's sparse MoE) and the norm before the
# unembedding, by the names models give them: the one table of each.
MLP_NAMES = ("ffn", "mlp", "feed_forward", "block_sparse_moe")
FINAL_NORM_NAMES = ("final_norm", "norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f")
# A feed-forward module's output projection (its input: one activation per neuron), by the names models give it.
MLP_OUT_NAMES = ("w_2", "down_proj", "fc2", "dense_4h_to_h", "wo", "fc_out")


@dataclass(frozen=True)
class Site:
    """One attention site: ``module`` carries its hook points (``hook_q``, ``hook_k``, ``hook_v`` ``(B, H|G, L,
    D)``, ``hook_z`` ``(B, H, Lq, D)``, ``hook_pattern``, ``hook_stats``) and its output projection ``w_o``
    (weight ``(E, H * D)``, or None); ``block``: the index of the block holding it in :attr:`Anatomy.blocks`
    (None: in no block with a residual stream). ``splits_per_head``: the output projection reads the heads'
    outputs as they are (False: a gate, a norm or a mix of heads stands between, so ``z_h W_O^h`` is not what head
    ``h`` writes). ``role`` in an encoder-decoder: ``encoder`` (self-attention), ``decoder`` (causal
    self-attention) or ``cross`` (decoder -> source); None elsewhere, or where the source cannot tell."""

    name: str
    module: Any  # a multihead attention module, or an attached layer's record: the hook points and w_o
    block: int | None
    num_heads: int
    num_kv_heads: int
    head_dim: int
    splits_per_head: bool
    role: str | None = None

    @property
    def w_o(self):
        return getattr(self.module, "w_o", None)

    def head_outputs(self, z: Tensor) -> Tensor:
        """What each head writes into the residual stream, ``z_h W_O^h``: ``(..., H, D)`` -> ``(..., H, E)``
        (without the output bias)."""
        if not self.splits_per_head or self.w_o is None:
            raise ValueError(
                f"{self.name}: its output projection does not read each head's output as it is (a gate, a norm "
                "or a mix of heads stands between), so what one head writes cannot be split off"
            )
        w = self.w_o.weight
        return torch.einsum("...hd,ehd->...he", z, w.reshape(w.shape[0], self.num_heads, self.head_dim))


@dataclass(frozen=True)
class Block:
    """One block of the residual stream: ``module`` (its input is the stream entering it, its output the stream
    after it; hook points ``hook_resid_post``, ``hook_mlp_out``, ``hook_attn_out`` where the model has them),
    ``sites`` (indices into :attr:`Anatomy.sites`) and its feed-forward module ``mlp``. ``adds``: True where
    attention and the MLP are added to an unnormalised stream (pre-norm), False where the block normalises what it
    adds or the sum (post-norm, sandwich), None where the source cannot tell."""

    name: str
    module: nn.Module
    sites: tuple[int, ...]
    mlp: nn.Module | None
    adds: bool | None

    def hook(self, name: str):
        """The block's hook point ``name`` (``hook_resid_post``, ``hook_mlp_out``, ...), or None."""
        return getattr(self.module, name, None)

    @property
    def mlp_out(self) -> nn.Linear | None:
        """The feed-forward's output projection, whose input holds one activation per neuron (``weight`` ``(E,
        neurons)``); None where the block has no feed-forward, or one whose neurons are not read by one linear
        layer (experts, a transposed ``Conv1D``)."""
        out = None if self.mlp is None else child(self.mlp, MLP_OUT_NAMES)
        return out if isinstance(out, nn.Linear) else None


def _offloads(module: nn.Module | None) -> bool:
    """Whether accelerate offloads ``module``'s own weights (its hook loads them for each forward)."""
    hook = getattr(module, "_hf_hook", None)
    return hook is not None and bool(getattr(hook, "offload", False))


@dataclass(frozen=True)
class Anatomy:
    """Where a model's parts are (module docstring). ``source``: which source described it (``native``, ``hf``);
    ``runner``: the module to call on token ids."""

    source: str
    runner: nn.Module
    sites: tuple[Site, ...]
    blocks: tuple[Block, ...]
    embed: nn.Module | None
    final_norm: nn.Module | None
    unembed: nn.Module | None

    @contextmanager
    def at_hand(self, *parts: nn.Module | str | None) -> Iterator[None]:
        """Inside, the weights of ``parts`` (modules, or site names) are real tensors, also in a model dispatched by
        accelerate with CPU or disk offload, whose offloaded parameters sit on the meta device between forwards:
        the offloading module holding each part loads its weights (accelerate's ``align_module_device``) and
        offloads them again on leaving. Outside a forward, what reads a weight directly (direct logit attribution)
        reads it here."""
        named = dict(self.runner.named_modules())
        paths = {id(m): n for n, m in named.items()}
        loading: dict[str, nn.Module] = {}
        for part in parts:
            path = part if isinstance(part, str) else paths.get(id(part))
            if path is None:
                continue
            pieces = path.split(".") if path else []
            # the nearest offloading module around the part, else every offloading module inside it (accelerate
            # hooks each leaf module where a device map offloads a layer)
            around = [".".join(pieces[:j]) for j in range(len(pieces), -1, -1)]
            inside = [n for n in named if path == "" or n.startswith(path + ".")]
            for name in around + inside:
                if _offloads(named.get(name)):
                    loading[name] = named[name]
                    if name in around:
                        break
        if not loading:
            yield
            return
        from accelerate.utils import align_module_device

        with ExitStack() as stack:
            for module in loading.values():
                stack.enter_context(align_module_device(module))
            yield

    def logits(self, *args, **kwargs) -> Tensor:
        """The runner's output on ``args`` as a tensor (an HF model's ``.logits``)."""
        out = self.runner(*args, **kwargs)
        return getattr(out, "logits", out)

    def site_block(self, site: int) -> Block:
        """The block holding site ``site`` (a ValueError where it sits in none)."""
        s = self.sites[site]
        if s.block is None:
            raise ValueError(f"{s.name} sits in no block with a residual stream hook (hook_resid_post)")
        return self.blocks[s.block]

    def final_norm_parts(self) -> tuple[str, Tensor | None, Tensor | None, float]:
        """:func:`norm_parts` of the final norm."""
        return norm_parts(self.final_norm)


def norm_parts(norm: Any) -> tuple[str, Tensor | None, Tensor | None, float]:
    """``(kind, gain, shift, eps)`` of a norm: ``kind`` ``rms`` (``x / rms(x) * gain``), ``layer`` (LayerNorm) or
    ``none``. Gemma's RMSNorm scales by ``1 + weight``; an RMSNorm without an epsilon uses its dtype's."""
    if norm is None:
        return "none", None, None, 0.0
    eps = getattr(norm, "eps", None)
    eps = getattr(norm, "variance_epsilon", None) if eps is None else eps
    if isinstance(norm, nn.LayerNorm):
        return "layer", norm.weight, norm.bias, float(norm.eps)
    weight = norm.weight
    if eps is None:
        eps = torch.finfo(weight.dtype).eps if weight is not None else 1e-6
    gain = weight + 1 if weight is not None and "gemma" in type(norm).__name__.lower() else weight
    return "rms", gain, None, float(eps)


def token_embedding(model: nn.Module) -> nn.Module | None:
    """The token embedding: multihead's ``embed`` (its LMs, encoders, attached LMs), or an HF model's own."""
    embed = getattr(model, "embed", None)
    if isinstance(embed, nn.Module):
        return embed
    for owner in (model, getattr(model, "hf", None)):
        get = getattr(owner, "get_input_embeddings", None)
        if callable(get):
            try:
                return get()
            except (NotImplementedError, AttributeError):
                pass
    return None


def child(module: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    """The first of ``module``'s children named in ``names``."""
    return next((getattr(module, n) for n in names if isinstance(getattr(module, n, None), nn.Module)), None)


# ---------------------------------------------------------------------------------------------------- sources
Source = Callable[[nn.Module], "Anatomy | None"]
SOURCES: dict[str, Source] = {}


def register_source(name: str, find: Source) -> None:
    """Add a source: ``find(model)`` describes a model it recognises, None for one it does not."""
    SOURCES[name] = find


def anatomy(model: nn.Module) -> Anatomy:
    """The anatomy of ``model`` from the first source that recognises it (a ValueError naming what works
    otherwise)."""
    for find in SOURCES.values():
        found = find(model)
        if found is not None:
            return found
    raise ValueError(
        f"{type(model).__name__} has no multihead MultiHeadAttention modules to read; pass a multihead model "
        "(TransformerClassifier, TextEncoder, multihead.load(...).model), attach an HF model first "
        "(multihead.hf.attach(model)), or observe any other PyTorch model on an example input "
        "(multihead.modules.observe.observe(model, example))"
    )


def blocks_of(
    model: nn.Module, sites: Sequence[tuple[str, Any]], adds: Callable[[nn.Module], bool | None]
) -> tuple[list[Site], list[Block]]:
    """Sites and blocks from ``sites`` (``(name, module)`` in layer order, each module with the attention hook
    points, ``num_heads``, ``num_kv_heads``, ``head_dim``): each site's block is the nearest enclosing module with
    a ``hook_resid_post``. ``adds(block)``: :attr:`Block.adds`."""
    named = dict(model.named_modules())
    order: dict[str, list[int]] = {}
    placed: list[str | None] = []
    for i, (name, _) in enumerate(sites):
        parts = name.split(".")
        block = next(
            (
                ".".join(parts[:j])
                for j in range(len(parts) - 1, -1, -1)
                if hasattr(named.get(".".join(parts[:j])), "hook_resid_post")
            ),
            None,
        )
        placed.append(block)
        if block is not None:
            order.setdefault(block, []).append(i)
    names = {b: i for i, b in enumerate(order)}
    blocks = [Block(b, named[b], tuple(order[b]), child(named[b], MLP_NAMES), adds(named[b])) for b in names]
    out = []
    for (name, mod), block in zip(sites, placed):
        feeds = getattr(mod, "z_feeds_output", True)  # an attached layer says what it measured (None: unknown)
        splits = getattr(mod, "w_gate", None) is None and feeds is not False and getattr(mod, "w_o", None) is not None
        out.append(
            Site(
                name,
                mod,
                None if block is None else names[block],
                int(mod.num_heads),
                int(mod.num_kv_heads),
                int(mod.head_dim),
                bool(splits),
            )
        )
    return out, blocks


def _native(model: nn.Module) -> Anatomy | None:
    """multihead's own modules: every :class:`~multihead.MultiHeadAttention` (and latent-attention) module."""
    from .attention import MultiHeadAttention
    from .mla import MultiHeadLatentAttention

    found = [(n, m) for n, m in model.named_modules() if isinstance(m, (MultiHeadAttention, MultiHeadLatentAttention))]
    if not found:
        return None

    def adds(block: nn.Module) -> bool | None:
        if not hasattr(block, "norm_first"):
            return None
        return bool(block.norm_first) and getattr(block, "post_norms", None) is None

    sites, blocks = blocks_of(model, found, adds)
    if isinstance(getattr(model, "encoder", None), nn.Module) and isinstance(
        getattr(model, "decoder", None), nn.Module
    ):
        sites = [replace(s, role=_native_role(s.name)) for s in sites]
    stack = getattr(model, "decoder", None) or getattr(model, "encoder", None)
    final = getattr(stack, "final_norm", None)
    head = getattr(model, "lm_head", None)
    return Anatomy(
        "native",
        model,
        tuple(sites),
        tuple(blocks),
        token_embedding(model),
        final if isinstance(final, nn.Module) else None,
        head if isinstance(head, nn.Module) else None,
    )


def _native_role(name: str) -> str | None:
    """A native encoder-decoder's site by its place: ``encoder.*``, ``decoder.*.self_attn``, ``*.cross_attn``."""
    if name.endswith("cross_attn"):
        return "cross"
    top = name.split(".", 1)[0]
    return top if top in ("encoder", "decoder") else None


register_source("native", _native)

__all__ = [
    "Anatomy",
    "Block",
    "FINAL_NORM_NAMES",
    "MLP_OUT_NAMES",
    "MLP_NAMES",
    "SOURCES",
    "Site",
    "anatomy",
    "blocks_of",
    "child",
    "norm_parts",
    "register_source",
    "token_embedding",
]
