"""The vision and vision-language rows of the survey of models that are not HF's (``observe_survey.py``):
torchvision, timm (one model of every architecture family that has attention) and open_clip, each built with random
weights offline (``pretrained=False``).

Each model's own weights come from running it without the observer: a copy with timm's fused attention switched off
(its explicit ``softmax(q k^T) v``), every softmax's output recorded as the model computes it, and, for calls that
stay fused, the weights by ``scaled_dot_product_attention``'s formula written here; ``nn.MultiheadAttention`` calls
repeated with ``need_weights=True``. These libraries need torchvision, which does not import beside the project's
torch build: ``make vision`` makes the environment they run in (torch 2.14.1 + torchvision 0.29.1).
"""

from __future__ import annotations

import copy
import math
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

_SDPA = F.scaled_dot_product_attention
_SOFTMAX = F.softmax
_TORCH_SOFTMAX = torch.softmax
_TENSOR_SOFTMAX = torch.Tensor.softmax


def _sdpa_weights(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``softmax(q k^T * scale + mask)``, as ``F.scaled_dot_product_attention`` documents it."""
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return scores.softmax(-1)


def own_weights(model: nn.Module, inputs: tuple) -> list[torch.Tensor]:
    """Every attention's weights as the model computes them without the observer, in call order (module
    docstring); other softmaxes come along and are skipped by shape where the survey pairs them with sites."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if getattr(m, "fused_attn", None) is True:  # timm: the explicit path instead of the fused kernel
            m.fused_attn = False
    seen: list[torch.Tensor] = []
    busy: list[bool] = []

    def softmax(original):
        def call(*args, **kwargs):
            if busy:  # F.softmax calls Tensor.softmax: one record per softmax the model asks for
                return original(*args, **kwargs)
            busy.append(True)
            try:
                out = original(*args, **kwargs)
            finally:
                busy.pop()
            seen.append(out.detach().clone())
            return out

        return call

    def sdpa(*args, **kwargs):
        if not busy:
            with torch.no_grad():
                busy.append(True)
                try:
                    seen.append(_sdpa_weights(*args, **kwargs))
                finally:
                    busy.pop()
        return _SDPA(*args, **kwargs)

    def enter(mod, args):  # nn.MultiheadAttention: what it calls inside is not recorded ...
        busy.append(True)

    def again(mod, args, kwargs, out):  # ... the call is repeated for its per-head weights
        kw = {**kwargs, "need_weights": True, "average_attn_weights": False}
        q, k, v = (list(args) + [kw.pop(n, None) for n in ("query", "key", "value")][len(args) :])[:3]
        try:
            if len(busy) == 1:  # not the repeated call itself
                seen.append(mod(q, k, v, **kw)[1])
        finally:
            busy.pop()

    handles = []
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            handles.append(m.register_forward_pre_hook(enter))
            handles.append(m.register_forward_hook(again, with_kwargs=True))
    try:
        with (
            torch.no_grad(),
            mock.patch.object(F, "scaled_dot_product_attention", sdpa),
            mock.patch.object(F, "softmax", softmax(_SOFTMAX)),
            mock.patch.object(torch, "softmax", softmax(_TORCH_SOFTMAX)),
            mock.patch.object(torch.Tensor, "softmax", softmax(_TENSOR_SOFTMAX)),
        ):
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def projection(owner: nn.Module, width: int) -> nn.Module | None:
    """The linear or 1x1-convolution projection right after an attention module that reads its heads' outputs
    (``width`` = heads x head size input features), under the names these libraries use; None where there is none."""
    for name in ("proj", "out_proj", "o_proj", "to_out", "out", "proj_out"):
        found = getattr(owner, name, None)
        if not isinstance(found, nn.Module):
            continue
        for m in found.modules():
            w = getattr(m, "weight", None)
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)) and w is not None and w.shape[1] == width:
                return m
    return None


def _lively(model: nn.Module) -> nn.Module:
    """Every parameter a library initialises to one constant (layer scales of 1e-5, norms whose weight starts at
    zero so a residual branch starts silent) made random around it, so that every head changes the output."""
    g = torch.Generator().manual_seed(15)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


# ---- torchvision ---------------------------------------------------------------------------------------------


def tv_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(10)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64)
    return _lively(model.eval()), (torch.randn(2, 3, 32, 32),)


def tv_swin(v2: bool = False):
    from torchvision.models import swin_transformer as sw

    torch.manual_seed(11)
    extra = {"block": sw.SwinTransformerBlockV2, "downsample_layer": sw.PatchMergingV2} if v2 else {}
    model = sw.SwinTransformer(
        patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], **extra
    )
    return _lively(model.eval()), (torch.randn(2, 3, 32, 32),)


def tv_maxvit():
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(12)
    model = MaxVit(
        input_size=(32, 32),
        stem_channels=16,
        partition_size=2,
        block_channels=[16, 32],
        block_layers=[1, 1],
        head_dim=8,
        stochastic_depth_prob=0.0,
    )
    return _lively(model.eval()), (torch.randn(2, 3, 32, 32),)


# ---- open_clip -----------------------------------------------------------------------------------------------


class _Clip(nn.Module):
    """A CLIP model's two towers, image and text, returning both embeddings side by side."""

    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip = clip

    def forward(self, image, text):
        return torch.cat([self.clip.encode_image(image), self.clip.encode_text(text)], -1)


