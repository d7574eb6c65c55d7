"""Reusable scratch buffers for the D-sized temporaries of one optimizer.

Every local step needs several temporaries as long as the model (the flat gradient, u, the trust
scores, comparison masks). Allocating them afresh costs more than the arithmetic on them: a
21 MB buffer comes back from the allocator as untouched pages, and faulting those in is
several times slower than one elementwise pass. A `Workspace` hands out the same storage at
every step instead.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


class Workspace:
    """Named flat buffers, grown on demand; `get` returns the first `n` elements."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._filled: dict[str, Hashable] = {}  # name -> key of what `filled` wrote
        self.hints: dict[Hashable, tuple[float, float]] = {}  # band.py: (centre, half-width)
        self.native: object = None  # step/native.py's Buffers, made once for the model's sizes

    def get(self, name: str, n: int, like: torch.Tensor,
            dtype: torch.dtype | None = None) -> torch.Tensor:
        """A contiguous 1-D buffer of n elements (uninitialised), on `like`'s device.

        Callers must not hold a buffer across another `get` of the same name.
        """
        dtype = like.dtype if dtype is None else dtype
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != like.device:
            buf = self._buffers[name] = torch.empty(n, dtype=dtype, device=like.device)
            self._filled.pop(name, None)
        return buf if buf.numel() == n else buf[:n]  # a view costs ~1 µs: per step, it adds up

    def constant(self, name: str, n: int, like: torch.Tensor, value: float,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
        """A buffer of n elements all equal to `value`, filled only when (re)allocated."""
        return self.filled(name, n, like, dtype, value, lambda buf: buf.fill_(value))

    def filled(self, name: str, n: int, like: torch.Tensor, dtype: torch.dtype | None,
               key: Hashable, fill: Callable[[torch.Tensor], object]) -> torch.Tensor:
        """A buffer of n elements that `fill` wrote, kept as long as `key` stays the same.

        `fill` gets the whole (fresh or re-keyed) buffer and must write every element. Callers
        must only read the result: a name used here must never be used with `get`.
        """
        buf = self.get(name, n, like, dtype)
        if name not in self._filled or self._filled[name] != key:
            fill(self._buffers[name])  # a fresh buffer is exactly n long: all of it
            self._filled[name] = key
        return buf


def scratch(ws: Workspace | None) -> Workspace:
    """`ws`, or a throwaway workspace for one-off calls (which then allocate, as before)."""
    return Workspace() if ws is None else ws
