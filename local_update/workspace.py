"""Reusable scratch buffers for the D-sized temporaries of one optimizer.

Every local step needs several temporaries as long as the model (the flat gradient, u, the trust
scores, comparison masks). Allocating them afresh costs more than the arithmetic on them: a
21 MB buffer comes back from the allocator as untouched pages, and faulting those in is
several times slower than one elementwise pass. A `Workspace` hands out the same storage at
every step instead.
"""

from __future__ import annotations

import torch


class Workspace:
    """Named flat buffers, grown on demand; `get` returns the first `n` elements."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, n: int, like: torch.Tensor,
            dtype: torch.dtype | None = None) -> torch.Tensor:
        """A contiguous 1-D buffer of n elements (uninitialised), on `like`'s device.

        Callers must not hold a buffer across another `get` of the same name.
        """
        dtype = like.dtype if dtype is None else dtype
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != like.device:
            buf = self._buffers[name] = torch.empty(n, dtype=dtype, device=like.device)
        return buf[:n]


def scratch(ws: Workspace | None) -> Workspace:
    """`ws`, or a throwaway workspace for one-off calls (which then allocate, as before)."""
    return Workspace() if ws is None else ws