def clip(custom: bool = False):
    import open_clip

    torch.manual_seed(13)
    extra = {"block_type": "custom", "scale_heads": True} if custom else {}
    model = open_clip.CLIP(
        embed_dim=32,
        vision_cfg=open_clip.CLIPVisionCfg(layers=2, width=32, head_width=8, patch_size=8, image_size=32, **extra),
        text_cfg=open_clip.CLIPTextCfg(context_length=8, vocab_size=100, width=32, heads=4, layers=2, **extra),
    )
    return _lively(_Clip(model).eval()), (torch.randn(2, 3, 32, 32), torch.randint(0, 100, (2, 8)))


# ---- timm ----------------------------------------------------------------------------------------------------

# One model of each timm architecture family (module) that has attention, the smallest the family registers, some
# made smaller with the model's own arguments; built with random weights at the input size its config names.
TIMM = {
    "beit": ("beit_base_patch16_224", {"depth": 2}),
    "byoanet": ("halonet26t", {}),
    "cpubone": ("cpubone_nano", {}),
    "crossvit": ("crossvit_tiny_240", {}),
    "convit": ("convit_tiny", {}),
    "davit": ("davit_tiny", {}),
    "deepseek_vit": ("deepseek_vit_412m", {"depth": 2}),
    "deit": ("deit_tiny_patch16_224", {}),
    "edgenext": ("edgenext_xx_small", {}),
    "efficientformer": ("efficientformer_l1", {}),
    "efficientformer_v2": ("efficientformerv2_s0", {}),
    "eva": ("eva02_tiny_patch14_224", {}),
    "fastvit": ("fastvit_sa12", {}),
    "gcvit": ("gcvit_xxtiny", {}),
    "gemma4_vit": ("gemma4_vit_167m", {"depth": 2}),
    "hieradet_sam2": ("sam2_hiera_tiny", {}),
    "iformer": ("iformer_s", {}),
    "levit": ("levit_128s", {}),
    "lowformer": ("lowformer_b0", {}),
    "maxxvit": ("maxvit_rmlp_pico_rw_256", {}),
    "metaformer": ("caformer_s18", {}),
    "mobilenetv5": ("mobilenetv5_300m", {"input_size": (3, 256, 256)}),
    "mobilevit": ("mobilevit_xxs", {}),
    "mvitv2": ("mvitv2_tiny", {}),
    "naflexvit": ("naflexvit_base_patch16_siglip", {"depth": 2}),
    "nextvit": ("nextvit_small", {}),
    "pit": ("pit_ti_224", {}),
    "pvt_v2": ("pvt_v2_b0", {}),
    "qwen3_vit": ("qwen3_vit_88m", {"depth": 2, "img_size": 224, "input_size": (3, 224, 224)}),
    "swin_transformer": ("swin_tiny_patch4_window7_224", {}),
    "swin_transformer_v2": ("swinv2_tiny_window8_256", {}),
    "swin_transformer_v2_cr": ("swinv2_cr_tiny_ns_224", {}),
    "tiny_vit": ("tiny_vit_5m_224", {}),
    "tnt": ("tnt_s_legacy_patch16_224", {}),
    "vision_transformer": ("vit_tiny_patch16_224", {}),
    "vision_transformer_hybrid": ("vit_tiny_r_s16_p8_224", {}),
    "vision_transformer_relpos": ("vit_relpos_small_patch16_224", {}),
    "vision_transformer_sam": ("samvit_base_patch16", {"depth": 2}),
    "vitamin": ("vitamin_small_224", {}),
    "visformer": ("visformer_tiny", {}),
    "volo": ("volo_d1_224", {}),
    "xcit": ("xcit_nano_12_p16_224", {}),
    # refused, with the observer's reason
    "byobnet": ("botnet26t_256", {}),
    "csatv2": ("csatv2", {}),
    "cait": ("cait_xxs24_224", {}),
    "efficientvit_msra": ("efficientvit_m0", {}),
    "hiera": ("hiera_tiny_224", {}),
    "nest": ("nest_tiny", {}),
    "shvit": ("shvit_s1", {}),
    "twins": ("twins_svt_small", {}),
}
# where zeroing a head's columns of the projection is not what zeroing its attention output does, and why
TIMM_UNSPLIT = {
    "mvitv2": "adds its pooled queries to the heads' outputs before the projection (residual pooling), so the "
    "projection reads more than the attention's output",
}
TIMM_REFUSED = {
    "shvit": "multiplies its values by its weights from the left",
    "csatv2": "computes attention by hand over 2-D scores",
    "convit": r"mixed with another tensor of their size \(gated positional attention\)",
    "efficientformer_v2": "mixes its attention scores through a learned projection",
    "vision_transformer_sam": "calls attention on 3-D queries",
    "cait": "mixes its attention scores through a learned projection",
    "efficientvit_msra": "multiplies its values by its weights from the left",
    "hiera": "calls attention on 5-D queries",
    "nest": "calls attention on 5-D queries",
    "twins": "calls attention on 5-D queries",
}


def timm_model(name: str, kwargs: dict):
    def build():
        import timm

        torch.manual_seed(14)
        args = dict(kwargs)
        size = args.pop("input_size", None)
        model = _lively(timm.create_model(name, pretrained=False, **args).eval())
        return model, (torch.randn(1, *(size or model.pretrained_cfg.get("input_size", (3, 224, 224)))),)

    return build
