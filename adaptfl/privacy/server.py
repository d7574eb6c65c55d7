"""The strategy's side of dp: the checks before a round, the round's combine, the ledger.

    before round r   the planned ε (every round of the run, or this round's release) against
                     dp-target-epsilon: over it at round 1 -> ValueError (the run is refused,
                     nothing released); with dp-on-target='stop', over it later -> BudgetReached
                     (adaptfl's loop ends the run there and writes its outputs, exit 0; under
                     Flower's Strategy.start it is Flower's PrivacyBudgetExhausted)
    the round        GaussianMean combines every shared record (privacy/mechanism.py)
    after it         the event (z, n, N) joins the ledger in the server state; ε is a metric;
                     with dp-ledger, the event goes to that file too and dp-epsilon-ledger is ε
                     over every run's events there (privacy/ledger.py)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from flwr.serverapp.exception import PrivacyBudgetExhausted

from adaptfl.core.contract import Contract
from adaptfl.core.privacy_settings import Privacy
from adaptfl.privacy import ledger
from adaptfl.privacy.accountant import LEDGER, epsilon, ledger_of, ledger_record, planned_epsilon
from adaptfl.privacy.mechanism import GaussianMean, records_noise_multiplier, round_seed, shared_records

if TYPE_CHECKING:  # strategies and algorithms import privacy; these are only read here
    from adaptfl.algorithms.settings import Federation
    from adaptfl.strategies.state import ServerState


class BudgetReached(PrivacyBudgetExhausted):
    """The next round's release would take ε past dp-target-epsilon (dp-on-target='stop')."""


def share_bound(fed: Federation, replies: int) -> float:
    """b: the largest share one reply may have in a mean under dp (mechanism.py's docstring)."""
    if fed.weighting == "uniform":
        return 1.0 / replies
    return max(1.0 / replies, fed.max_weight_share)


def count_stddev(privacy: Privacy, sampled: int) -> float:
    """σ_b of the adaptive clipping's noised counts: set, or n/20 (Andrew et al.)."""
    return privacy.dp_count_stddev or sampled / 20.0


def booked_multiplier(privacy: Privacy, replies: int, sampled: int) -> float:
    """The noise multiplier a round is accounted at: z, or under dp='client' z·√(m/n), the m of
    the n noise shares that arrived."""
    if privacy.dp != "client":
        return privacy.dp_noise_multiplier
    return privacy.dp_noise_multiplier * math.sqrt(min(replies, sampled) / sampled)


def worst_multiplier(privacy: Privacy, min_replies: int, sampled: int) -> float:
    """What a round is accounted at after the worst loss it accepts: under dp='client' a round
    is released only with min-replies accepted (strategies/aggregation.py), so m >= min(min-replies, n)."""
    return booked_multiplier(privacy, max(1, min(min_replies, sampled)), sampled)


def before_round(privacy: Privacy, state: ServerState, server_round: int, num_rounds: int,
                 sampled: int, population: int, contract: Contract, min_replies: int = 1,
                 data_key: str = "") -> None:
    """Refuse (round 1) or stop (later) where the target ε would be passed by the round after
    the worst loss it accepts (`worst_multiplier`); refuse counts too noisy for the adaptive
    clipping to leave the records any of z."""
    if privacy.on:
        records_noise_multiplier(privacy, len(shared_records(contract)), count_stddev(privacy, sampled))
        ledger.check_privacy_ledger(privacy, data_key)  # a bad line, another δ or mode: refused unsent
    target = privacy.dp_target_epsilon
    if not privacy.on or target <= 0.0:
        return
    z, delta, bound = worst_multiplier(privacy, min_replies, sampled), privacy.dp_delta, privacy.dp_accounting
    events = ledger_of(state.extras)
    if not events:  # the run's first release: what it plans to spend
        rounds = num_rounds - server_round + 1 if privacy.dp_on_target == "refuse" else 1
        planned = planned_epsilon(z, sampled, population, rounds, delta, bound)
        if planned > target:
            raise ValueError(target_error(privacy, planned, rounds, sampled, population, min_replies))
    after = epsilon([*events, (z, sampled, population)], delta, bound)
    if after > target:
        raise BudgetReached(f"round {server_round} would take ε from "
                            f"{epsilon(events, delta, bound):.4g} to {after:.4g}, past "
                            f"dp-target-epsilon={target:g} (δ={delta:g}): the run stops here")


def target_error(privacy: Privacy, planned: float, rounds: int, sampled: int, population: int,
                 min_replies: int = 1) -> str:
    what = f"{rounds} rounds" if rounds > 1 else "round 1 alone"
    least = max(1, min(min_replies, sampled))
    lost = privacy.dp == "client" and least < sampled
    loss = f" (with only min-replies={least} of them answering)" if lost else ""
    return (f"dp-target-epsilon={privacy.dp_target_epsilon:g}: {what} of dp-noise-multiplier="
            f"{privacy.dp_noise_multiplier:g}, {sampled} of {population} nodes sampled{loss}, spend ε="
            f"{planned:.4g} at dp-delta={privacy.dp_delta:g}; raise dp-noise-multiplier or the target"
            + (f", or min-replies={sampled} (each round booked at all {sampled} noise shares)"
               if lost else "")
            # Fewer rounds cannot help when round 1 alone is past the target.
            + (", or plan fewer rounds (or dp-on-target='stop')" if rounds > 1 else ""))


def round_combine(privacy: Privacy, fed: Federation, contract: Contract, replies: int,
                  sampled: int, server_round: int) -> GaussianMean:
    return GaussianMean(privacy, len(shared_records(contract)), share_bound(fed, replies),
                        round_seed(privacy.dp_seed, "server", server_round),
                        count_stddev(privacy, sampled))


def record_release(privacy: Privacy, state: ServerState, sampled: int, population: int,
                   server_round: int, run: str, min_replies: int = 1, data_key: str = ""
                   ) -> dict[str, float]:
    """Add the round's event to the ledger of `state` (and to dp-ledger's file); ε so far as
    the round's metrics. `run` names the run in the file (its results folder). Under SecAgg+ the
    nodes' discrete noise covers the rounding's reach too (secagg/aggregate.py), so z is z."""
    # dp='client': booked at the least m a released round has (min-replies), not the m that
    # came, so ε does not tell whether, nor whose, a reply was lost (docs/privacy.md)
    z = worst_multiplier(privacy, min_replies, sampled)
    events = [*ledger_of(state.extras), (z, sampled, population)]
    state.extras[LEDGER] = ledger_record(events)
    out = {"dp-epsilon": epsilon(events, privacy.dp_delta, privacy.dp_accounting),
           "dp-noise-multiplier": z}
    if ledger.path_of(privacy, data_key) is not None:  # ε over every run in the data's ledger
        out["dp-epsilon-ledger"] = ledger.record(privacy, (z, sampled, population), run,
                                                 state.run_key, server_round, data_key)
    return out
