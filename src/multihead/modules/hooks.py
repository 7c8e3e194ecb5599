"""Named hook points (TransformerLens style).

A :class:`HookPoint` is an identity module placed where analysis code may read or edit an activation, e.g.
``layers.1.attn.hook_pattern  # (B, H, Lq, Lk)``. Attach ordinary PyTorch forward hooks to it; a hook that returns a
tensor replaces the activation. Modules ask :attr:`HookPoint.active` before computing anything only a hook needs
(such as the attention weights on a fused backend), so an unused hook point costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn


from torch.nn.modules import module as _module

_T = TypeVar("_T")


def _global_hooks() -> bool:
    """Whether hooks registered for every module (``register_module_forward_hook``) exist."""
    return bool(getattr(_module, "_global_forward_hooks", None) or getattr(_module, "_global_forward_pre_hooks", None))


class HookPoint(nn.Module):
    """Identity with a stable name; forward hooks on it read or replace the activation. Without hooks a call
    returns its input without entering ``nn.Module.__call__`` (a decoding step passes ~20 hook points per layer)."""

    def forward(self, x: _T) -> _T:
        return x

    def __call__(self, x: _T) -> _T:
        if self._forward_hooks or self._forward_pre_hooks or _global_hooks():
            return super().__call__(x)
        return x

    @property
    def active(self) -> bool:
        return bool(self._forward_hooks) or bool(self._forward_pre_hooks)

    def add_hook(self, fn: Callable[[Tensor, HookPoint], Tensor | None]) -> torch.utils.hooks.RemovableHandle:
        """Register ``fn(activation, hook) -> replacement | None``; returns a handle with ``.remove()``."""
        return self.register_forward_hook(lambda module, args, out: fn(out, module))


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """All hook points of ``model`` by their stable dotted names."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}
