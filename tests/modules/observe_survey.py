"""Models that are not HF's, observed at the function level (:mod:`multihead.modules.observe`), each built with
random weights offline and checked three ways against its own computation:

* **outputs** -- with nothing captured the model's output is bit-identical to the unobserved model's, and with every
  pattern captured it is within 1e-5;
* **patterns** -- every site's per-head weights equal the model's own (``nn.MultiheadAttention`` asked for them with
  ``need_weights=True, average_attn_weights=False``; openai-whisper's own explicit path, ``disable_sdpa``);
* **ablation** -- zeroing head 0 of the first site through ``hook_z`` equals zeroing that head's columns of the
  site's output projection in a copy of the model.

``python tests/modules/observe_survey.py docs/observe-coverage.md`` writes the table; the tests run every row.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import _get_current_function_mode_stack as mode_stack

import observe_survey_vision as vision
from multihead.modules.anatomy import anatomy
from multihead.modules.capture import capture
from multihead.modules.observe import ObserveError, observe, unobserve


@dataclass(frozen=True)
class Row:
    library: str
    name: str
    build: Callable[[], tuple[nn.Module, tuple]]  # the model (eval, random weights) and its example input
    reference: Callable[[nn.Module, tuple], list[torch.Tensor]]  # every site's own weights, in call order
    # the output projection after a site's owner (its weight columns), given the owner and the heads' width H * D;
    # None where no projection reads the heads' outputs as they are (ablation then goes unchecked)
    projection: Callable[[nn.Module, int], nn.Module | None]
    needs: str | None = None  # a module to import, or None
    refused: str | None = None  # the reason the observer gives (a regular expression) where it refuses the model
    unsplit: str | None = None  # why zeroing hook_z is not zeroing the projection's columns here (ablation unchecked)


def _mha_weights(model: nn.Module, inputs: tuple) -> list[torch.Tensor]:
    """Each nn.MultiheadAttention call's own per-head weights: the call repeated with need_weights=True."""
    seen: list[torch.Tensor] = []
    busy: list[bool] = []

    def again(mod, args, kwargs, out):
        if busy:  # the repeated call itself
            return
        kw = {**kwargs, "need_weights": True, "average_attn_weights": False}
        q, k, v = (list(args) + [kw.pop(n, None) for n in ("query", "key", "value")][len(args) :])[:3]
        busy.append(True)
        try:
            with torch.no_grad():
                seen.append(mod(q, k, v, **kw)[1])
        finally:
            busy.pop()

    handles = [
        m.register_forward_hook(again, with_kwargs=True)
        for m in model.modules()
        if isinstance(m, nn.MultiheadAttention)
    ]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _whisper_weights(model: nn.Module, inputs: tuple) -> list[torch.Tensor]:
    """openai-whisper's own explicit path (``disable_sdpa``): each attention's scores, softmaxed as it does."""
    import whisper.model as wm

    seen: list[torch.Tensor] = []
    handles = [
        m.register_forward_hook(lambda mod, a, out: seen.append(F.softmax(out[1], -1)))
        for m in model.modules()
        if isinstance(m, wm.MultiHeadAttention)
    ]
    try:
        with torch.no_grad(), wm.disable_sdpa():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    return model, (torch.randn(2, 7, 32),)


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, 2)

    def forward(self, tgt, memory):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.decoder(tgt, memory, tgt_mask=mask, tgt_is_causal=True)


def _decoder():
    torch.manual_seed(1)
    return _Decoder().eval(), (torch.randn(2, 5, 32), torch.randn(2, 8, 32))


class _Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(32, 4, 2, 2, 64, dropout=0.0, batch_first=True)

    def forward(self, src, tgt):
        return self.t(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]))


def _transformer():
    torch.manual_seed(2)
    return _Transformer().eval(), (torch.randn(2, 8, 32), torch.randn(2, 5, 32))


