"""Second-moment sync of the FedAdamW / FedACT family (seed 000, Algorithm 1): the client
warm-starts v from the server's v̄ (zeros in round 1) and uploads its terminal v; the server
averages them, v̄ = mean v_i. `block` sends one mean per tensor (the FedAdamW paper's cheap
form); `none` keeps v local."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from adaptfl.core import wire
from adaptfl.core.contract import Record
from adaptfl.core.domain import MOMENT
from adaptfl.core.params import component
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, PartOutput, Stage


def _shape(block: bool):  # noqa: ANN202 - a Record shape
    return lambda spec, algorithm: spec.blocks() if block else spec.params()


class Moments(Stage):
    """Base: v stays local."""

    synced: ClassVar[bool] = False
    block: ClassVar[bool] = False

    def records_down(self) -> tuple[Record, ...]:
        return (Record(wire.V_BAR, _shape(self.block), "server-averaged v̄", MOMENT),) if self.synced else ()

    def records_up(self) -> tuple[Record, ...]:
        # v ≥ 0: a negative v̄ poisons every client's sqrt(v̂) next round
        return (Record(wire.V_LOCAL, _shape(self.block), "the client's terminal v", MOMENT),) \
            if self.synced else ()

    def start(self, ctx: ClientRound) -> ClientPart:
        return _SyncV(ctx.records.get(wire.V_BAR), self.block) if self.synced else ClientPart()

    def aggregate(self, agg: Aggregation) -> None:
        if self.synced:
            agg.new_extras[wire.V_BAR] = agg.combine(wire.V_LOCAL)


class _SyncV(ClientPart):
    def __init__(self, v_bar: Mapping[str, torch.Tensor] | None, block: bool) -> None:
        self.v_bar, self.block = v_bar, block

    def configure(self, opt: Any) -> None:
        if self.v_bar is None:
            return
        if self.block:  # one value per tensor: broadcast it to the tensor's shape
            shapes = {n: p for n, p in opt.named()}
            opt.import_state("exp_avg_sq", {n: v.reshape(()).expand_as(shapes[n])
                                            for n, v in self.v_bar.items()})
        else:
            opt.import_state("exp_avg_sq", self.v_bar)

    def finish(self, opt: Any, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        v = opt.export_state("exp_avg_sq")
        if self.block:
            v = {n: t.mean().reshape(1) for n, t in v.items()}
        return PartOutput(records={wire.V_LOCAL: {n: t.cpu() for n, t in v.items()}})


@component("moments", "none")
@dataclass(frozen=True)
class NoSync(Moments):
    """v stays on the client."""


@component("moments", "full")
@dataclass(frozen=True)
class FullSync(Moments):
    """v̄ per coordinate."""

    synced = True


@component("moments", "block")
@dataclass(frozen=True)
class BlockSync(Moments):
    """v̄ as one mean per tensor."""

    synced = True
    block = True
