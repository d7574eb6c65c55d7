"""Each cohort client's own batches and random stream, as `client_app/train.py` draws them.

The positions of every client's K batches come from its own seed (`round_seed`), the same draw
as its one-at-a-time loop; where every partition is preloaded, the cohort's stacked batches are
gathered a block of steps at a time. Each client's global RNG state is kept and swapped in
around anything that draws (dropout, Sophia's sampled labels), so its stream is independent of
who else is in the cohort.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from adaptfl.client_app.app import LocalJob
from adaptfl.client_app.train import preload_partition, round_seed
from adaptfl.workloads import sample_batches

log = logging.getLogger(__name__)

GATHER_BYTES = 16 << 20  # the most a block of stacked batches holds (all clients, several steps)


@dataclass
class Batches:
    """Every client's K batches: positions into its preloaded partition (train.py's draw)."""

    data: list[tuple[torch.Tensor, torch.Tensor] | None]  # per client: its rows on the device
    positions: list[list[torch.Tensor]]  # per client: K index tensors into its rows
    _block: tuple[int, int, torch.Tensor, torch.Tensor] | None = None  # (first step, steps, x, y)

    def of(self, jobs: Sequence[LocalJob], i: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        pre, batch = self.data[i], self.positions[i][k]
        if pre is not None:
            return pre[0][batch], pre[1][batch]
        job = jobs[i]
        x, y = job.split.batch(job.indices[batch])
        return x.to(job.session.device), y.to(job.session.device)

    def stacked(self, jobs: Sequence[LocalJob], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step k's batches of all clients, [C, B, ...] (equal batch sizes: `signature`). Where
        every partition is preloaded, gathered a block of steps at a time: one index per client
        per block instead of one per client per step."""
        if any(pre is None for pre in self.data):
            pairs = [self.of(jobs, i, k) for i in range(len(jobs))]
            return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        if self._block is None or not self._block[0] <= k < self._block[0] + self._block[1]:
            self._block = self._gather(k)
        first, _, x, y = self._block
        return x[:, k - first], y[:, k - first]

    def _gather(self, first: int) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        x0, y0 = self.data[0]  # type: ignore[misc]
        c, batch = len(self.data), len(self.positions[0][first])
        per_step = c * batch * (x0[0].nbytes + y0[0].nbytes)
        steps = max(1, min(len(self.positions[0]) - first, GATHER_BYTES // max(per_step, 1)))
        x = x0.new_empty(c, steps * batch, *x0.shape[1:])
        y = y0.new_empty(c, steps * batch, *y0.shape[1:])
        for i, (pre, positions) in enumerate(zip(self.data, self.positions, strict=True)):
            rows = torch.cat(positions[first:first + steps])
            torch.index_select(pre[0], 0, rows, out=x[i])  # type: ignore[index]
            torch.index_select(pre[1], 0, rows, out=y[i])  # type: ignore[index]
        return first, steps, x.view(c, steps, batch, *x.shape[2:]), y.view(c, steps, batch, *y.shape[2:])


def draw_batches(jobs: Sequence[LocalJob]) -> tuple[Batches, list[torch.Tensor]]:
    """(the batches, each client's global RNG state) as `run_local_steps` seeds them."""
    data, positions, rng = [], [], []
    for job in jobs:
        info = job.session.info
        seed = round_seed(info.seed, info.server_round, job.client_id)
        torch.manual_seed(seed)  # the client's own stream: dropout, Sophia's sampled labels
        rng.append(torch.get_rng_state())
        generator = torch.Generator().manual_seed(seed)
        if job.warn:
            log.warning("batch-size=%d exceeds this client's %d examples: every step uses all of "
                        "them", info.batch_size, len(job.indices))
        pos = sample_batches(len(job.indices), info.batch_size, info.local_steps, generator)
        pre = preload_partition(job.split, job.indices, job.session.device)
        positions.append([p.to(job.session.device) for p in pos] if pre is not None else pos)
        data.append(pre)
        job.session.model.train()
    return Batches(data, positions), rng


@contextlib.contextmanager
def own_stream(states: list[torch.Tensor], i: int) -> Iterator[None]:
    """Run with client i's global RNG state, and keep where it got to (CPU generator: this
    engine's path; on CUDA each client's loop form draws from the CUDA generator in turn)."""
    torch.set_rng_state(states[i])
    try:
        yield
    finally:
        states[i] = torch.get_rng_state()
