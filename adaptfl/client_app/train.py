"""adaptfl's own local training loop: K steps of the session's algorithm on one partition.

Independent of Flower's transport: the ClientApp, the in-process engine and the server's
preflight check all run it. The partition goes to the device once per round and the batches are
indexed there (no host→device copy and no host read per step), unless it is too large for that.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections import OrderedDict

import torch

from adaptfl.client_app.session import ClientSession
from adaptfl.workloads import Split, sample_batches
from adaptfl.workloads.task import Loss

log = logging.getLogger(__name__)
PRELOAD_BYTES = 1 << 30  # a partition up to this size (as the model reads it) moves at once
# Preloaded partitions kept across rounds in one process (an engine, a simulation's Ray actor):
# reading 6,000 Fashion-MNIST rows as floats costs a client's round as much as a fifth of its
# 50 steps (docs/scale.md). Only splits that declare batch() pure (`deterministic_batches`).
PRELOAD_CACHE_BYTES = 512 << 20
# (id of the split, device, sha1 of the rows) -> (the split, x, y)
_preloaded: OrderedDict[tuple[int, str, str], tuple[Split, torch.Tensor, torch.Tensor]] = OrderedDict()


def round_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A per-(run, round, client) seed, stable across processes and Python versions."""
    digest = hashlib.sha256(f"{seed}/{server_round}/{partition_id}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def preload_partition(split: Split, indices: torch.Tensor, device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The whole partition as the model reads it, on the device; None if too large. Kept for
    later rounds (least recently used first out, PRELOAD_CACHE_BYTES in all) where the split
    says its batches are a pure function of the rows."""
    keep = getattr(split, "deterministic_batches", False)
    key = (id(split), str(device), hashlib.sha1(indices.numpy().tobytes()).hexdigest()) if keep else None
    if key is not None and key in _preloaded:
        _preloaded.move_to_end(key)
        kept, x, y = _preloaded[key]
        if kept is split:  # the very split (an id is reused only once the object is gone)
            return x, y
    x, y = split.batch(indices[:1])
    per_row = x.element_size() * x[0].numel() + y.element_size() * y[0].numel()
    if per_row * len(indices) > PRELOAD_BYTES:
        return None
    x, y = split.batch(indices)
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    if key is not None and per_row * len(indices) <= PRELOAD_CACHE_BYTES:
        _preloaded[key] = (split, x, y)
        while sum(kx.nbytes + ky.nbytes for _, kx, ky in _preloaded.values()) > PRELOAD_CACHE_BYTES:
            _preloaded.popitem(last=False)
    return x, y


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The forward pass's autocast dtype: bf16 on CUDA for auto/bf16, none (fp32) otherwise.
    Weights, gradients and optimizer state stay fp32 (the masters): autocast only casts the
    matmuls' inputs, so the update rules see fp32 gradients."""
    if precision == "bf16" and device.type != "cuda":
        raise ValueError(f"precision='bf16' needs a CUDA device; this client runs on {device}")
    return torch.bfloat16 if precision in ("auto", "bf16") and device.type == "cuda" else None


def run_local_steps(session: ClientSession, split: Split, loss_fn: Loss, indices: torch.Tensor,
                    client_id: int, steps: int | None = None, warn: bool = True,
                    precision: str = "fp32") -> None:
    """The recipe's K local steps (or `steps`) on the rows `indices` of `split` (`warn`: about
    a batch larger than the rows; the ClientApp says it once per client and run, the server's
    preflight step on a few rows never; `precision`: the run's runtime key)."""
    info, model, device = session.info, session.model, session.device
    cast = autocast_dtype(precision, device)
    seed = round_seed(info.seed, info.server_round, client_id)
    torch.manual_seed(seed)  # dropout etc. in models that have it
    generator = torch.Generator().manual_seed(seed)
    if warn and info.batch_size > len(indices):
        log.warning("batch-size=%d exceeds this client's %d examples: every step uses all of them",
                    info.batch_size, len(indices))
    batches = sample_batches(len(indices), info.batch_size, steps or info.local_steps, generator)
    model.train()
    preloaded = preload_partition(split, indices, device)
    if preloaded is not None:  # positions into the preloaded partition, all K at once
        positions = torch.stack(batches).to(device, non_blocking=True) if batches else None
    for k, batch in enumerate(batches):
        if preloaded is not None:
            if positions is None:  # set above whenever there are batches to run
                raise RuntimeError("preloaded batches without their positions")
            x, y = preloaded[0][positions[k]], preloaded[1][positions[k]]
        else:
            x, y = split.batch(indices[batch])
            x, y = x.to(device), y.to(device)
        # fp32: no autocast context at all (entering a disabled one costs ~30 µs a step)
        with contextlib.nullcontext() if cast is None else torch.autocast(device.type, dtype=cast):
            logits = model(x)
            loss = session.loss(x, logits, loss_fn(logits, y))
        session.backward(loss, logits, loss_fn)
        session.step()
