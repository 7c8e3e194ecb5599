"""The decoding fast paths: the transposed-weight product of one or two rows, the grouped-query decoding step
without expanded keys, and the rotary angles shared by a stack's layers -- each equal to the plain computation."""

import torch
import torch.nn.functional as F
from torch import nn

from multihead.attention import attention
from multihead.modules import fastpath
from multihead.modules.positional import RotaryEmbedding


def test_transposed_product_equals_linear_and_follows_weight_updates():
    layer = nn.Linear(16, 48)
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        first = fastpath.linear(x, layer.weight, layer.bias, layer)
        assert fastpath.transposed_copy(layer) is not None  # the path was taken (one row, widening, CPU, no grad)
        assert torch.allclose(first, F.linear(x, layer.weight, layer.bias), atol=1e-6)
        layer.weight.mul_(2)  # an in-place update (an optimizer step) makes a new copy
        assert torch.allclose(
            fastpath.linear(x, layer.weight, layer.bias, layer), F.linear(x, layer.weight, layer.bias), atol=1e-6
        )


def test_transposed_product_is_not_used_with_grad_many_rows_or_narrowing():
    for layer, x, grad in (
        (nn.Linear(16, 48), torch.randn(1, 16), True),
        (nn.Linear(16, 48), torch.randn(3, 16), False),
        (nn.Linear(48, 16), torch.randn(1, 48), False),
    ):
        with torch.set_grad_enabled(grad):
            out = fastpath.linear(x, layer.weight, layer.bias, layer)
        assert fastpath.transposed_copy(layer) is None
        assert torch.equal(out, F.linear(x, layer.weight, layer.bias))


def test_grouped_query_decoding_step_equals_the_expanded_keys():
    q = torch.randn(2, 6, 1, 8)
    k, v = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    out, _ = attention(q, k, v, backend="sdpa")
    ref, _ = attention(q, k, v, backend="reference")
    assert torch.allclose(out, ref, atol=1e-6)


def test_rotary_angles_are_shared_only_for_the_same_positions():
    rot = RotaryEmbedding(8)
    x = torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)[None]
    a = rot.rotate(x, positions=pos)
    assert torch.equal(rot.rotate(x, positions=pos), a)  # the kept angles
    other = torch.arange(3, 8)[None]
    assert torch.allclose(rot.rotate(x, positions=other), RotaryEmbedding(8).rotate(x, positions=other))
    pos.add_(1)  # the same tensor changed in place: recomputed
    assert torch.allclose(rot.rotate(x, positions=pos), RotaryEmbedding(8).rotate(x, positions=pos))
