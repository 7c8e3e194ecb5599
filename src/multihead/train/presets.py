"""Named recipes for ``multihead train --preset NAME`` and ``multihead pretrain --preset NAME``, in one place.

A preset is a set of config overrides layered just above the task's defaults: a TOML file, flags and ``--set`` still
win over it (``--preset quick --epochs 5`` trains 5 epochs). ``quick`` trains a model worth looking at in about two
minutes on 2 CPU cores; what each reached, beside the full recipe (the defaults), is in the docs' "Quick runs" page
and in ``--help``. A preset may depend on the dataset (images of 8x8 and 28x28 pixels want different patches).

A new preset is one entry here: ``PRESETS[section][name] = (what it is, overrides or a function of the data name)``.
"""

from __future__ import annotations

from collections.abc import Callable

from .._config import ConfigError

Overrides = dict | Callable[[str], dict]


def _vision_quick(data: str) -> dict:
    if data == "digits":  # 8x8 images: 16 patches of 2x2 pixels, shifted by up to a pixel
        return {
            "data": {"shift": 1},
            "model": {"patch_size": 2},
            "optim": {"epochs": 80, "batch_size": 64, "lr": 2e-3},
        }
    return {  # Fashion-MNIST (28x28): 49 patches of 4x4 pixels, a 20,000-image training cut
        "data": {"limit": 20000},
        "optim": {"epochs": 2, "lr": 2e-3},
    }


PRESETS: dict[str, dict[str, tuple[str, Overrides]]] = {
    "train": {
        "quick": (
            "3 epochs of the default model (about a minute on rotten_tomatoes)",
            {"optim": {"epochs": 3}},
        ),
    },
    "g2p": {
        "quick": (
            "a 64-wide 2+2-layer encoder-decoder, 2 epochs of the whole training split; scored on 1,000 test words",
            {
                "model": {
                    "encoder": {"d_model": 64, "num_heads": 4, "num_layers": 2, "d_ff": 256},
                    "decoder": {"d_model": 64, "num_heads": 4, "num_layers": 2, "d_ff": 256},
                },
                "data": {"eval_limit": 2000, "test_limit": 1000},
                "optim": {"epochs": 2},
                "run": {"eval_words": 300, "beam": 3},
            },
        ),
    },
    "vision": {
        "quick": ("digits: 16 patches, 80 epochs; fashion_mnist: 20,000 images, 2 epochs", _vision_quick),
    },
    "pretrain": {
        "quick": (
            "a 3-layer 128-wide causal or masked LM, 500 steps of 32 x 64 tokens, a 4,000-token vocabulary",
            {
                "data": {"seq_len": 64, "vocab_size": 4000},
                "model": {"encoder": {"d_model": 128, "num_heads": 4, "num_layers": 3, "d_ff": 512}},
                "optim": {"steps": 500, "batch_size": 32},
                "run": {"eval_every": 250},
            },
        ),
    },
}


def names(section: str) -> list[str]:
    return sorted(PRESETS.get(section, {}))


def preset(section: str, name: str | None, data: str) -> dict:
    """The overrides of preset ``name`` for a task's ``section`` training on ``data`` (``{}`` for no preset)."""
    if not name:
        return {}
    known = PRESETS.get(section, {})
    if name not in known:
        choices = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"unknown preset {name!r} for this task; its presets: {choices}")
    overrides = known[name][1]
    return overrides(data) if callable(overrides) else overrides


def describe() -> str:
    """One line per task and preset, for ``--help``."""
    titles = {"train": "text", "g2p": "cmudict", "vision": "images", "pretrain": "pretrain"}
    return "; ".join(f"{titles.get(s, s)}: {n} ({what})" for s, ps in PRESETS.items() for n, (what, _) in ps.items())


__all__ = ["PRESETS", "describe", "names", "preset"]
