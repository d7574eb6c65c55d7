"""How replies are combined into one value per coordinate: the mean Δ and every extra state a
strategy averages (v̄, Θ, control variates, ∇f_i(x), HaFedHo's f̂). One file per aggregator;
`aggregator=` selects it for every algorithm, and every stage combines its records through it
(`Aggregation.combine`), so a robust rule protects the shared optimizer state as well as Δ:

    mean           the (sample-count or uniformly) weighted mean: the papers' rule
    clip           each reply's record clipped to norm C, then the weighted mean; C adapts per
                   record towards a quantile of the norms (Andrew et al. 2021)
    median         coordinate-wise median (Yin et al. 2018), unweighted
    trimmed-mean   coordinate-wise mean without the ⌊β·n⌋ largest and smallest, unweighted
    krum           Krum / multi-Krum (Blanchard et al. 2017): the replies closest to their
                   neighbours, then their weighted mean

Coordinate-wise rules keep v ≥ 0 by themselves; their result is projected onto the record's
domain (SOAP's statistics onto the PSD cone), which convex combinations of valid replies
(mean, clip, Krum) never leave. An aggregator's own state (clip's C per record) lives in the
server state under `aggregator/<slot>`, so a checkpoint resumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from adaptfl.core.domain import FINITE, Domain
from adaptfl.core.params import Component

if TYPE_CHECKING:
    from adaptfl.privacy.mechanism import GaussianMean

Tensors = dict[str, torch.Tensor]
Items = Sequence[Mapping[str, torch.Tensor]]
SLOT_PREFIX = "aggregator/"  # server-state key of an aggregator's slot: "aggregator/clip-norm"


class AggregationRefused(ValueError):
    """This round's replies cannot be combined by the chosen rule (too few for Krum, say): the
    round is refused and the server state kept."""


@dataclass
class Combine:
    """One round's combining, called once per record by the strategy and the stages."""

    aggregator: Aggregator | GaussianMean  # GaussianMean: the DP mean of dp='server' (privacy/)
    weights: list[float]  # per reply, after the max-weight-share cap
    domains: Mapping[str, Mapping[str, Domain]]  # record -> array -> domain (the contract's)
    memory: Mapping[str, Tensors] = field(default_factory=dict)  # slots before the round
    new_memory: dict[str, Tensors] = field(default_factory=dict)  # slots after it
    stats: dict[str, float] = field(default_factory=dict)  # per-round metrics of the rule
    hostile: int | None = None  # replies to tolerate this round (hostile-fraction); None: the rule's own
    # replies the checks dropped before combining (screened, undecodable): each counts as one of
    # the hostile replies tolerated, so a rule may lower its tolerance by as many (tolerance())
    set_aside: int = 0

    def tolerance(self, wanted: int, supported: int, refusal: str) -> int:
        """The hostile replies to tolerate among the replies left: `wanted`, or the most they
        support (`supported`, -1: none) where the replies set aside make up the difference;
        else the round is refused with `refusal`."""
        if supported < max(wanted - self.set_aside, 0):
            raise AggregationRefused(refusal + (f" ({self.set_aside} set aside)" if self.set_aside else ""))
        return min(wanted, supported)

    def __call__(self, items: Items, record: str) -> Tensors:
        if len(items) != len(self.weights):
            raise ValueError(f"{record}: {len(items)} items for {len(self.weights)} weights")
        return self.aggregator.combine(items, self.weights, record, self)

    def domain(self, record: str, name: str) -> Domain:
        return self.domains.get(record, {}).get(name, FINITE)

    def project(self, record: str, combined: Tensors) -> Tensors:
        """The result onto each array's domain (for coordinate-wise rules)."""
        return {n: self.domain(record, n).project(t) if t.is_floating_point() else t
                for n, t in combined.items()}

    def slots(self) -> dict[str, Tensors]:
        """The new slots as server-state extras."""
        return {SLOT_PREFIX + k: v for k, v in self.new_memory.items()}


def memory_of(extras: Mapping[str, Tensors]) -> dict[str, Tensors]:
    return {k[len(SLOT_PREFIX):]: v for k, v in extras.items() if k.startswith(SLOT_PREFIX)}


def stacked(items: Items, name: str) -> torch.Tensor:
    """[n, *shape] of one array over the replies, in float64 (exact for float32 inputs)."""
    return torch.stack([item[name].to(torch.float64) for item in items])


def back(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A float64 result in the input's dtype (integer buffers rounded)."""
    return t.to(like.dtype) if like.is_floating_point() else t.round().to(like.dtype)


def coordinatewise(items: Items, record: str, ctx: Combine,
                   rule: Callable[[torch.Tensor], torch.Tensor]) -> Tensors:
    """`rule` over dim 0 of each array's [n, *shape] replies, in float64; back in each array's
    dtype and onto the record's domain (median, trimmed mean)."""
    out = {name: back(rule(stacked(items, name)), like) for name, like in items[0].items()}
    return ctx.project(record, out)


def flat(item: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One reply's record as one float64 vector over its floating arrays (norms, distances)."""
    parts = [t.reshape(-1).to(torch.float64) for t in item.values() if t.is_floating_point()]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


class Aggregator(Component):
    """Base: `combine(items, weights, record, ctx)` -> one dict of tensors, items in a fixed
    order; `ctx` gives the record's domains, the rule's memory and its per-round stats."""

    # True: one reply alone must move nothing (median, trimmed mean, Krum), so a count of the
    # clients' claims (HaFedHo's |D|, strategies/examples.py) caps each at the median claim
    robust: ClassVar[bool] = False

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        raise NotImplementedError

    def check_federation(self, min_replies: int, hostile: int = 0) -> None:
        """Refuse, before round 1, a min-replies this rule cannot work with, or `hostile` > 0
        hostile replies among min-replies it cannot tolerate (one line)."""
        if hostile > 0:
            raise ValueError(f"aggregator={self.name!r} tolerates no hostile reply (median, "
                             "trimmed-mean and krum do)")
