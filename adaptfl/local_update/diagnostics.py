"""PosRatio and TopMass of the trust scores s = u ⊙ g (seed 000, App. A), measured by
`LocalUpdate` on local steps 1, 1+N, 1+2N, … (`diagnostics_every` = N) and read once per round.

They stay on the device as 0-dim float64 sums until `diagnostics()` reads them, so a step
never waits for the host; and they are observations only: the step is the same bit for bit
whether or not it is measured (tests/local_update/test_local_update_diagnostics.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from adaptfl.local_update.blocks import Block
from adaptfl.local_update.trust import pos_ratio, top_mass
from adaptfl.local_update.workspace import Workspace


class Diagnostics:
    """Mixin of `LocalUpdate` (needs `steps`, `diagnostics_every`, `rho`, `ref_lr`, `work`)."""

    steps: int
    diagnostics_every: int
    rho: float
    ref_lr: Any
    work: Workspace
    diagnostics_due: Callable[[], bool]  # LocalUpdate's: the step's door asks it first

    def _reset_diagnostics(self) -> None:
        self._diag: dict[str, torch.Tensor] = {}
        self._diag_count = 0
        self._diag_pending = False  # a due step had no direction to measure (SOAP's first)

    def diagnostics(self) -> dict[str, float]:
        """Mean PosRatio and TopMass over the steps that computed them (read once per round)."""
        if not self._diag_count:
            return {}
        return {k: float(v) / self._diag_count for k, v in self._diag.items()}

    def _measure(self, blocks: list[Block], chain: bool) -> bool:
        """Record PosRatio/TopMass if this step is due (steps 1, 1+N, 1+2N, …: a short round
        still measures), over the blocks with a direction of their own: SOAP's first step has
        none, so it is measured on the next step instead, never reported as a fake 0. Returns
        whether the chain about to run should record its own scores (it has all blocks);
        otherwise they are formed here, in scratch buffers, and the step is left alone."""
        due = self.diagnostics_due()
        measured = [b for b in blocks if b.moves] if due else []
        self._diag_pending = due and not measured
        if not measured:
            return False
        if chain and len(measured) == len(blocks):
            return True
        for b in measured:
            b.fill_g()
        self._record(self._scores(measured))
        return False

    def _scores(self, blocks: list[Block]) -> torch.Tensor:
        """s = u ⊙ g of these blocks, u = (1-ρ)·(c/L)·d + ρ·Δ_G as the chain forms it."""
        ref_lr = self.ref_lr
        n, like = sum(b.g.numel() for b in blocks), blocks[0].g
        u = torch.cat([b.scaled_direction(ref_lr).reshape(-1) for b in blocks],
                      out=self.work.get("diag.u", n, like))
        if self.rho > 0.0:
            u.mul_(1.0 - self.rho)
            if all(b.global_direction is not None for b in blocks):
                # cast: the all() above checked every block has one
                u.add_(torch.cat([cast(torch.Tensor, b.global_direction).reshape(-1) for b in blocks],
                                 out=self.work.get("diag.dg", n, like)), alpha=self.rho)
        g = torch.cat([b.g.reshape(-1) for b in blocks], out=self.work.get("diag.g", n, like))
        return g.mul_(u)

    def record_diagnostics(self, values: dict[str, torch.Tensor]) -> None:
        """Add one step's PosRatio and TopMass measured elsewhere on this optimizer's behalf
        (the cohort engine's, for all its clients at once: trust.rows_diagnostics)."""
        for k, v in values.items():
            v = torch.as_tensor(v, dtype=torch.float64)
            self._diag[k] = self._diag[k] + v if k in self._diag else v
        self._diag_count += 1

    def _record(self, scores: torch.Tensor) -> None:
        values = {"pos-ratio": pos_ratio(scores, self.work), "top-mass": top_mass(scores, ws=self.work)}
        for k, v in values.items():
            v = torch.as_tensor(v, dtype=torch.float64)
            self._diag[k] = self._diag[k] + v if k in self._diag else v
        self._diag_count += 1

