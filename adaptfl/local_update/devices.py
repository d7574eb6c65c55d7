"""Where local_update takes another code path on a CPU than on an accelerator, and the switch
that sends CPU tensors down the accelerator's path.

A GPU stalls whenever the host reads a value back, so the accelerator paths run fixed kernel
sequences; a CPU has nothing to wait for, so its paths may branch on counts, and they lay out
work for caches rather than for thousands of threads. Every such branch asks `cpu_path(t)`.
With `ACCELERATOR_PATHS_ON_CPU = True` (the tests' `accelerator_paths` fixture) a CPU tensor
takes the accelerator's branch, so CI runs the logic of the CUDA paths without a GPU. The
branches (docs/speed.md lists them too):

- `band.select`: CPU: the k-th largest by counting in a band around the last threshold (host
  reads); accelerator: the radix selection alone (radix.py, no host read).
- `radix._digits`, first digit: CPU: the high half-words as they lie in memory, one widening
  copy; accelerator: a shift and a mask.
- `radix._chunk_rows`: CPU: digit passes in chunks of about 1M entries that stay in cache;
  accelerator: all rows in one kernel.
- `step/choose.py` (`cpu_path`): CPU: the native form (step/native.py), FedACT's scores, band
  count and step as two C loops (native_source.py); accelerator: the fused form (and without a
  C compiler on a CPU too).
- not a branch of ours: `step.fused_adam.adam_direction_` runs torch's fused AdamW kernel on CPU and
  CUDA alike (its step count a tensor on the data's device, its lr negative), the eager passes
  on other devices (MPS, XPU) and under `fused_adam.EAGER`, which the tests set to run them on CPU.
"""

from __future__ import annotations

import torch

ACCELERATOR_PATHS_ON_CPU = False


def cpu_path(t: torch.Tensor) -> bool:
    """Whether work on `t` takes the CPU branch: on a CPU, unless the switch says otherwise."""
    return t.device.type == "cpu" and not ACCELERATOR_PATHS_ON_CPU
