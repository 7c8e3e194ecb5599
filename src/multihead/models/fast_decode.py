"""A decoding step with nothing but its arithmetic, for the causal LMs whose layers need nothing else.

A step of :class:`~multihead.models.seq2seq.CausalLM` through the general path builds masks, asks the attention
registry for a backend, fires a dozen hook points per layer and speaks the cache protocol -- about two thousand
small operations and Python calls a step, which on a 135M-parameter model cost as much as a third of the weights'
streaming. :func:`step` runs the same layers' own modules (their norms, projections, feed-forward, rotary and
cache) with none of that: per layer one norm, one q/k/v product, the rotation, the cache write, one attention call,
the output projection, one norm and the feed-forward. It gives the general path's logits (within the order of
additions inside a product) and the same greedy tokens.

:func:`why_not` says when it does not apply, and :meth:`CausalLM.step` then takes the general path: gradients on,
training mode, hooks attached (an intervention or a capture must see every hook point fire), a KV policy or a
streaming cache, padded rows, or a layer the step does not know (cross-attention, sliding windows, ALiBi, sinks,
gated, differential or talking-heads attention, MLA, post-norm blocks).

:func:`compile` goes one step further for a batch of one row, opt-in: it lays the weights out by rows and hands
each layer's arithmetic around the attention -- norm and q/k/v product; output product, residual, norm and
feed-forward -- to ``torch.compile`` (inductor's C++ code, one graph shared by every layer, weights passed in), which
writes each product as one fused row-by-row reduction. On 2 threads of this CPU that streams SmolLM2-135M's 538 MB
in 24 ms where the BLAS's best single-row product takes 37: 41 tokens/s against 23 for the lean step. The rotation,
the cache write and the attention stay eager (the cache grows, and the graphs keep fixed shapes). The logits are
the lean step's within the order of additions (3.6e-5 on SmolLM2's logits of magnitude 23), and the greedy tokens the
same. It needs a C++ compiler (inductor's); :func:`compile` says so, and changes nothing, where there is none.

``compile(model, whole_step=True)`` compiles the whole step as one graph (gpt-fast's shape): the cache's buffers are
written in place at the step's position and attended through a mask over the buffer, so the rotation, the cache
write and the attention are inside the graph too, and one call's guards are checked a step instead of two per
layer. Where it serves (layers of one shape, one rotation, no q/k norms: :func:`why_not_whole`) it gives the same
greedy tokens; whether it is faster is measured (``multihead bench decode --impls compiled,compiled_step``).
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.registry import get_backend
from ..modules import fastpath
from ..modules.attention import MultiHeadAttention
from ..modules.kv import KVCache, LayerKV
from . import kernels
from .kernels import why_not_inductor
from .precision import WeightOnlyLinear, own_code, rowwise, use, weight_only, words

ENABLED = True


# What this module keeps per model, here rather than in the model's attributes: whether (and why not) its
# architecture takes the fast step, with its modules; and what compile() made for it.
_KNOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CHOSEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the kernel chosen for it here


def compiled(model) -> bool:
    """Whether :func:`compile` has given ``model`` (or the model that decodes it: :func:`decoding_model`) the compiled
    decoding step."""
    try:
        return decoding_model(model) in _COMPILED
    except ValueError:
        return False


def decoding_model(model):
    """The causal LM whose step decodes ``model``: ``model`` itself, or the one it names by a ``decoding_model()``
    method (an attached HF model names multihead's view over its own weights, :func:`multihead.hf.lean.view`);
    ValueError with the reason where it names none."""
    named = getattr(model, "decoding_model", None)
    return model if named is None else named()


def why_not_architecture(model) -> str | None:
    """Why the step cannot run ``model``'s layers, whatever the cache and the hooks (None: it can)."""
    c = model.config
    d = c.decoder
    if d.cross_attention or not d.causal:
        return "the decoder has cross-attention or reads both ways"
    if not d.norm_first or d.sandwich_norm:
        return "its blocks normalise after each sublayer (post-norm or sandwich norms)"
    if d.sliding_window is not None or d.attention.alibi or c.positional == "alibi":
        return "it has sliding-window layers or ALiBi"
    for i, layer in enumerate(model.decoder.layers):
        a = layer.self_attn
        if type(a) is not MultiHeadAttention:
            return f"layer {i}'s attention is {type(a).__name__}, not plain multi-head attention"
        if a.num_heads == 0 or a.w_gate is not None or a.sink_logits is not None or a.pattern is not None:
            return f"layer {i}'s attention has no heads, a gate, sinks or a sparsity pattern"
        if layer.post_norms is not None:
            return f"layer {i} normalises its sublayers' outputs"
        if a.backend != "auto" and not get_backend(a.backend).capabilities.exact:
            return f"layer {i} attends with the approximate {a.backend!r} backend"
    return None


def why_not(model, cache: KVCache) -> str | None:
    """Why :func:`step` does not serve this step of ``model`` with ``cache`` (None: it does)."""
    if not ENABLED:
        return "fast_decode.ENABLED is False"
    if torch.is_grad_enabled() or model.training:
        return "gradients are on or the model is training"
    known = _KNOWN.get(model)
    if known is None or known[2] != weight_only(model):  # new, or its linear layers were converted since
        if known is not None:
            forget(model)  # its kernel and compiled step were chosen for the float32 layers
        known = _KNOWN[model] = (why_not_architecture(model), list(model.modules()), weight_only(model))
    reason, modules, _ = known
    if reason is not None:
        return reason
    if hooked(modules):
        return "hooks are attached (a capture or an intervention must see every module and hook point run)"
    if len(cache.self_attn) != len(model.decoder.layers):
        return "the cache was made for another model (its layers differ): the general path refuses it"
    if cache.policy is not None or any(type(kv) is not LayerKV for kv in cache.self_attn):
        return "the cache follows a KV policy or streams (its protocol decides what each layer attends)"
    if cache.key_padding is not None or cache.next_position is None:
        return "the rows are padded, or the cache holds no prompt yet"
    limit = model.config.max_len
    if int(cache.next_position.max()) >= limit and (model.config.positional != "rope" or not cache.extrapolate):
        return f"the next position is past the model's {limit}: the general path says what to do"
    return None


def forget(model) -> None:
    """Drop what this module knew of ``model`` (its layers, its kernel, its compiled step): its layers changed."""
    for table in (_KNOWN, _COMPILED, _CHOSEN):
        table.pop(model, None)


def chosen(model) -> kernels.Choice | None:
    """The kernel ``model`` decodes a row with on this machine and why (:func:`multihead.models.kernels.choose`),
    once its first row has been decoded; None before."""
    return _CHOSEN.get(model)


def _choose(model) -> None:
    """On ``model``'s first one-row step here: the kernel this machine decodes fastest with (measured once per
    machine, or kept from an earlier process) -- for float32 weights BLAS's product or inductor's reduction, timed as
    products; for weights stored in bf16 or int8 the lean step with PyTorch's product for the format or the compiled
    step, timed as whole steps of the model -- and the compiled step where inductor's reduction wins."""
    fmt = weight_only(model)
    if model in _COMPILED:  # compile() was asked for: an explicit choice
        _CHOSEN[model] = kernels.Choice("compiled", "asked", {}, note="fast_decode.compile was called")
        return
    choice = kernels.choose(model, fmt=fmt, steps=None if fmt is None else _step_timers(model))
    if fmt is not None:  # a row through a stored layer off the compiled step (a hook on, say) takes it too
        use(model, choice.kernel)
        if choice.kernel != "compiled":
            _COMPILED.pop(model, None)  # compiled to be timed, and slower
    if choice.kernel == "compiled":
        try:
            compile(model)
        except ValueError as e:  # an architecture the compiled step cannot write: the lean step, said once
            if fmt is None:
                choice.kernel = "blas"
            choice.note = f"the compiled kernel is fastest here, but this model cannot take the compiled step ({e})"
            kernels.say_once(choice.note)
    _CHOSEN[model] = choice


def _step_timers(model) -> dict:
    """For weights stored in a format: each candidate as a whole one-row decoding step of ``model`` itself (the lean
    step with PyTorch's product for the format; the compiled step, compiled for the purpose), timed on a cache of its
    own. The steps, not the products alone, are what differ: the lean step does its norms, rotation and attention
    between the products, the compiled step fuses them into its graphs."""

    def timer(kernel: str):
        def build():
            if kernel == "compiled":
                compile(model)
            else:
                _COMPILED.pop(model, None)
            use(model, kernel)
            one, stepper = torch.zeros(1, dtype=torch.long), _compiled_step if kernel == "compiled" else _lean_step

            @torch.no_grad()
            def fresh():
                return model.prefill(torch.zeros(1, 4, dtype=torch.long))[1]

            held = [fresh()]

            @torch.no_grad()
            def run() -> None:
                if held[0].self_attn[0].length >= 64:  # a short cache, as early in a generation
                    held[0] = fresh()
                stepper(model, one, held[0])

            return run

        return build

    timers = {"library": timer("library")}
    if why_not_compile(model) is None and why_not_architecture(model) is None and not isinstance(_spec(model), str):
        timers["compiled"] = timer("compiled")
    return timers


def hooked(modules) -> bool:
    """Whether a forward hook is on any of ``modules`` (a hook point, a layer, a norm: the steps here call few of
    them), or on every module (``torch.nn.modules.module.register_module_forward_hook``). Read at every step, so a
    hook added after :func:`compile` sends the next step to the general path."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def step(model, tokens: Tensor, cache: KVCache) -> Tensor:
    """One token per row ``(B,)`` in, its logits ``(B, V)`` out; the cache extended. Call only where
    :func:`why_not` says None (:meth:`CausalLM.step` does). A model given to :func:`compile` takes its compiled
    step where :func:`why_not_compiled` says None."""
    # a batch over weights stored in a format takes the product chosen for one row (a float32 batch: the BLAS's)
    if model not in _CHOSEN and tokens.device.type == "cpu" and (tokens.shape[0] == 1 or weight_only(model)):
        _choose(model)
    if model in _COMPILED and why_not_compiled(model, tokens) is None:
        return _compiled_step(model, tokens, cache)
    return _lean_step(model, tokens, cache)


def _lean_step(model, tokens: Tensor, cache: KVCache) -> Tensor:
    dec = model.decoder
    pos = cache.next_position  # (B,)
    positions = pos[:, None]  # (B, 1): one tensor for every layer, so the rotary angles are computed once
    x = model.embed(tokens[:, None])  # (B, 1, E)
    if model.config.embed_scale:
        x = x * torch.tensor(dec.config.d_model**0.5, dtype=x.dtype)
    if model.pos is not None:
        x = model.pos(x, positions=positions)
    b = x.shape[0]
    for layer, kv in zip(dec.layers, cache.self_attn):
        a = layer.self_attn
        h = layer.norms[0](x)
        q, k, v = a._project(h, h, h, None)  # (B, H, 1, D), (B, G, 1, D)
        if a.rotary is not None:
            q, k = a.rotary.rotate_pair(q, k, 0, positions)
        k, v = kv.append(k, v)  # written in place into the cache's buffers: (B, G, L, D)
        z = F.scaled_dot_product_attention(q, k, v, enable_gqa=a.num_kv_heads != a.num_heads)  # (B, H, 1, D)
        x = x + a.w_o(z.transpose(1, 2).reshape(b, 1, a.num_heads * a.head_dim))
        if layer.ffn is not None:
            x = x + layer.ffn(layer.norms[1](x))
    if dec.final_norm is not None:
        x = dec.final_norm(x)
    cache.next_position = pos + 1
    head = model.lm_head
    if not isinstance(head, nn.Linear):  # weights stored in another format: its own product
        return head(x)[:, -1]
    return fastpath.linear(x, head.weight, None, head)[:, -1]  # (B, V)


# ---------------------------------------------------------------------------------------------- the compiled step
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}
_ACTIVATIONS["silu"] = F.silu


def _activation(ffn) -> str | None:
    """The feed-forward's activation by name (None: one the compiled step does not know)."""
    act = ffn.act
    if act is F.silu or isinstance(act, nn.SiLU):
        return "silu"
    if isinstance(act, nn.ReLU):
        return "relu"
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    from ..modules.feedforward import GATED

    return "gelu_tanh" if act is GATED["geglu"] else None


def _norm(module) -> tuple | None:
    """``(kind, eps)`` of a norm the compiled step can write (None: it cannot)."""
    if type(module) is nn.RMSNorm:
        return "rms", module.eps
    if type(module) is nn.LayerNorm:
        return "layer", module.eps
    return None


def _spec(model) -> tuple | str:
    """What the compiled graphs are specialised on (one spec for every layer), or why there is none."""
    dec = model.decoder
    specs = set()
    for i, layer in enumerate(dec.layers):
        f = layer.ffn
        if f is None or (f.w_gate is not None and (f.w_gate.bias is None) != (f.w_1.bias is None)):
            return f"layer {i} has no feed-forward, or a bias on one of its gate and up products only"
        act, norms = _activation(f), [_norm(n) for n in layer.norms[:2]]
        if act is None or None in norms or len(layer.norms) != 2:
            return f"layer {i}'s activation or norms are ones the compiled step does not write"
        specs.add((norms[0], norms[1], act, f.w_gate is not None))
    final = None if dec.final_norm is None else _norm(dec.final_norm)
    if dec.final_norm is not None and final is None:
        return "the final norm is one the compiled step does not write"
    if len(specs) != 1:
        return "the layers differ in their norms or activations (one graph serves every layer)"
    return (*specs.pop(), final)


def _normed(x: Tensor, spec: tuple, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    kind, eps = spec
    if kind == "rms":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _bodies(spec: tuple):
    """The three functions of a spec, uncompiled: before attention, after it, and the output head."""
    pre_norm, post_norm, act, gated, final = spec
    activation = _ACTIVATIONS[act]

    def before(x, norm_w, norm_b, w_qkv, b_qkv, sizes_qkv):
        return _product(_normed(x, pre_norm, norm_w, norm_b), w_qkv, _joined(b_qkv, sizes_qkv, x))

    def after(x, z, w_o, b_o, norm_w, norm_b, w_in, b_in, sizes_in, w_out, b_out):
        x = x + _product(z, w_o, b_o)
        h = _product(_normed(x, post_norm, norm_w, norm_b), w_in, _joined(b_in, sizes_in, x))
        if gated:
            gate, up = h.chunk(2, -1)
            h = activation(gate) * up
        else:
            h = activation(h)
        return x + _product(h, w_out, b_out)

    def head(x, norm_w, norm_b, w):
        return _product(x if final is None else _normed(x, final, norm_w, norm_b), w, None)

    return before, after, head


@functools.cache
def _graphs(spec: tuple, fmt: str | None):
    """The three compiled functions of a spec and weight format (None: float32): before attention, after it, and
    the output head."""
    return tuple(torch.compile(own_code(fn), dynamic=False, fullgraph=True) for fn in _bodies(spec))


@functools.cache
def _whole_graph(spec: tuple, shape: tuple, fmt: str | None):
    """One compiled function for a whole step (``shape``: query heads, key/value heads, head dim): every layer's
    products, rotation (by the step's ``cos`` and ``sin``), cache write and attention, and the head. The keys and values are written in place into the
    caches' buffers at ``at`` and attended up to it (a mask over the buffer), so the graph keeps its shapes while
    the cache fills; a larger buffer (the cache doubled) compiles once more with its length symbolic."""
    before, after, head = _bodies(spec)
    h, g, d = shape

    def rotate(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def whole(x, cos, sin, at, layers, keys, values, head_args):
        for (pre, post, ffn), kb, vb in zip(layers, keys, values):
            q, k, v = before(x, *pre).split([h * d, g * d, g * d], -1)
            # one token: the query heads sharing a key/value head are that group's queries (grouped-query attention
            # without copying the cache)
            q = q.view(1, g, h // g, d)
            k = k.view(1, 1, g, d).transpose(1, 2)
            v = v.view(1, 1, g, d).transpose(1, 2)
            if cos is not None:
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            kb.index_copy_(2, at, k)
            vb.index_copy_(2, at, v)
            seen = torch.arange(kb.shape[2], device=kb.device) <= at  # (C,): the filled part of the buffer
            z = F.scaled_dot_product_attention(q, kb, vb, attn_mask=seen.view(1, 1, 1, -1))  # (1, G, H / G, D)
            x = after(x, z.reshape(1, 1, h * d), *post, *ffn)
        return head(x, *head_args)[:, -1]

    return torch.compile(own_code(whole), fullgraph=True)


def _product(x: Tensor, parts: tuple, bias: Tensor | None) -> Tensor:
    """``x`` through the weights of ``parts`` (``(weight, scales)`` pairs, each by rows), their outputs joined: a
    float32 weight as it is, a bf16 or int8 one (:mod:`multihead.models.precision`) upcast inside the reduction and
    scaled per row (:func:`multihead.models.precision.rowwise`), so inductor streams the stored bytes once and
    accumulates in float32."""
    ys = [rowwise(x, weight, scales) for weight, scales in parts]
    y = ys[0] if len(ys) == 1 else torch.cat(ys, -1)
    return y if bias is None else y + bias


def _parts(linears) -> tuple | None:
    """The compiled graphs' weights for ``linears`` read as one product: a float32 group packed by rows (one view
    of the buffer they are views of; None: not packed yet), or each stored weight with its scales."""
    if all(isinstance(m, WeightOnlyLinear) for m in linears):
        return tuple((words(m.qweight), m.scales) for m in linears)
    packed = fastpath.rows([m.weight for m in linears])
    return None if packed is None or not packed.is_contiguous() else ((packed, None),)


def _joined(biases: tuple, sizes: tuple, like: Tensor) -> Tensor | None:
    """The biases of products packed into one (q/k/v, gate/up), joined inside the graph from the live parameters
    (a product without a bias adds zeros); None where none has one."""
    if all(b is None for b in biases):
        return None
    return torch.cat([like.new_zeros(n) if b is None else b for b, n in zip(biases, sizes)])


def _tensors(model) -> list:
    """Each layer's arguments to the compiled graphs: the parameters themselves, or views of the buffers they are
    views of (q/k/v and gate/up packed by rows), never copies -- so a weight or bias changed in place, through
    ``.data`` too, is read at the next step. Rebuilt whenever a parameter is replaced."""
    kept = _COMPILED[model]
    owners = kept.get("owners")
    if owners is None:  # what holds the tensors (a parameter or stored weight replaced still shows in its dict)
        owners = kept["owners"] = [d for m in model.modules() for d in (m._parameters, m._buffers) if d]
    stamp = [(p.data_ptr(), p._version, p.shape) for held in owners for p in held.values() if p is not None]
    if kept.get("stamp") != stamp:
        layers = []
        for layer in model.decoder.layers:
            a, f = layer.self_attn, layer.ffn
            ins = (f.w_gate, f.w_1) if f.w_gate is not None else (f.w_1,)
            n0, n1 = layer.norms[0], layer.norms[1]
            qkv = (a.w_q, a.w_k, a.w_v)
            products = [_parts(group) for group in (qkv, ins, (a.w_o,), (f.w_2,), (model.lm_head,))]
            if any(p is None for p in products):
                fastpath.prepare(model, layout="rows")  # laid out again since (by columns): by rows once more
                return _tensors(model)
            w_qkv, w_in, w_o, w_out, _ = products
            layers.append(
                (
                    (n0.weight, getattr(n0, "bias", None), w_qkv, _biases(qkv), _sizes(qkv)),
                    (w_o, a.w_o.bias, n1.weight, getattr(n1, "bias", None), w_in, _biases(ins), _sizes(ins)),
                    (w_out, f.w_2.bias),
                )
            )
        final = model.decoder.final_norm
        head = (None, None) if final is None else (final.weight, getattr(final, "bias", None))
        kept.update(stamp=stamp, layers=layers, head=(*head, _parts((model.lm_head,))))
    return kept["layers"]


def _biases(linears) -> tuple:
    return tuple(m.bias for m in linears)


def _sizes(linears) -> tuple:
    return tuple(m.out_features for m in linears)


def why_not_compiled(model, tokens: Tensor) -> str | None:
    """Why the compiled step of a model given to :func:`compile` does not serve this step (None: it does); the
    lean step serves instead."""
    if model not in _COMPILED:
        return "the model was not given to fast_decode.compile"
    if tokens.shape[0] != 1:
        return "a batch of several rows: the compiled reduction reads each weight once per row (BLAS's product serves)"
    if tokens.device.type != "cpu":
        return "the compiled step is the CPU's (off the CPU the kernels stream the weights themselves)"
    return None


def why_not_compile(model) -> str | None:
    """Why :func:`compile` would refuse ``model`` at once, from what it is (None: it may compile; the architecture,
    the device and the compiler are checked by :func:`compile` itself)."""
    try:
        model = decoding_model(model)
    except ValueError as e:
        return str(e)
    if not (hasattr(model, "decoder") and hasattr(model, "lm_head") and hasattr(model, "prefill")):
        return (
            f"a {type(model).__name__} decodes through its own layers (an attached HF model through HF's), not "
            "multihead's decoding step"
        )
    return None


def why_not_whole(model) -> str | None:
    """Why the whole step (one graph per step, :func:`compile` with ``whole_step=True``) cannot run ``model``'s
    layers where the per-layer compiled step can (None: it can)."""
    layers = model.decoder.layers
    shapes = {(a.num_heads, a.num_kv_heads, a.head_dim) for a in (layer.self_attn for layer in layers)}
    if len(shapes) > 1:
        return "its layers differ in heads or head size (one graph unrolls one layer shape)"
    if any(layer.self_attn.q_norm is not None or layer.self_attn.k_norm is not None for layer in layers):
        return "its attention normalises queries and keys (q/k norms), which the whole step does not run"
    rotary = [layer.self_attn.rotary for layer in layers]
    first = rotary[0]
    if any((r is None) != (first is None) for r in rotary) or (
        first is not None
        and any(r._frequencies != first._frequencies or not torch.equal(r.inv_freq, first.inv_freq) for r in rotary)
    ):
        return "its layers rotate with different frequencies (the whole step rotates every layer alike)"
    return None


def compile(model, *, whole_step: bool = False):
    """Decode ``model`` (a causal LM the lean step serves) through the compiled step at batch 1 from now on; returns
    the model. Lays its weights out by rows (in place, no copy) and compiles the graphs on a first token (a few
    seconds; inductor keeps them on disk for the next process). Refuses with the reason what it cannot compile, and
    changes nothing then. Gradients and batches still take the general and lean paths.

    Weights stored in bf16 or int8 (:func:`multihead.models.precision.convert`, before this call) are read where
    they are, upcast inside each reduction and scaled per row.

    ``whole_step=True``: one graph for the whole step (gpt-fast's shape) instead of one around each layer's
    attention: the cache's buffers are written in place and attended through a mask, so the rotation, the cache
    write and the attention are compiled too and the per-layer calls' guards are checked once a step. Refused with
    the reason (:func:`why_not_whole`) where the layers differ in shape or rotation, or normalise queries and keys.
    A first compile takes tens of seconds (40 s for SmolLM2 on 2 cores), and a cache that doubles compiles once
    more, with its length symbolic from then on; inductor keeps both on disk.

    An attached HF causal LM of a family multihead reads (Llama, Mistral, Qwen2) is compiled through its view
    (:func:`decoding_model`): its decoding steps then run the same graphs over HF's own weights."""
    why = why_not_compile(model)
    if why is not None:
        raise ValueError(
            f"the compiled decoding step runs multihead's own causal LMs, not this {type(model).__name__} ({why}): "
            "load the model's files with multihead.loading.load"
        )
    _compile_native(decoding_model(model), whole_step)
    return model


def _compile_native(model, whole_step: bool) -> None:
    reason = why_not_architecture(model)
    spec = _spec(model) if reason is None else reason
    if isinstance(spec, str):
        raise ValueError(f"this model cannot take the compiled decoding step: {spec}")
    whole = why_not_whole(model) if whole_step else None
    if whole is not None:
        raise ValueError(f"this model cannot take the whole compiled step: {whole} (fast_decode.compile(model) serves)")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("the compiled decoding step is the CPU's: move the model with .cpu() first")
    broken = why_not_inductor()
    if broken is not None:
        raise ValueError(
            f"torch.compile cannot build CPU code here ({broken}); inductor needs a C++ compiler and Python's headers "
            "(e.g. apt install g++ python3-dev): decode without fast_decode.compile"
        )
    fastpath.prepare(model, layout="rows")
    _COMPILED[model] = {"spec": spec}
    if whole_step:
        a = model.decoder.layers[0].self_attn
        _COMPILED[model].update(whole=(a.num_heads, a.num_kv_heads, a.head_dim), rotary=a.rotary)
    try:
        with torch.no_grad():
            cache = model.decoder.new_cache()
            _compiled_step(model, torch.zeros(1, dtype=torch.long), cache, position=0)
    except Exception as e:  # inductor's errors (no compiler, ...): nothing changed but the layout
        del _COMPILED[model]
        raise ValueError(
            f"torch.compile could not build the decoding step here ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "inductor needs a C++ compiler (e.g. apt install g++): decode without fast_decode.compile"
        ) from e


def _whole_step(model, tokens: Tensor, cache: KVCache, position: int | None = None) -> Tensor:
    kept = _COMPILED[model]
    layers = _tensors(model)
    graph = _whole_graph(kept["spec"], kept["whole"], weight_only(model))
    dec = model.decoder
    pos = cache.next_position if position is None else torch.tensor([position])
    x = model.embed(tokens[:, None])  # (1, 1, E)
    if model.config.embed_scale:
        x = x * torch.tensor(dec.config.d_model**0.5, dtype=x.dtype)
    if model.pos is not None:
        x = model.pos(x, positions=pos[:, None])
    h, g, d = kept["whole"]
    like = x.new_empty(1, g, 0, d)
    buffers = [kv.reserve(1, like) for kv in cache.self_attn]
    at = torch.tensor([cache.self_attn[0].length])
    rotary = kept["rotary"]  # the angles of this position, computed once here (the graph rotates with them)
    cos, sin = (None, None) if rotary is None else rotary._cos_sin(1, 0, x.device, x.dtype, pos[:, None])
    logits = graph(x, cos, sin, at, layers, [k for k, _ in buffers], [v for _, v in buffers], kept["head"])
    for kv in cache.self_attn:
        kv.filled(1)
    cache.next_position = pos + 1
    return logits


def _compiled_step(model, tokens: Tensor, cache: KVCache, position: int | None = None) -> Tensor:
    if "whole" in _COMPILED[model]:
        return _whole_step(model, tokens, cache, position)
    before, after, head = _graphs(_COMPILED[model]["spec"], weight_only(model))
    layers = _tensors(model)
    dec = model.decoder
    pos = cache.next_position if position is None else torch.tensor([position])
    positions = pos[:, None]  # (1, 1)
    x = model.embed(tokens[:, None])  # (1, 1, E)
    if model.config.embed_scale:
        x = x * torch.tensor(dec.config.d_model**0.5, dtype=x.dtype)
    if model.pos is not None:
        x = model.pos(x, positions=positions)
    for layer, kv, (pre, post, ffn) in zip(dec.layers, cache.self_attn, layers):
        a = layer.self_attn
        h, g, d = a.num_heads, a.num_kv_heads, a.head_dim
        q, k, v = before(x, *pre).split([h * d, g * d, g * d], -1)
        q, k, v = (
            q.view(1, 1, h, d).transpose(1, 2),
            k.view(1, 1, g, d).transpose(1, 2),
            v.view(1, 1, g, d).transpose(1, 2),
        )
        if a.q_norm is not None and a.k_norm is not None:
            q, k = a.q_norm(q), a.k_norm(k)
        if a.rotary is not None:
            q, k = a.rotary.rotate_pair(q, k, 0, positions)
        k, v = kv.append(k, v)  # (1, G, L, D)
        z = F.scaled_dot_product_attention(q, k, v, enable_gqa=g != h)  # (1, H, 1, D)
        x = after(x, z.transpose(1, 2).reshape(1, 1, h * d), *post, *ffn)
    cache.next_position = pos + 1
    return head(x, *_COMPILED[model]["head"])[:, -1]  # (1, V)


__all__ = [
    "why_not_whole",
    "ENABLED",
    "chosen",
    "forget",
    "compile",
    "compiled",
    "decoding_model",
    "step",
    "hooked",
    "why_not",
    "why_not_architecture",
    "why_not_compile",
    "why_not_compiled",
    "why_not_inductor",
]
