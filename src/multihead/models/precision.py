"""Weights stored in bf16 or int8 for decoding (weight-only): a causal LM's linear layers keep their weights in the
format and multiply float32 activations with them, so a step streams half (bf16) or a quarter (int8) of the bytes.

* ``bf16`` -- each weight rounded to bfloat16; the product runs in bfloat16 with float32 accumulation (oneDNN's, on
  CPUs with AVX-512 BF16 or AMX its native instructions), the activation rounded to bfloat16 on its way in and the
  result returned as float32;
* ``int8`` -- each weight row scaled by its largest magnitude over 127 and rounded (symmetric, per output row), the
  product PyTorch's own weight-only int8 kernel (``aten._weight_int8pack_mm``: float32 activations, int8 weights,
  float32 scales, as gpt-fast's int8 path uses it).

Norms, embeddings, attention, the KV cache and every KV policy stay float32. The output head is stored in the
format too, as llama.cpp's BF16 and Q8_0 files store it: where it is tied to the embedding (SmolLM2's), the head gets
its own copy in the format (the embedding keeps reading its float32 table), so a tied model holds that table twice,
once at full width and once in the format. :func:`convert` changes the model in place;
:func:`why_not` says what it cannot serve. The error against float32 is measured by ``multihead bench precision``
(max logit difference, greedy agreement, perplexity on held-out text).
"""

from __future__ import annotations

import functools
import types
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DTYPES = ("fp32", "bf16", "int8")
# the models convert() changed, and the format: kept here, not on the model (a copy of a model is converted anew)
_CONVERTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


PRODUCTS = ("library", "compiled")  # a row's product: PyTorch's kernel for the format, or inductor's reduction


def rowwise(x: Tensor, weight: Tensor, scales: Tensor | None) -> Tensor:
    """``x (..., in)`` times a weight stored by rows, written as the reduction inductor fuses into one pass over the
    stored bytes, accumulating in float32: a float32 or bf16 weight ``(out, in)`` (upcast inside the loop), or an
    int8 one as :func:`words` hands it, ``(out, in / 4)`` float32 words of four int8 each; then scaled per row.

    The int8 bytes are read as words because inductor's CPU code loads a vector of int8 eight at a time through a
    copy (1.5 GB/s here) but a vector of float32 whole (its words then bit-cast and each byte sign-extended by two
    shifts): 11.5 GB/s. Byte ``j`` of word ``i`` is column ``4 i + j``, so it meets the activation's column ``4 i + j``,
    which is gathered once into ``j``'s quarter of a contiguous row before the loop."""
    if weight.shape[-1] * 4 == x.shape[-1]:  # int8 words
        n = weight.shape[-1]
        w = weight.view(torch.int32)
        spread = x.reshape(*x.shape[:-1], n, 4)
        row = torch.cat([spread[..., j] for j in range(4)], -1)  # (..., in): column 4 i + j at j * n + i
        y = sum((row[..., None, j * n : (j + 1) * n] * ((w << (24 - 8 * j)) >> 24).float()).sum(-1) for j in range(4))
    else:
        y = (x[..., None, :] * weight.float()).sum(-1)
    return y if scales is None else y * scales


def words(weight: Tensor) -> Tensor:
    """What :func:`rowwise` reads of a stored weight: an int8 one ``(out, in)`` with ``in`` a multiple of 4 as
    ``(out, in / 4)`` float32 words (a view: the same bytes), anything else as it is."""
    if weight.dtype == torch.int8 and weight.shape[-1] % 4 == 0 and weight.is_contiguous():
        return weight.view(torch.float32)
    return weight


def own_code(fn):
    """``fn`` with a code object of its own. Dynamo keeps compiled graphs, and counts them against its recompile
    limit (8), per code object: a function compiled for each shape or spec gets its own, so one process may decode
    any number of models."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


@functools.cache
def reduction(fmt: str, shape: tuple[int, int], rows: str = "one"):
    """Inductor's compiled product of float32 rows with a weight of ``shape`` ``(out, in)`` stored in ``fmt``
    (called with :func:`words` of the stored weight); one compiled function per format and shape. ``rows="one"``:
    one row, every size fixed (a decoding step's); ``"many"``: the number of rows symbolic (call it through
    :func:`product`), one graph for every batch."""
    return torch.compile(own_code(rowwise), dynamic=False, fullgraph=True)


def product(fmt: str, x: Tensor, weight: Tensor, scales: Tensor | None) -> Tensor:
    """``x (rows, in)`` through inductor's reduction over a weight stored in ``fmt`` (:func:`words` of it): the
    one-row graph for one row, the graph with a symbolic number of rows for more."""
    shape = tuple(weight.shape)
    if x.shape[0] == 1:
        return reduction(fmt, shape)(x, words(weight), scales)
    torch._dynamo.mark_dynamic(x, 0)
    return reduction(fmt, shape, "many")(x, words(weight), scales)


class WeightOnlyLinear(nn.Module):
    """A linear layer whose weight is stored in ``fmt`` (``bf16`` or ``int8`` with per-row scales). ``weight``
    reads back the float32 values the format holds (what analyses and the general path see); :meth:`forward` uses
    the format's own product: ``kernel`` says which without gradients on the CPU (``library``: PyTorch's;
    ``compiled``: inductor's fused reduction, where the decoding step measured it faster for one row; a batch of
    rows takes it too, as one graph with the rows symbolic: on an AVX2 CPU it ran 5-6x PyTorch's int8 product at 2
    to 64 rows); everything else takes the library's."""

    kernel: str = "library"

    def __init__(self, linear: nn.Linear, fmt: str) -> None:
        super().__init__()
        if fmt not in ("bf16", "int8"):
            raise ValueError(f"weight-only formats are bf16 and int8, got {fmt!r}")
        self.fmt, self.in_features, self.out_features = fmt, linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        if fmt == "int8":
            scales = w.abs().amax(1).clamp_min(1e-12) / 127.0  # (out,)
            self.register_buffer("qweight", (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous())
            self.register_buffer("scales", scales.contiguous())
        else:
            self.register_buffer("qweight", w.to(torch.bfloat16).contiguous())
            self.scales = None
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    @property
    def weight(self) -> Tensor:
        """The float32 values the stored weight holds ``(out, in)`` (made on each read)."""
        if self.scales is not None:
            return self.qweight.float() * self.scales[:, None]
        return self.qweight.float()

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features)
        if self.kernel == "compiled" and not torch.is_grad_enabled() and x.device.type == "cpu":
            y = product(self.fmt, flat.float().contiguous(), self.qweight, self.scales)
        elif self.scales is not None:
            y = torch.ops.aten._weight_int8pack_mm(flat.float().contiguous(), self.qweight, self.scales)
        else:
            y = F.linear(flat.to(torch.bfloat16), self.qweight).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}"


