"""Second-moment sync of the FedAdamW / FedACT family (seed 000, Algorithm 1): the client
warm-starts v from the server's v̄ (zeros in round 1) and uploads its terminal v; the server
averages them, v̄ = mean v_i. `block` sends one mean per tensor (the FedAdamW paper's cheap
form); `none` keeps v local: each client starts v from zero every round (with the default
`local-state='fresh'`), which is FedAda2's zero initialisation (Lee et al. 2025,
arXiv 2410.18117): nothing sent.

v need not travel every round (compression; docs/compression.md):

    v-sync-every=N   replies carry v in rounds 1, N+1, 2N+1, …; in the rounds between, the
                     replies carry no v record and the server keeps the last v̄.
    v-sync-until=W   replies carry v in rounds 1..W only (0: every round of the run); from W+1
                     on v̄ is frozen. 1-bit Adam (Tang et al. 2021) observes that v
                     stabilises after a warm-up and freezes it as one v shared by all workers;
                     here the shared v̄ is the server's, so it goes on warm-starting every
                     client (sampled or not in the rounds before), and each client's local steps
                     move their own copy within the round as in every other round.

The server broadcasts the v̄ it keeps in every round: a sampled client keeps no copy of its
own (fresh local state, partial participation), so a v̄ sent only when it changes would not
reach the clients that missed that round. What the schedule saves is the clients' uploads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from adaptfl.core import wire
from adaptfl.core.contract import Record, Shape
from adaptfl.core.domain import MOMENT
from adaptfl.core.params import component, param
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, PartOutput, Stage

if TYPE_CHECKING:
    from adaptfl.local_update import LocalUpdate


def _shape(block: bool) -> Shape:
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

    def records_down_repeated(self) -> tuple[str, ...]:
        # v̄ is sent unchanged in the rounds whose replies carry no v
        return tuple(r.name for r in self.records_down()) if self.skips_uploads() else ()

    def uploads_on(self, server_round: int) -> bool:
        """Whether this round's replies carry v."""
        return self.synced

    def upload_schedule(self) -> str:
        """The run-config keys that thin v's uploads, as set ('' where v has no schedule)."""
        return ""

    def records_up_on(self, server_round: int) -> tuple[Record, ...]:
        return self.records_up() if self.uploads_on(server_round) else ()

    def start(self, ctx: ClientRound) -> ClientPart:
        return _SyncV(ctx.records.get(wire.V_BAR), self.block, self.uploads_on(ctx.info.server_round)) \
            if self.synced else ClientPart()

    def aggregate(self, agg: Aggregation) -> None:
        # a round without v keeps the last v̄: not written here, the state's copy stays
        if self.uploads_on(agg.server_round):
            agg.new_extras[wire.V_BAR] = agg.combine(wire.V_LOCAL)


class _SyncV(ClientPart):
    def __init__(self, v_bar: Mapping[str, torch.Tensor] | None, block: bool, upload: bool) -> None:
        self.v_bar, self.block, self.upload = v_bar, block, upload

    def configure(self, opt: LocalUpdate) -> None:
        if self.v_bar is None:
            return
        if self.block:  # one value per tensor: broadcast it to the tensor's shape
            shapes = {n: p for n, p in opt.named()}
            opt.import_state("exp_avg_sq", {n: v.reshape(()).expand_as(shapes[n])
                                            for n, v in self.v_bar.items()})
        else:
            opt.import_state("exp_avg_sq", self.v_bar)

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        if not self.upload:
            return PartOutput()
        v = opt.export_state("exp_avg_sq")
        if self.block:
            v = {n: t.mean().reshape(1) for n, t in v.items()}
        return PartOutput(records={wire.V_LOCAL: {n: t.cpu() for n, t in v.items()}})


@component("moments", "none")
@dataclass(frozen=True)
class NoSync(Moments):
    """v stays on the client."""


@dataclass(frozen=True)
class _Synced(Moments):
    v_sync_every: int = param(1, "replies carry v every N rounds (1, N+1, 2N+1, …); between them "
                              "the server keeps and sends the last v̄", within=(1, None))
    v_sync_until: int = param(0, "replies carry v in rounds 1..W only, then v̄ stays frozen "
                              "(1-bit Adam's warm-up); 0: no freeze", within=(0, None))
    synced = True

    def uploads_on(self, server_round: int) -> bool:
        if self.v_sync_until and server_round > self.v_sync_until:
            return False
        return (server_round - 1) % self.v_sync_every == 0

    def skips_uploads(self) -> bool:
        return self.v_sync_every > 1 or self.v_sync_until > 0

    def upload_schedule(self) -> str:
        return f"v-sync-every={self.v_sync_every} v-sync-until={self.v_sync_until}"


@component("moments", "full")
@dataclass(frozen=True)
class FullSync(_Synced):
    """v̄ per coordinate."""


@component("moments", "block")
@dataclass(frozen=True)
class BlockSync(_Synced):
    """v̄ as one mean per tensor."""

    block = True
