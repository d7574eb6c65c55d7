"""A component with a part on each side of the wire (correction, moment sync, Θ sharing,
client terms): its records, its client part for one round, its server aggregation.

Client side: `start(ctx)` returns a `ClientPart` for the round, whose hooks the training loop
calls: `configure` the optimizer (warm starts, Δ_G), add to the `loss` before backward,
`correct_` the gradients before the step, and `finish` (durable state, reply records, metrics).
Server side: `payload(state)` are the records to send (a subset of `down`), `aggregate(agg)`
writes the new server state from the accepted replies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from adaptfl.core.contract import Metric, ModelSpec, Record
from adaptfl.core.params import Component
from adaptfl.core.wire import DELTA, NUM_EXAMPLES

if TYPE_CHECKING:
    from adaptfl.algorithms.algorithm import Algorithm
    from adaptfl.local_update.shell import LocalUpdate

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class RoundInfo:
    """This round's values, the same on both sides (sent in the recipe)."""

    server_round: int
    num_rounds: int
    lr: float  # the main rule's lr of this round (after the schedule)
    lr_scale: float  # the schedule's factor this round (Muon's AdamW half follows it)
    weight_decay: float
    local_steps: int
    batch_size: int
    step_offset: int  # global steps before this round's first: (r-1)·K
    seed: int
    run_key: str = ""  # names this job's durable client state (same across a resume)
    diagnostics_every: int = 1
    local_epochs: float = 0.0  # > 0: each client's K is steps_for(rows) (local-epochs)

    def steps_for(self, rows: int) -> int:
        """K of a client with `rows` examples: ceil(E·rows/batch) under local-epochs (at least 1),
        else local-steps. Server and client compute it alike (the server from the claimed
        num-examples, so a reply's K is no separate claim)."""
        if self.local_epochs <= 0.0 or rows <= 0:
            return self.local_steps
        return max(1, math.ceil(self.local_epochs * rows / self.batch_size))

    def for_client(self, rows: int) -> RoundInfo:
        """This round's values as a client with `rows` examples runs them (its own K)."""
        steps = self.steps_for(rows)
        return replace(self, local_steps=steps, step_offset=(self.server_round - 1) * steps)


@dataclass
class ClientData:
    """What stages that need the data may read (MimeLite's ∇f_i(x)). A client's share of the
    federation (HaFedHo's p_i) is not here: only the server knows |D| (algorithms/components/
    hafedho.py)."""

    num_examples: int = 0  # |D_i|, this client's own examples (MimeLite samples positions of it)
    full_batches: Callable[[], Any] | None = None  # iterable of (x, y) over the whole partition
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # the task's loss
    # iterable of (x, y) over the given positions 0..num_examples-1: lets a stage draw a random
    # sample (MimeLite's mime-grad-examples); without it a bounded pass reads full_batches' first rows
    batches_of: Callable[[torch.Tensor], Any] | None = None
    sample_seed: int = 0  # this client's own seed for such samples (the ClientApp: its partition id)


@dataclass
class ClientRound:
    """What a stage's client part may read."""

    model: torch.nn.Module  # at the global model x^r when parts start
    algorithm: Algorithm
    info: RoundInfo
    records: Mapping[str, Tensors]  # the message's extra ArrayRecords, on the model's device
    store: Any  # durable client state (client_app/client_state.py)
    data: ClientData
    start: Tensors = field(init=False)  # x^r of every trainable parameter (detached copies)
    # what the reply claims as num-examples; set by the session just before `finish`
    num_examples: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.start = {n: p.detach().clone() for n, p in self.params.items()}

    @property
    def params(self) -> dict[str, torch.nn.Parameter]:
        """The trainable parameters (frozen ones take no part: core/contract.py)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}


@dataclass
class PartOutput:
    records: dict[str, Tensors] = field(default_factory=dict)  # reply ArrayRecords
    metrics: dict[str, float | int] = field(default_factory=dict)  # reply metrics


class ClientPart:
    """A stage's client side for one round; every hook does nothing by default."""

    def configure(self, opt: LocalUpdate) -> None:
        """Warm-start or correct the optimizer before the first step."""

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        """Added to the batch loss before backward (None: nothing)."""
        return None

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        """Modify `p.grad` in place after backward, before the optimizer step."""

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        """After the K steps: save durable state, return reply records and metrics."""
        return PartOutput()


