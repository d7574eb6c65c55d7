"""MimeLite (Karimireddy et al., "Breaking the centralized barrier…", 2021, Alg. 2) with a
momentum-SGD base optimizer.

    client: u = (1-β)·∇f_i(y; ξ) + β·m, y <- y - lr·u    m: the server's momentum, frozen for the
            round (the chain's correction with ρ = β and Δ_G = m)
            uploads ∇f_i(x^r): the full-batch gradient of the task loss at the global model, or,
            on more than `mime-grad-examples` examples, its unbiased estimate on a fresh seeded
            sample of that many (Mime allows a large minibatch; a full pass over a large
            partition took over 10 minutes a round on fortunes)
    server: x <- x + mean Δ_i;  m <- (1-β)·mean ∇f_i(x^r) + β·m

m goes down every round (zeros in round 1, the paper's initial state).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adaptfl.algorithms.components.correction import Correction
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec, Record
from adaptfl.core.params import component, param
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, PartOutput, Tensors

if TYPE_CHECKING:
    from adaptfl.algorithms.algorithm import Algorithm
    from adaptfl.local_update import LocalUpdate

MOMENTUM = wire.MIME_M  # the record and the server state slot of m


def sample_rows(ctx: ClientRound, limit: int) -> torch.Tensor:
    """`limit` of the client's positions without replacement, the same in every process for
    (run seed, round, client) and fresh each round."""
    key = f"mimelite/{ctx.info.seed}/{ctx.info.server_round}/{ctx.data.sample_seed}".encode()
    generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:7], "little"))
    return torch.randperm(ctx.data.num_examples, generator=generator)[:limit]


def _batches(ctx: ClientRound, limit: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    data = ctx.data
    if limit and limit < data.num_examples and data.batches_of is not None:
        yield from data.batches_of(sample_rows(ctx, limit))
        return
    if data.full_batches is None:  # full_gradient checks it first
        raise ValueError("MimeLite needs the client's data for ∇f_i(x): pass data=ClientData(...)")
    seen = 0
    for x, y in data.full_batches():
        yield x, y
        seen += len(x)
        if limit and seen >= limit:  # a user's data without `batch`: its first rows
            return


def full_gradient(model: torch.nn.Module, ctx: ClientRound, limit: int = 0) -> dict[str, torch.Tensor]:
    """∇f_i(x) = mean loss gradient over the whole partition, or over `limit` of its examples
    (0: all); no randomness but the sample's."""
    data = ctx.data
    if data.full_batches is None or data.loss is None:
        raise ValueError("MimeLite needs the client's data for ∇f_i(x): pass data=ClientData(...)")
    device = next(model.parameters()).device
    params = ctx.params
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    count = 0
    for x, y in _batches(ctx, limit):
        # the task's own loss (one per prediction: images and tokens alike), weighted by the
        # chunk's predictions so the sum is the gradient of the partition's mean loss
        loss = data.loss(model(x.to(device)), y.to(device))
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for (n, _), g in zip(params.items(), grads, strict=True):
            if g is not None:
                total[n].add_(g, alpha=y.numel())
        count += y.numel()
    return {n: t / max(count, 1) for n, t in total.items()}


@component("correction", "mimelite")
@dataclass(frozen=True)
class MimeLite(Correction):
    """Server momentum applied on the clients; full-batch gradients at x^r uploaded."""

    beta1: float = param(0.9, "MimeLite's momentum β: u = (1-β)·g + β·m", within=(0.0, 1.0),
                         open_high=True)
    mime_grad_examples: int = param(1024, "examples in each client's ∇f_i(x^r): a fresh seeded "
                                    "sample each round where the partition is larger (Mime allows a "
                                    "large minibatch); 0: the whole partition", within=(0, None))
    record = MOMENTUM

    @property
    def weight(self) -> float:
        return self.beta1

    def records_down(self) -> tuple[Record, ...]:
        return (Record(MOMENTUM, doc="the server momentum m"),)

    def records_up(self) -> tuple[Record, ...]:
        return (Record(wire.GRAD_AT_X, doc="∇f_i(x^r) over the partition"),)

    def payload(self, extras: Mapping[str, Tensors], spec: ModelSpec, algorithm: Algorithm
                ) -> dict[str, Tensors]:
        m = extras.get(MOMENTUM) or {n: torch.zeros(s, dtype=d) for n, (s, d) in spec.params().items()}
        return {MOMENTUM: m}

    def start(self, ctx: ClientRound) -> ClientPart:
        ctx.model.train()
        return _Mime(ctx.records.get(MOMENTUM), full_gradient(ctx.model, ctx, self.mime_grad_examples))

    def aggregate(self, agg: Aggregation) -> None:
        grad = agg.combine(wire.GRAD_AT_X)
        m = agg.extras.get(MOMENTUM) or {n: torch.zeros_like(g) for n, g in grad.items()}
        agg.new_extras[MOMENTUM] = {n: (1.0 - self.beta1) * grad[n] + self.beta1 * m[n] for n in grad}


class _Mime(ClientPart):
    def __init__(self, m: Tensors | None, grad_at_x: dict[str, torch.Tensor]) -> None:
        self.m, self.grad_at_x = m, {n: g.cpu() for n, g in grad_at_x.items()}

    def configure(self, opt: LocalUpdate) -> None:
        if self.m is not None:
            opt.set_global_direction(self.m)

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        return PartOutput(records={wire.GRAD_AT_X: self.grad_at_x})