def why_not(model, dtype: str) -> str | None:
    """Why ``model`` cannot decode with weights stored in ``dtype`` (None: it can)."""
    if dtype not in DTYPES:
        return f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}"
    if dtype == "fp32":
        return None
    if not (hasattr(model, "decoder") and hasattr(model, "lm_head") and hasattr(model, "prefill")):
        return (
            f"a {type(model).__name__} is not one of multihead's causal LMs (weight-only {dtype} serves their "
            "decoder's linear layers; an attached HF model keeps HF's weights)"
        )
    if any(p.device.type != "cpu" for p in model.parameters()):
        return f"weight-only {dtype} is written for the CPU: move the model with .cpu() first"
    from ..modules.attention import MultiHeadAttention

    for i, layer in enumerate(model.decoder.layers):
        if not isinstance(layer.self_attn, MultiHeadAttention):
            return f"layer {i}'s attention is {type(layer.self_attn).__name__}, whose projections the path does not convert"
        if getattr(layer, "cross_attn", None) is not None:
            return f"layer {i} has cross-attention (an encoder-decoder): weight-only {dtype} serves causal LMs"
    if dtype == "int8" and not _int8_kernel():
        return "this torch has no weight-only int8 kernel (aten._weight_int8pack_mm); use bf16"
    return None


def _int8_kernel() -> bool:
    try:
        torch.ops.aten._weight_int8pack_mm(torch.ones(1, 32), torch.ones(8, 32, dtype=torch.int8), torch.ones(8))
    except (RuntimeError, AttributeError):
        return False
    return True


def convert(model, dtype: str, *, head: bool = True):
    """Store ``model``'s decoder linear layers (attention projections, feed-forward) and its output head in
    ``dtype``, in place (a head tied to the embedding is untied: the head's copy is stored, the embedding keeps its
    float32 table); returns the model. ``head=False`` keeps the output head float32 (and tied): more bytes a step,
    logits nearer float32's. ``fp32`` changes nothing. Refused, with the reason, where the path cannot serve
    (:func:`why_not`)."""
    reason = why_not(model, dtype)
    if reason is not None:
        raise ValueError(reason)
    if dtype == "fp32":
        return model
    model.eval()
    for layer in model.decoder.layers:
        a = layer.self_attn
        a.fuse_qkv_at_inference = False  # the format's product per projection (no packed float32 copy)
        for name in ("w_q", "w_k", "w_v", "w_o"):
            _swap(a, name, dtype)
        ffn = layer.ffn
        if ffn is not None:
            for name in ("w_gate", "w_1", "w_2"):
                _swap(ffn, name, dtype)
    if head and isinstance(model.lm_head, nn.Linear):  # tied or not: the format stores its own copy
        model.lm_head = WeightOnlyLinear(model.lm_head, dtype)
    _CONVERTED[model] = dtype  # the decoding step reads this: what it knew of the model's layers is stale
    return model


def _swap(owner: nn.Module, name: str, dtype: str) -> None:
    linear = getattr(owner, name, None)
    if isinstance(linear, nn.Linear):
        setattr(owner, name, WeightOnlyLinear(linear, dtype))


def use(model, kernel: str) -> None:
    """Multiply rows with ``kernel`` (:data:`PRODUCTS`) in every converted layer of ``model`` (without gradients,
    on the CPU)."""
    if kernel not in PRODUCTS:
        raise ValueError(f"a weight-only product is one of {', '.join(PRODUCTS)}, got {kernel!r}")
    for m in model.modules():
        if isinstance(m, WeightOnlyLinear):
            m.kernel = kernel


def stored_shapes(model) -> list[tuple[int, int]]:
    """``(out, in)`` of every converted layer of ``model``, in order."""
    return [(m.out_features, m.in_features) for m in model.modules() if isinstance(m, WeightOnlyLinear)]


def weight_only(model) -> str | None:
    """The format :func:`convert` stored ``model``'s linear layers in (``bf16``, ``int8``), or None: float32."""
    return _CONVERTED.get(model)


__all__ = [
    "DTYPES",
    "PRODUCTS",
    "WeightOnlyLinear",
    "convert",
    "own_code",
    "product",
    "reduction",
    "rowwise",
    "words",
    "stored_shapes",
    "use",
    "weight_only",
    "why_not",
]