class _WeightsAsked(nn.Module):
    """A caller of nn.MultiheadAttention that asks for the averaged weights (PyTorch's default)."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.ff = nn.Linear(32, 32)

    def forward(self, x):
        out, weights = self.attn(x, x, x)
        return self.ff(out) + weights.sum()


def _weights_asked():
    torch.manual_seed(3)
    return _WeightsAsked().eval(), (torch.randn(1, 6, 32),)


def _whisper():
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(
        n_mels=80,
        n_audio_ctx=16,
        n_audio_state=32,
        n_audio_head=4,
        n_audio_layer=2,
        n_vocab=100,
        n_text_ctx=8,
        n_text_state=32,
        n_text_head=4,
        n_text_layer=2,
    )
    torch.manual_seed(4)
    model = Whisper(dims).eval()
    # openai-whisper leaves the decoder's positional embedding uninitialised (torch.empty: a checkpoint fills it);
    # random weights here, or the output is whatever the memory held (NaN included)
    nn.init.normal_(model.decoder.positional_embedding, std=0.02)
    return model, (torch.randn(1, 80, 32), torch.randint(0, 100, (1, 5)))


class _WhisperByHand(nn.Module):
    """openai-whisper with its SDPA switched off (``disable_sdpa``): each attention written by hand."""

    def __init__(self, whisper: nn.Module):
        super().__init__()
        self.whisper = whisper

    def forward(self, mel, tokens):
        import whisper.model as wm

        with wm.disable_sdpa():
            return self.whisper(mel, tokens)


def _whisper_by_hand():
    model, inputs = _whisper()
    return _WhisperByHand(model).eval(), inputs


def _mha_projection(owner: nn.Module, width: int) -> nn.Module:
    return owner.out_proj


ROWS = [
    Row("torch", "nn.TransformerEncoder (key padding: none)", _encoder, _mha_weights, _mha_projection),
    Row("torch", "nn.TransformerDecoder (causal mask, cross-attention)", _decoder, _mha_weights, _mha_projection),
    Row("torch", "nn.Transformer (encoder, decoder, cross)", _transformer, _mha_weights, _mha_projection),
    Row("torch", "nn.MultiheadAttention asked for its weights", _weights_asked, _mha_weights, _mha_projection),
    Row(
        "openai-whisper",
        "Whisper (encoder, causal decoder, cross)",
        _whisper,
        _whisper_weights,
        lambda o, width: o.out,
        "whisper",
    ),
    Row(
        "openai-whisper",
        "Whisper, attention by hand (disable_sdpa)",
        _whisper_by_hand,
        _whisper_weights,
        lambda o, width: o.out,
        "whisper",
    ),
]
ROWS += [
    Row(
        "torchvision",
        "VisionTransformer (nn.MultiheadAttention)",
        vision.tv_vit,
        vision.own_weights,
        vision.projection,
        "torchvision",
    ),
    Row(
        "torchvision",
        "SwinTransformer (shifted windows, by hand)",
        vision.tv_swin,
        vision.own_weights,
        vision.projection,
        "torchvision",
    ),
    Row(
        "torchvision",
        "SwinTransformer V2 (cosine attention, by hand)",
        lambda: vision.tv_swin(v2=True),
        vision.own_weights,
        vision.projection,
        "torchvision",
    ),
    Row(
        "torchvision",
        "MaxVit (block and grid attention, einsum)",
        vision.tv_maxvit,
        vision.own_weights,
        vision.projection,
        "torchvision",
        refused="5-D scores",
    ),
    Row(
        "open_clip",
        "CLIP, image and text towers (nn.MultiheadAttention)",
        vision.clip,
        vision.own_weights,
        vision.projection,
        "open_clip",
    ),
    Row(
        "open_clip",
        "CLIP, open_clip's own attention block (heads scaled)",
        lambda: vision.clip(custom=True),
        vision.own_weights,
        vision.projection,
        "open_clip",
    ),
]
ROWS += [
    Row(
        "timm",
        f"{family}: {name}",
        vision.timm_model(name, kwargs),
        vision.own_weights,
        vision.projection,
        "timm",
        refused=vision.TIMM_REFUSED.get(family),
        unsplit=vision.TIMM_UNSPLIT.get(family),
    )
    for family, (name, kwargs) in vision.TIMM.items()
]


def _pair(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest difference between each site's captured weights and the model's own, paired in call order (the
    model's other softmaxes, of other shapes, skipped); inf where a site finds no weights of its shape."""
    worst, rest = 0.0, iter(want)
    for g in got:
        w = next((w for w in rest if w.numel() == g.numel()), None)
        if w is None:
            return math.inf
        worst = max(worst, float((g - w.reshape(g.shape)).abs().max()))
    return worst