@dataclass
class Aggregation:
    """What a stage's server side reads and writes in one round."""

    server_round: int
    info: RoundInfo
    spec: ModelSpec
    algorithm: Algorithm
    extras: dict[str, Tensors]  # the server state's extras before the round (read only)
    replies: list[Any]  # the accepted, decoded replies (strategies/validation.py)
    weights: list[float]
    mean_delta: Tensors
    model: Tensors  # the new model (after the server optimizer); a stage may adjust it (FedDyn)
    num_nodes: int  # connected nodes at sampling (SCAFFOLD, FedDyn scale by |S|/N)
    # The aggregator's combine of one value per reply (the weighted mean by default; median,
    # trimmed mean, Krum, clipping: server_rules/aggregators/), named by the record it combines
    # so robust rules keep per-record state and project onto the record's domain.
    mean: Callable[[Sequence[Mapping[str, torch.Tensor]], str], Tensors]
    new_extras: dict[str, Tensors] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)  # extra per-round metrics
    # |D|: the partitions' examples where the server holds the partitioning, else each client's
    # claim counted once (strategies/examples.py) for a stage that `counts_examples`; 0: unknown
    federation_examples: float = 0.0

    def reply_arrays(self, record: str) -> list[Tensors]:
        return [r.arrays[record] for r in self.replies]

    def combine(self, record: str) -> Tensors:
        """The aggregator's combine of one reply record over the accepted replies."""
        return self.mean(self.reply_arrays(record), record)

    def delta_per_step(self) -> Tensors:
        """The mean of Δ_i/K_i, each reply's Δ by its own K (local-epochs: K_i from its claimed
        num-examples, RoundInfo.steps_for), through the round's combine; mean Δ / K where every
        reply ran the same K. What Δ_G = -Δ/(K·lr) and the like read (the mean is linear)."""
        steps = [self.info.steps_for(int(r.metrics.get(NUM_EXAMPLES, 0))) for r in self.replies]
        if len(set(steps)) <= 1:
            k = steps[0] if steps else self.info.local_steps
            return {n: t / k for n, t in self.mean_delta.items()}
        scaled = [{n: t / k for n, t in r.arrays[DELTA].items()}
                  for r, k in zip(self.replies, steps, strict=True)]
        return self.mean(scaled, DELTA)


class Stage(Component):
    """Base of the components with a wire presence (see the module docstring)."""

    down: ClassVar[tuple[Record, ...]] = ()  # records the server sends and this stage consumes
    up: ClassVar[tuple[Record, ...]] = ()  # records every reply carries for it
    up_metrics: ClassVar[tuple[Metric, ...]] = ()  # reply metrics it requires

    def records_down(self) -> tuple[Record, ...]:
        return self.down

    def records_up(self) -> tuple[Record, ...]:
        return self.up

    def records_up_on(self, server_round: int) -> tuple[Record, ...]:
        """Those of `records_up` this round's replies carry (FedACT's v may skip rounds)."""
        return self.records_up()

    def records_down_repeated(self) -> tuple[str, ...]:
        """Those of `records_down` the server may send unchanged in a later round (a frozen v̄,
        |D|): the only ones a node keeps a copy of and is sent only when it lacks it
        (codec/versions.py). A record that changes every round is sent whole, never kept."""
        return ()

    def skips_uploads(self) -> bool:
        """Whether some round's replies carry fewer of its records than `records_up`."""
        return False

    def optimizer_options(self, info: RoundInfo) -> dict[str, Any]:
        """Keyword arguments of `LocalUpdate` this stage decides (ρ, λ_r, …)."""
        return {}

    def start(self, ctx: ClientRound) -> ClientPart:
        return ClientPart()

    def released_bare(self) -> str:
        """What this stage broadcasts that is computed from the replies outside the shared
        records (so dp would neither clip nor noise it); '' for nothing. dp refuses a stage
        that names something (algorithms/privacy_checks.py)."""
        return ""

    def counts_examples(self) -> bool:
        """Whether this stage reads the federation's examples (`Aggregation.federation_examples`)
        where the server does not hold the partitioning: the server then counts each client's
        claim once over the run (strategies/examples.py)."""
        return False

    def payload(self, extras: Mapping[str, Tensors], spec: ModelSpec, algorithm: Algorithm
                ) -> dict[str, Tensors]:
        """Records sent this round: those of `down` the server state holds already."""
        return {r.name: extras[r.name] for r in self.records_down() if r.name in extras}

    def aggregate(self, agg: Aggregation) -> None:
        """Write the new state this stage keeps into `agg.new_extras`."""
