"""Host reads counted with the profiler: the CPU stand-in for "this code never syncs a GPU".

The usual ways of reading a tensor's value on the host go through ATen ops that the profiler
records on any device: `.item()`, `int(t)`, `float(t)` and a 0-dim tensor used as an index
(`aten::item` -> `aten::_local_scalar_dense`), `if t:` (`aten::is_nonzero`), and boolean-mask
indexing or `torch.where(cond)` (`aten::nonzero`, whose output size lives on the host).

Not caught on CPU: `.tolist()` / `.numpy()` and ops that read their input on the host inside
the kernel (CPU `bincount` sizes its output so, CUDA's syncs). The CUDA test under
`torch.cuda.set_sync_debug_mode("error")` catches those where a GPU is present.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero")
# Kernels whose CPU implementation reads a CPU scalar (the step count) inside; their CUDA
# implementation reads it on the device (torch.optim.AdamW(fused=True) keeps the step count on
# the GPU for that): reads nested in them are not the caller's.
DEVICE_SIDE_ON_CUDA = ("aten::_fused_adamw_", "aten::_fused_adam_")


def _inside(event: object, names: tuple[str, ...]) -> bool:
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def host_reads(fn: Callable[[], object]) -> list[str]:
    """The names of the host-reading ops that `fn()` calls (one entry per call)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events()
            if e.name in HOST_READS and not _inside(e, DEVICE_SIDE_ON_CUDA)]