def check(row: Row) -> dict:
    """The three checks of one row (module docstring): ``{"sites", "outputs", "patterns", "ablation"}`` with the
    largest differences found; ``{"refused": reason}`` where the observer refuses the model."""
    model, inputs = row.build()
    with torch.no_grad():
        plain = model(*inputs)
    ablated_ref = copy.deepcopy(model)
    try:
        observe(model, *inputs, example_batch=inputs[0].shape[0])
    except ObserveError as e:
        return {"refused": str(e)}
    try:
        want = row.reference(model, inputs)
        body = anatomy(model)
        site = body.sites[0]
        modes: list[int] = []  # the function modes in force at each attention owner while nothing is captured
        owners = dict(model.named_modules())
        spies = [
            owners[s.name].register_forward_pre_hook(lambda m, a: modes.append(len(mode_stack()))) for s in body.sites
        ]
        with torch.no_grad():
            try:
                untouched = model(*inputs)
            finally:
                for spy in spies:
                    spy.remove()
            with capture(model) as cache:
                captured = model(*inputs)
            # what the site's module puts out, plain and with head 0 zeroed: the head mattered where they differ
            at_site: list[torch.Tensor] = []
            spy = owners[site.name].register_forward_hook(
                lambda m, a, out: at_site.append(out[0] if isinstance(out, tuple) else out)
            )
            try:
                model(*inputs)
                handle = site.module.hook_z.add_hook(lambda z, hook: z.index_fill(1, torch.tensor([0]), 0))
                try:
                    ablated = model(*inputs)
                finally:
                    handle.remove()
            finally:
                spy.remove()
        got = cache.patterns()
    finally:
        unobserve(model)
    ref_owner = dict(ablated_ref.named_modules())[site.name]
    projection = None if row.unsplit else row.projection(ref_owner, site.num_heads * site.head_dim)
    if projection is not None:
        with torch.no_grad():
            projection.weight[:, : site.head_dim] = 0
            by_hand = ablated_ref(*inputs)
    return {
        "sites": len(body.sites),
        "heads": f"{site.num_heads} x {site.head_dim}",
        "scale": float(plain.abs().max()),
        # nothing of the observer's runs when nothing is captured: no function mode, every call the model's own.
        # (Bit-identity with the plain run is not asked: BLAS may round differently from one call to the next.)
        "untouched": len(modes) == len(body.sites) and not any(modes),
        "untouched_diff": float((untouched - plain).abs().max()),
        "outputs": float((captured - plain).abs().max()),
        "patterns": _pair(got, want),
        "ablation": None if projection is None else float((ablated - by_hand).abs().max()),
        "ablation_effect": float((ablated - plain).abs().max()),
        # at the site: how much zeroing head 0 moved its module's output, relative to that output's size
        "site_effect": float((at_site[-1] - at_site[0]).abs().max() / at_site[0].abs().max()),
    }


