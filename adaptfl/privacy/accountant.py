"""(ε, δ) over the rounds released so far, by Google's `dp-accounting` RDP accountant (the
backend Flower 1.42's own `RdpAccountant` wraps, installed with `flwr[dp]`).

Each released round is one event (z, n, N): noise multiplier z, n nodes sampled from N connected.
The bound applied (`dp-accounting`):

    without-replacement  the strategy samples exactly n = round(fraction-train·N) of the N
                         nodes, uniformly without replacement (algorithms/sampling.py): the
                         sampled Gaussian of Wang, Balle & Kasiviswanathan (AISTATS 2019, Thm 27)
                         under replace-one neighbours, where one client's records move the sum
                         by 2·C, so the event's noise multiplier is z/2
    no-amplification     the plain Gaussian, no credit for sampling, under replace-one: the mean
                         divides by the released m, so one client moves the sum by 2·C and the
                         event's noise multiplier is z/2 (Flower's DifferentialPrivacy*FixedClipping
                         wrappers account add/remove-one at z, which under-counts ε 2-2.5x here)

Flower's `RdpAccountant` fixes N for the whole run; nodes come and go between rounds here, so the
events are composed into dp_accounting's accountant directly (tests/privacy/test_privacy.py checks both
give the same ε where Flower's applies). The ledger is kept in the server state, so a resumed
run keeps counting; across runs on the same data: `dp-ledger` (privacy/ledger.py).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

LEDGER = "dp-ledger"  # server-state extras: {"events": float64 [rounds, 3] of (z, n, N)}
Event = tuple[float, int, int]


def epsilon(events: Sequence[Event], delta: float, accounting: str) -> float:
    """ε at δ after composing the events (0 before any). RDP adds up over compositions, so each
    distinct event's RDP curve is computed once (the sampled-without-replacement one takes about
    a second) and the run's curve is their count-weighted sum."""
    if not events:
        return 0.0
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    curves = [(count, *_event_rdp(*event, accounting)) for event, count in Counter(events).items()]
    orders = curves[0][1]
    total = sum(count * rdp for count, _, rdp in curves)
    return float(compute_epsilon(orders, total, delta)[0])


def epsilon_mixed(events: Sequence[tuple[Event, str]], delta: float) -> float:
    """ε at δ of events each under its own bound (`dp-accounting`): RDP curves at the same
    orders add up whatever bound gave each, so runs of both modes compose into one total."""
    if not events:
        return 0.0
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    curves = [(count, *_event_rdp(*event, mode)) for (event, mode), count in Counter(events).items()]
    orders = curves[0][1]
    if any(len(o) != len(orders) or (o != orders).any() for _, o, _ in curves):
        raise RuntimeError("dp_accounting gave the two bounds different RDP orders")
    total = sum(count * rdp for count, _, rdp in curves)
    return float(compute_epsilon(orders, total, delta)[0])


@functools.lru_cache(maxsize=256)
def _event_rdp(z: float, n: int, population: int, accounting: str) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each order) of one round's release, by dp_accounting's RdpAccountant."""
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp import RdpAccountant

    sampled = accounting == "without-replacement"
    # replace-one in both: one client's records move the sum by 2·C, so z/2
    if sampled:
        accountant = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        accountant.compose(dp_event.SampledWithoutReplacementDpEvent(
            population, n, dp_event.GaussianDpEvent(z / 2)))
    else:  # the plain Gaussian's RDP α/(2σ²) is the same under either relation at sensitivity 1
        accountant = RdpAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
        accountant.compose(dp_event.GaussianDpEvent(z / 2))
    # the accountant keeps its curve private; dp-accounting is pinned < 0.7 by flwr[dp]
    return np.array(accountant._orders), np.array(accountant._rdp)  # noqa: SLF001


def ledger_of(extras: dict[str, dict[str, torch.Tensor]]) -> list[Event]:
    rows = extras.get(LEDGER, {}).get("events")
    if rows is None:
        return []
    return [(float(z), int(n), int(pop)) for z, n, pop in rows.tolist()]


def ledger_record(events: Sequence[Event]) -> dict[str, torch.Tensor]:
    return {"events": torch.tensor([list(e) for e in events], dtype=torch.float64).reshape(-1, 3)}


def planned_epsilon(z: float, n: int, population: int, rounds: int, delta: float,
                    accounting: str) -> float:
    return epsilon([(z, n, population)] * rounds, delta, accounting)


def noise_for(target: float, n: int, population: int, rounds: int, delta: float,
              accounting: str) -> float:
    """The smallest z (to 1e-3 relative) whose planned ε is at most `target` (benchmarks)."""
    low, high = 0.05, 1.0
    while planned_epsilon(high, n, population, rounds, delta, accounting) > target:
        low, high = high, high * 2
    while high - low > 1e-3 * high:
        mid = (low + high) / 2
        if planned_epsilon(mid, n, population, rounds, delta, accounting) > target:
            low = mid
        else:
            high = mid
    return high
