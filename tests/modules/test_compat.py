"""multihead's module in place of torch.nn.MultiheadAttention (:mod:`multihead.modules.compat`): PyTorch's
arguments, defaults and mask meaning, swapped in by one line -- also inside nn.TransformerEncoder -- with the outputs
and the gradients of PyTorch's own module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multihead.modules.compat import MultiheadAttention

E, H = 32, 4


def _grads(module: nn.Module) -> torch.Tensor:
    """Every parameter gradient, in PyTorch's packing (q, k, v stacked), flattened: comparable across the two."""
    if isinstance(module, nn.MultiheadAttention):
        parts = [module.in_proj_weight.grad, module.in_proj_bias.grad, module.out_proj.weight.grad]
    else:
        a = module.attention
        parts = [torch.cat([a.w_q.weight.grad, a.w_k.weight.grad, a.w_v.weight.grad])]
        parts += [torch.cat([a.w_q.bias.grad, a.w_k.bias.grad, a.w_v.bias.grad]), a.w_o.weight.grad]
    return torch.cat([p.flatten() for p in parts])


class Model(nn.Module):
    """A model as people write it with PyTorch's module."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)
        self.head = nn.Linear(E, 3)

    def forward(self, x, pad):
        out, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)
        return self.head(out.mean(1))


def test_one_line_swaps_pytorch_s_module_with_the_same_outputs_and_gradients():
    torch.manual_seed(0)
    theirs = Model()
    ours = Model()
    ours.load_state_dict(theirs.state_dict())
    ours.attn = MultiheadAttention.from_torch(ours.attn)  # the one line
    x = torch.randn(3, 7, E, requires_grad=True)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True  # PyTorch's meaning: True = padding
    xs = x.detach().clone().requires_grad_(True)
    a, b = theirs(x, pad), ours(xs, pad)
    assert (a - b).abs().max() < 1e-6
    a.square().sum().backward()
    b.square().sum().backward()
    assert (x.grad - xs.grad).abs().max() < 1e-6
    assert (_grads(theirs.attn) - _grads(ours.attn)).abs().max() < 1e-6


@pytest.mark.parametrize("train", [True, False])
def test_inside_nn_transformer_encoder_with_padding_and_a_causal_mask(train):
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(E, H, 64, dropout=0.0, batch_first=True)
    theirs = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).train(train)
    ours = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).train(train)
    ours.load_state_dict(theirs.state_dict())
    for each in ours.layers:
        each.self_attn = MultiheadAttention.from_torch(each.self_attn)  # the one line, per layer
    x = torch.randn(2, 6, E)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    causal = nn.Transformer.generate_square_subsequent_mask(6)  # float: 0 and -inf
    with torch.set_grad_enabled(train):
        a = theirs(x, mask=causal, src_key_padding_mask=pad, is_causal=True)
        b = ours(x, mask=causal, src_key_padding_mask=pad, is_causal=True)
    assert (a - b).abs().max() < 1e-6
    if train:
        a.sum().backward()
        b.sum().backward()
        for t, o in zip(theirs.layers, ours.layers):
            assert (_grads(t.self_attn) - _grads(o.self_attn)).abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["bool", "float", "per-head", "inverted"])
def test_pytorch_s_mask_meaning_sequence_first_and_averaged_weights(kind):
    torch.manual_seed(2)
    theirs = nn.MultiheadAttention(E, H)  # batch_first=False: (L, B, E)
    ours = MultiheadAttention.from_torch(theirs)
    q, kv = torch.randn(5, 2, E), torch.randn(8, 2, E)
    causal = torch.ones(5, 8, dtype=torch.bool).triu(1)  # True = may NOT attend, as PyTorch reads it
    mask = {
        "bool": causal,
        "float": torch.zeros(5, 8).masked_fill(causal, float("-inf")),
        "per-head": causal.expand(2 * H, 5, 8).clone(),
        "inverted": ~causal & (torch.arange(8) > 0),  # a mask of the other meaning: read as PyTorch reads it
    }[kind]
    pad = torch.tensor([[False] * 8, [False] * 6 + [True] * 2])
    a, wa = theirs(q, kv, kv, attn_mask=mask, key_padding_mask=pad)
    b, wb = ours(q, kv, kv, attn_mask=mask, key_padding_mask=pad)
    assert b.shape == (5, 2, E) and wb.shape == (2, 5, 8)  # averaged over heads by default, as PyTorch's
    assert (a - b).abs().max() < 1e-6 and (wa - wb).abs().max() < 1e-6
    _, per_head = ours(q, kv, kv, attn_mask=mask, key_padding_mask=pad, average_attn_weights=False)
    assert per_head.shape == (2, H, 5, 8)


def test_a_pytorch_state_dict_loads_and_the_module_goes_back():
    torch.manual_seed(3)
    theirs = nn.MultiheadAttention(E, H, batch_first=True)
    ours = MultiheadAttention(E, H, batch_first=True)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, E)
    assert (theirs(x, x, x)[0] - ours(x, x, x)[0]).abs().max() < 1e-6
    back = ours.to_torch()
    assert back.batch_first and (back(x, x, x)[0] - theirs(x, x, x)[0]).abs().max() < 1e-6


def test_what_has_no_equivalent_is_refused_by_name():
    with pytest.raises(ValueError, match="add_bias_kv and add_zero_attn have no multihead equivalent"):
        MultiheadAttention(E, H, add_bias_kv=True)
    ours = MultiheadAttention(E, H)
    x = torch.randn(5, 2, E)
    with pytest.raises(ValueError, match=r"a 3-D mask is \(batch \* num_heads, L, S\)"):
        ours(x, x, x, attn_mask=torch.zeros(3, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask of shape \(2, 1, 1, 5\): pass \(batch, S\)"):
        ours(x, x, x, key_padding_mask=torch.zeros(2, 1, 1, 5, dtype=torch.bool))