def table() -> str:
    lines = [
        "# Models that are not HF's, observed",
        "",
        "Generated by `python tests/modules/observe_survey.py docs/observe-coverage.md` (the tests run every row):",
        "each model built with random weights offline, observed with `multihead.modules.observe.observe`, and checked",
        "against its own computation. *untouched*: with nothing captured, no call is replaced (no function mode is in force at any attention",
        "module) and the output is the plain one to rounding; *outputs*: with",
        "every pattern captured, the largest difference from the plain output; *patterns*: the largest difference",
        "between each site's per-head weights and the model's own; *ablation*: zeroing head 0 of the first site",
        "through `hook_z` against zeroing that head's columns of its output projection (and how much the output moved).",
        "",
        "| library | model | sites | heads x size | untouched | outputs | patterns | ablation (effect) |",
        "|---|---|---:|---|---|---:|---:|---:|",
    ]
    refused: list[str] = []
    unsplit: list[str] = []
    for row in ROWS:
        if row.needs and importlib.util.find_spec(row.needs) is None:
            raise SystemExit(f"{row.library} is not installed here: run this in the environment `make vision` makes")
        r = check(row)
        if "refused" in r:
            refused.append(f"- **{row.library}**, {row.name}: {r['refused']}")
            continue
        ablation = "-" if r["ablation"] is None else f"{r['ablation']:.1e}"
        if row.unsplit:
            ablation = "-*"
            unsplit.append(f"- **{row.library}**, {row.name}: {row.unsplit}.")
        lines.append(
            f"| {row.library} | {row.name} | {r['sites']} | {r['heads']} | {'yes' if r['untouched'] else 'NO'} | "
            f"{r['outputs']:.1e} | {r['patterns']:.1e} | {ablation} ({r['ablation_effect']:.2f}) |"
        )
    lines += [
        "",
        "*ablation* `-`: no linear projection right after the attention reads the heads' outputs (a norm, an",
        "activation or a reshape into a convolution comes first), so there is no column to zero by hand.",
        "*ablation* `-*`: zeroing `hook_z` (the attention's output) is not zeroing the projection's columns, because:",
        "",
        *unsplit,
        "",
        "Refused by the observer, with its reason:",
        "",
        *refused,
        "",
        *_without_attention(),
    ]
    lines += [
        "",
        "Attention written by hand (`matmul -> softmax -> matmul`) is observed where its weights are `(B, H, Lq, Lk)`, or",
        "`(B*H, Lq, Lk)` when observe is told the example's batch (`example_batch=`); otherwise refused by name.",
        "",
    ]
    return "\n".join(lines)


def _without_attention() -> list[str]:
    """timm's architecture families not in the survey, each checked here to have no softmax attention in the model
    tried (the smallest it registers): the observer sees no attention call in one forward pass."""
    import timm

    small = ("atto", "femto", "pico", "nano", "xxs", "tiny", "xs", "small", "s0", "t0", "b0", "m0", "mini", "lite")

    def size(name: str) -> tuple:
        return (next((i for i, w in enumerate(small) if w in name), len(small)), len(name), name)

    found = []
    for family in sorted(set(timm.list_modules()) - set(vision.TIMM)):
        name = min(timm.list_models(module=family), key=size)
        model = timm.create_model(name, pretrained=False).eval()
        x = torch.randn(1, *model.pretrained_cfg.get("input_size", (3, 224, 224)))
        try:
            observe(model, x, example_batch=1)
        except ObserveError as e:
            if "no attention call was seen" in str(e):
                found.append(f"{family} ({name})")
                continue
            raise SystemExit(f"timm's {family} ({name}) is refused ({e}): add it to the survey's refusals") from None
        raise SystemExit(f"timm's {family} ({name}) has attention: add it to the survey (observe_survey_vision.TIMM)")
    return [
        f"timm's other {len(found)} architecture families have no softmax attention in the model tried (the observer",
        f"sees no attention call in one forward pass, and says so by name): {', '.join(found)}.",
    ]


if __name__ == "__main__":
    from pathlib import Path

    text = table()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    print(text)
