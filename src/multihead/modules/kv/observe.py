"""What a KV policy may read of one attention call to rank its keys: :class:`Observed` (the attention each key
received, per query head; the keys, values and the queries' statistics), and the reference sums behind it.

Shape legend: ``B`` batch, ``H`` query heads, ``G`` key/value heads, ``N`` kept positions, ``Q`` query positions of a
call, ``D`` head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

OBSERVE_CHUNK = 256  # query rows per block when the received attention is summed (bounded memory at long prompts)


class Observed:
    """What a policy may read of one call to rank its keys: the attention each kept key received from the call's
    queries (:meth:`received`, per query head), the keys themselves ``(B, G, N, D)`` (rotated; rotation keeps their
    norms), and :meth:`per_kv_head` to sum query heads over the key/value head they share.

    Live (``q`` given) the sums are computed from the call's queries; recorded (``recorded``: ``{last: (B, H, N)}``
    from a prompt read with ``new_cache(record=True)``) they are read back, so that one prefill serves every
    policy."""

    def __init__(
        self,
        k: Tensor,
        q: Tensor | None = None,
        q_pos=None,
        k_pos=None,
        sinks=None,
        recorded=None,
        *,
        values: Tensor | None = None,
        rope: Tensor | None | bool = None,
        next_position: int | None = None,
    ):
        self.keys, self._q, self._q_pos, self._k_pos, self._sinks = k, q, q_pos, k_pos, sinks
        self.values = values  # (B, G, N, D), for the policies that weigh a key by its value's norm
        # the rotary frequencies (D'/2,) the keys and queries were turned with (None: no rotation; False: unknown)
        self.rope = rope
        self._next = next_position
        self._sums: dict = {} if recorded is None else dict(recorded)

    @property
    def next_position(self) -> int | None:
        """The position of the first token after this call (read from the queries' positions only when asked)."""
        if self._next is None and self._q_pos is not None:
            self._next = int(self._q_pos[:, -1].max()) + 1
        return self._next

    def observe(self, key):
        """What a recorded prompt keeps for ``key``: a query window (an int or None, :meth:`received`) or
        ``("queries", skip)`` (:meth:`queries`)."""
        return self.queries(key[1]) if isinstance(key, tuple) else self.received(key)

    def queries(self, skip: int = 0) -> tuple[Tensor, Tensor]:
        """The mean ``(B, H, D)`` and covariance ``(B, H, D, D)`` of the call's queries before their rotation,
        leaving out the first ``skip`` (the sinks' outliers): the statistics of the queries to come."""
        key = ("queries", skip)
        if key not in self._sums:
            if self._q is None:
                raise ValueError(
                    f"a recorded prompt keeps the statistics of its queries past the first "
                    f"{[k[1] for k in self._sums if isinstance(k, tuple)]}; this policy skips {skip} (prefill under "
                    "the policy instead)"
                )
            if self.rope is False:
                raise ValueError(
                    "this policy models the queries to come, which needs the model's rotary frequencies; this "
                    "model's could not be read (several rotary embeddings?): choose another policy"
                )
            q = self._q.float()
            if isinstance(self.rope, Tensor):  # back to the unrotated queries: turn each by minus its position
                q = _turn(q, self.rope, -self._q_pos.float()[:, None, :])
            q = q[:, :, skip:] if q.shape[2] > skip else q
            mu = q.mean(2)  # (B, H, D)
            centred = q - mu[:, :, None]
            self._sums[key] = (mu, torch.einsum("bhsi,bhsj->bhij", centred, centred) / q.shape[2])
        return self._sums[key]

    def received(self, last: int | None = None) -> Tensor:
        """``(B, H, N)``: the weight each key received, summed over the call's queries (its ``last`` ones only)."""
        if last not in self._sums:
            if self._q is None:
                raise ValueError(
                    f"a recorded prompt keeps the attention of {_windows(self._sums)}; this policy reads that of "
                    f"{_windows({last: None})}: record it (new_cache(record=[policy]) records what that policy reads; "
                    "record=True, what every policy reads at its default settings), or prefill under the policy"
                )
            self._sums[last] = received_attention(
                self._q, self.keys, self._q_pos, self._k_pos, sinks=self._sinks, last=last
            )
        return self._sums[last]

    def per_kv_head(self, score: Tensor) -> Tensor:
        """``(B, H, N)`` per query head -> ``(B, G, N)`` summed over each key/value head's query heads."""
        return _per_kv_head(score, self.keys.shape[1])


def _windows(sums: dict) -> str:
    """The query windows ``sums`` holds, in words."""
    said = ["every query" if k is None else f"the last {k}" for k in sums if not isinstance(k, tuple)]
    return ", ".join(said) or "no query"


def received_attention(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    window: int | None = None,
    sinks: Tensor | None = None,
    last: int | None = None,
    chunk: int = OBSERVE_CHUNK,
) -> Tensor:
    """``(B, H, N)``: the attention each key received, summed over the queries (the last ``last`` only, if given).

    ``q`` ``(B, H, Q, D)``, ``k`` ``(B, G, N, D)`` (rotated), ``q_pos`` ``(B, Q)``, ``k_pos`` ``(B, G, N)``: a query
    sees keys at or before its position (and within ``window`` of it on a sliding-window layer). The weights are the
    reference formula (:func:`multihead.attention.attention_weights`), computed ``chunk`` query rows at a time."""
    from ...attention.registry import attention_weights

    b, h, nq, _ = q.shape
    g = k.shape[1]
    start = 0 if last is None else max(nq - last, 0)
    total = q.new_zeros(b, h, k.shape[2], dtype=torch.float32)
    kp = k_pos.repeat_interleave(h // g, 1)[:, :, None, :]  # (B, H, 1, N)
    for s in range(start, nq, chunk):
        qp = q_pos[:, None, s : s + chunk, None]  # (B, 1, c, 1)
        allowed = kp <= qp
        if window is not None:
            allowed = allowed & (kp > qp - window)
        w = attention_weights(q[:, :, s : s + chunk].float(), k.float(), mask=allowed, sinks=sinks)  # (B, H, c, N)
        total += w.sum(2)
    return total


def _turn(x: Tensor, rope: Tensor, positions: Tensor) -> Tensor:
    """``x`` ``(..., N, D)`` turned by ``positions`` (broadcast to ``(..., N)``, any sign) at the rotary
    frequencies ``rope`` ``(R,)``: the first ``2R`` dims in the "rotate half" layout (HF Llama, GPT-NeoX), the rest
    untouched (partial rotary)."""
    angles = positions[..., None] * rope.to(x.device, torch.float32)  # (..., N, R)
    return _rotate(x, angles.cos(), angles.sin())


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` with its pairs ``(i, i + R)`` turned by the angles whose cosines and sines are ``cos``, ``sin``
    ``(..., R)`` (averages of rotations are allowed: the map stays linear)."""
    r = cos.shape[-1]
    x1, x2, rest = x[..., :r], x[..., r : 2 * r], x[..., 2 * r :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)


def _per_kv_head(score: Tensor, g: int) -> Tensor:
    """``(B, H, N)`` query-head scores summed over each key/value head's group: ``(B, G, N)``."""
    b, h, n = score.shape
    return score.view(b, g, h // g, n).sum(2)


def _arange(n: int, like: Tensor, start: int = 0) -> Tensor:
    return torch.arange(start, start + n, device=like.device).expand(*like.shape[:-1], n)
