"""What a client's inner optimizer starts each round from: `fresh` (zero moments, step counts
from 0: every FedAvg-style algorithm here) or `persist` (DiLoCo, Douillard et al. 2023; MuLoCo,
Thérien et al. 2025): the state its own optimizer ended its last round with.

`persist` keeps the whole optimizer state (Adam's m and v, Muon's momentum, SOAP's statistics,
the step counts; local_update/persist.py) as durable client state, exactly like SCAFFOLD's c_i
(client_app/client_state.py): in Flower's `context.state` and on disk under
`client-state-dir`, versioned by the round that wrote it, so a round re-run after a server crash
starts from the same state and a resumed run is bit-identical. It never crosses the wire: the
bytes of a round are FedAvg's.

Only the model restarts from the server's x each round. The step counts carry on (a client's
k-th step of all time, as torch's AdamW counts when it is kept), which is why the bias
corrections must count on k alone (`bias-correction='local'` or `'off'`; Algorithm.check).

Partial participation: a client keeps the state of the last round it took part in. One that
skips rounds comes back with that stale state (its moments describe an older model, its step
count lags the run's), as a DiLoCo worker does when it misses outer steps; nothing corrects it.
A state that is gone (a new machine, a wiped disk, another model) is reported in the reply's
`local-state-source` metric (0 none, 1 memory, 2 disk) and the client starts from zero, as in
its first round.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from adaptfl.core import wire
from adaptfl.core.params import component
from adaptfl.core.stage import ClientPart, ClientRound, PartOutput, Stage
from adaptfl.local_update.persist import export_local_state, import_local_state

if TYPE_CHECKING:
    from adaptfl.local_update import LocalUpdate

log = logging.getLogger(__name__)
STATE = "local-state"  # durable state name: <client-state-dir>/run-*/<client>/local-state.r<round>.pt


class LocalState(Stage):
    """Base: the inner optimizer starts fresh every round."""

    persists: ClassVar[bool] = False


@component("local_state", "fresh")
@dataclass(frozen=True)
class Fresh(LocalState):
    """A new optimizer state every round."""


@component("local_state", "persist")
@dataclass(frozen=True)
class Persist(LocalState):
    """The client's inner optimizer state carried across the rounds it takes part in."""

    persists = True

    def start(self, ctx: ClientRound) -> ClientPart:
        return _Persist(ctx)


class _Persist(ClientPart):
    def __init__(self, ctx: ClientRound) -> None:
        self.ctx = ctx
        self.stored, self.source = ctx.store.load(STATE)

    def configure(self, opt: LocalUpdate) -> None:
        """Runs first of the stages' hooks: what the server sends this round (v̄, Θ, Δ_G) is
        imported after it and wins over the kept copy of the same slots."""
        if self.stored is None:
            return
        why = import_local_state(opt, self.stored)
        if why is not None:
            log.warning("kept optimizer state unusable (%s): starting from zero", why)
            self.source = type(self.source)(0)

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        self.ctx.store.save(STATE, export_local_state(opt))
        return PartOutput(metrics={wire.LOCAL_STATE_SOURCE: int(self.source)})
