"""NVIDIA's kvpress as ``multihead bench kv`` runs it: its presses by name (:data:`PRESSES`, each beside the multihead
policy it is paired with), :func:`make_press`, and :class:`PressSide`, HF's own model from the folder, one read per
context and each press applied to that read through its own hook.

kvpress 0.5.5 needs transformers >= 4.56, < 5.3, so it runs from ``.venv-hf4`` (``make kvpress`` or ``make hf4``:
transformers 4.57.6); nothing here is imported where kvpress is absent.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

# each kvpress press (as built from its compression ratio) and the multihead policy it is paired with
PRESSES = {
    "StreamingLLMPress": "window",
    "SnapKVPress": "snapkv",
    "ObservedAttentionPress": "h2o",
    "TOVAPress": "tova-layer",
    "KnormPress": "knorm",
    "PyramidKVPress": "pyramidkv",
    "ExpectedAttentionPress": "expected",
    "AdaKVPress(SnapKVPress)": "adakv",
    "CriticalKVPress(SnapKVPress)": None,
}
EAGER = ("ObservedAttentionPress",)  # presses that read the attention weights: HF's eager attention
INSTALL = "make kvpress (then run .venv-hf4/bin/multihead bench kv)"


def make_press(name: str, fraction: float):
    """kvpress's press ``name`` keeping ``fraction`` of the keys (``compression_ratio = 1 - fraction``);
    ``Outer(Inner)`` wraps one press in another (AdaKV, CriticalKV)."""
    import kvpress

    ratio = 1 - fraction
    if "(" in name:
        outer, inner = name.rstrip(")").split("(")
        return getattr(kvpress, outer)(press=getattr(kvpress, inner)(compression_ratio=ratio))
    return getattr(kvpress, name)(compression_ratio=ratio)


def press_settings(press) -> dict:
    """A press's class and the attributes it was made with (a dataclass's fields, or what its own ``__init__``
    set, as CriticalKV's), less its compression ratio; a press it wraps as one such dict."""
    import dataclasses

    out: dict = {"class": type(press).__name__}
    for name, value in vars(press).items():
        if name == "compression_ratio" or name.startswith("_"):
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out[name] = press_settings(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = repr(value)
    return out


def _tensor_bytes(cache) -> int:
    """Bytes of every key and value tensor an HF cache holds (masked entries count: they are held)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


class PressSide:
    """HF's model from the folder; one read per context, each press applied to it through its own hook."""

    side = "kvpress"

    def __init__(self, folder: Path):
        import kvpress  # noqa: F401  (registers the pipeline; a missing package is named by the caller)
        from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.models, self.pipes = {}, {}
        for impl in ("sdpa", "eager"):
            m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=impl).eval()
            self.models[impl] = m
            self.pipes[impl] = pipeline("kv-press-text-generation", model=m, tokenizer=self.tokenizer, device="cpu")

    def names(self) -> list[str]:
        return list(PRESSES)

    @torch.no_grad()
    def read(self, ids: list[int]):
        """The context read once (no press): each attention layer's inputs and output, and the full cache."""
        from transformers import DynamicCache

        model = self.models["sdpa"]
        seen: dict[int, tuple[dict, tuple]] = {}
        hooks = []
        for i, layer in enumerate(model.model.layers):

            def grab(module, args, kwargs, output, i=i):
                seen[i] = ({k: v for k, v in kwargs.items() if k != "past_key_values"}, output)

            hooks.append(layer.self_attn.register_forward_hook(grab, with_kwargs=True))
        cache = DynamicCache()
        t0 = time.perf_counter()
        try:
            model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
        finally:
            for h in hooks:
                h.remove()
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        return {"ids": ids, "length": len(ids), "layers": seen, "kv": kv, "seconds": time.perf_counter() - t0}

    def press(self, name: str, fraction: float):
        return make_press(name, fraction)

    def settings(self, name: str) -> dict:
        """What the press ``name`` is beyond the keys it keeps: its class and its fields (a wrapped press's too),
        less the compression ratio."""
        return press_settings(make_press(name, 0.5)) if name != "full" else {"class": "DynamicCache"}

    @torch.no_grad()
    def compressed(self, read, name: str, fraction: float):
        from transformers import DynamicCache

        impl = "eager" if name in EAGER else "sdpa"
        model = self.models[impl]
        cache = DynamicCache()
        for module in (layer.self_attn for layer in model.model.layers):
            module.masked_key_indices = None  # what a prefill resets (kvpress's attention patch)
        if name == "full":
            for i, (k, v) in enumerate(read["kv"]):
                cache.update(k.clone(), v.clone(), i)
        elif name in EAGER:  # the press reads the attention weights: its own prefill, with eager attention
            with self.press(name, fraction)(model):
                model.model(input_ids=torch.tensor([read["ids"]]), past_key_values=cache)
        else:
            press = self.press(name, fraction)
            for i, (k, v) in enumerate(read["kv"]):
                cache.update(k.clone(), v.clone(), i)
            with press(model):  # the press set up on the model as kvpress sets it up; its hook called on the read
                for i, layer in enumerate(model.model.layers):
                    kwargs, output = read["layers"][i]
                    press.forward_hook(layer.self_attn, [], {**kwargs, "past_key_values": cache}, output)
        lengths = [cache.get_seq_length(i) for i in range(len(cache))]
        return {
            "cache": cache,
            "impl": impl,
            "length": read["length"],
            "lengths": lengths,
            "bytes": _tensor_bytes(cache),
        }

    @torch.no_grad()
    def answer(self, state, question: list[int], max_new: int) -> tuple[str, int, float]:
        """kvpress's pipeline's own answer (greedy, positions after the whole context), then the answer's keys
        dropped from the cache (as its pipeline does between questions)."""
        pipe = self.pipes[state["impl"]]
        t0 = time.perf_counter()
        text = pipe.generate_answer(
            question_ids=torch.tensor([question]),
            cache=state["cache"],
            context_length=state["length"],
            max_new_tokens=max_new,
        )
        seconds = time.perf_counter() - t0
        grown = (
            state["cache"].get_seq_length(0) - state["lengths"][0]
        )  # the question and all answer tokens but the last
        pipe._remove_answer_from_cache(state["cache"], state["lengths"])
        return text, max(grown - len(question) + 1, 1), seconds


__all__ = ["EAGER", "INSTALL", "PRESSES", "PressSide", "make_press", "press_settings"]
