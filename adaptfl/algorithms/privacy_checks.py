"""What composes with dp, checked with the run config (one line, before round 1; exit 2 from
`check_overrides` and the engine):

    aggregator    only `mean`: Krum and multi-Krum pick replies by their distances, so one
                  client decides which others enter the mean (its reach is not C/m); the
                  coordinate-wise median and trimmed mean move a coordinate by up to C each,
                  √d·C in all; `clip` starts from the replies' median norm (data-dependent) and
                  clips twice. dp's own clipping already bounds every reply's influence.
    weighting     `uniform`, or `examples` with max-weight-share < 1 (the cap is the noise's
                  share bound); dp='client' needs `uniform`, the weights each client's noise
                  share is calibrated for
    dp-ledger     set with dp on (a run without dp has no ε to add to it)
    target ε      set with dp on; with dp-num-clients = N the planned rounds are checked here
    planned ε     without a target, a plan above dp-accept-epsilon (default 10) is refused with
                  its numbers and the ways out: more clients a round, more noise, fewer rounds
    σ_b           when set, the adaptive clipping's counts must leave the records some of z
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adaptfl.algorithms.algorithm import Algorithm
from adaptfl.algorithms.sampling import sample_size
from adaptfl.algorithms.settings import Federation
from adaptfl.core.privacy_settings import Privacy
from adaptfl.privacy.accountant import planned_epsilon
from adaptfl.privacy.mechanism import records_noise_multiplier
from adaptfl.privacy.server import count_stddev, share_bound, target_error, worst_multiplier


def check_evaluation_private(privacy: Privacy, fed: Federation) -> None:
    """Nodes do not answer federated evaluation under dp='client' (privacy/client.py
    `check_evaluation`): a run that would ask is refused before round 1."""
    if privacy.dp == "client" and fed.fraction_evaluate > 0.0:
        raise ValueError(f"dp='client' with fraction-evaluate={fed.fraction_evaluate:g}: nodes do not "
                         "answer federated evaluation under dp='client' (its scores would leave them "
                         "bare, docs/privacy.md); use fraction-evaluate=0")


def check_privacy(privacy: Privacy, algorithm: Algorithm, fed: Federation) -> None:
    if not privacy.on:
        if privacy.dp_target_epsilon > 0.0:
            raise ValueError(f"dp-target-epsilon={privacy.dp_target_epsilon:g} with dp='none': "
                             "nothing is noised; set dp='central' or dp='client'")
        if privacy.dp_ledger:  # a run without dp has no bound to add: the ledger would lie
            raise ValueError(f"dp-ledger={privacy.dp_ledger!r} with dp='none': a run without dp "
                             "releases its data without a bound; set dp or drop dp-ledger")
        return
    bare = [what for stage in algorithm.stages() if (what := stage.released_bare())]
    if bare:
        raise ValueError(f"dp={privacy.dp!r} with algorithm {algorithm.name!r}: {bare[0]} would be "
                         "broadcast from the replies without clipping or noise")
    aggregator = algorithm.aggregator.name
    if aggregator != "mean":
        raise ValueError(f"dp={privacy.dp!r} with aggregator={aggregator!r}: only aggregator='mean' "
                         "keeps one client's reach within its clipping norm (Krum selects replies by "
                         "distance, median/trimmed-mean move each coordinate by up to C); dp's "
                         "clipping already bounds every reply")
    if fed.weighting == "examples" and (privacy.dp == "client" or fed.max_weight_share >= 1.0):
        need = "weighting='uniform'" if privacy.dp == "client" else \
            "weighting='uniform' or max-weight-share < 1 (it enters the noise)"
        raise ValueError(f"dp={privacy.dp!r} with weighting='examples' and max-weight-share="
                         f"{fed.max_weight_share:g}: one client's claimed num-examples could carry "
                         f"the whole mean; use {need}")
    check_evaluation_private(privacy, fed)
    if privacy.dp_count_stddev > 0.0:  # σ_b set: the adaptive counts' share of z is known now
        records_noise_multiplier(privacy, algorithm.reply_record_count(), privacy.dp_count_stddev)
    if privacy.dp_num_clients > 0:
        check_planned_target(privacy, fed, privacy.dp_num_clients, algorithm)


@dataclass(frozen=True)
class DpPlan:
    """What a dp run spends if every planned round is released: ε at δ over `rounds` rounds of
    `sampled` of `population` nodes, and the noise std on each round's mean of Δ (clip norm
    C_Δ; the other records get the same multiple of their own C)."""

    rounds: int
    sampled: int
    population: int
    epsilon: float
    mean_std: float  # on Δ's mean: z_records·√k·C_Δ·b (privacy/mechanism.py)
    client_std: float  # dp='client': what each client adds to its own Δ; 0 under dp='central'
    per_client: float  # mean_std / (C_Δ·b): noise in units of the most one client moves the mean
    booked: float = 0.0  # the noise multiplier a round is booked at: after the worst loss it accepts
    least: int = 1  # dp='client': the replies a released round has at least (min-replies, at most n)


def dp_plan(privacy: Privacy, algorithm: Algorithm, fed: Federation, population: int) -> DpPlan:
    """The plan of a run with `population` nodes, by the accountant the run uses (privacy/)."""
    n = sample_size(fed, population)
    k = algorithm.reply_record_count()
    z = records_noise_multiplier(privacy, k, count_stddev(privacy, n))
    b = share_bound(fed, n)
    mean_std = z * math.sqrt(k) * privacy.dp_clip_norm * b
    client_std = z * math.sqrt(k) * privacy.dp_clip_norm / math.sqrt(n) if privacy.dp == "client" else 0.0
    booked = worst_multiplier(privacy, fed.min_replies, n)
    planned = planned_epsilon(booked, n, population, fed.num_server_rounds, privacy.dp_delta,
                              privacy.dp_accounting)
    return DpPlan(fed.num_server_rounds, n, population, planned, mean_std, client_std, z * math.sqrt(k),
                  booked, max(1, min(fed.min_replies, n)))


def plan_line(privacy: Privacy, plan: DpPlan) -> str:
    """The one line a dp run logs before round 1."""
    client = f", each client adds std {plan.client_std:.3g} to its own Δ" if plan.client_std else ""
    target = f" (dp-target-epsilon={privacy.dp_target_epsilon:g})" if privacy.dp_target_epsilon else ""
    return (f"dp={privacy.dp!r} plan: ε={plan.epsilon:.3g} at δ={privacy.dp_delta:g} after "
            f"{plan.rounds} rounds{target} of {plan.sampled} of {plan.population} nodes, "
            f"dp-noise-multiplier={privacy.dp_noise_multiplier:g}; noise std {plan.mean_std:.3g} on each "
            f"round's mean of Δ (dp-clip-norm={privacy.dp_clip_norm:g}), {plan.per_client:.3g}× the "
            f"most one client moves it{client}{replies_assumed(privacy, plan)}")


def replies_assumed(privacy: Privacy, plan: DpPlan) -> str:
    """dp='client': the reply count each round is booked at (min-replies of the n noise shares),
    said with the plan, since ε depends on it."""
    if privacy.dp != "client":
        return ""
    return (f"; each round booked as if only {plan.least} of the {plan.sampled} replies arrive "
            f"(min-replies={plan.least}: z·√(m/n) = {plan.booked:.3g})")


def min_replies_way_out(privacy: Privacy, plan: DpPlan) -> str:
    """The way out a dp='client' refusal names when rounds are booked below all n replies."""
    if privacy.dp != "client" or plan.least >= plan.sampled:
        return ""
    whole = planned_epsilon(privacy.dp_noise_multiplier, plan.sampled, plan.population, plan.rounds,
                            privacy.dp_delta, privacy.dp_accounting)
    return (f", min-replies={plan.sampled} (each round booked at all {plan.sampled} noise shares, "
            f"not {plan.least}: ε={whole:.3g})")


def rounds_within(privacy: Privacy, plan: DpPlan, bound: float) -> int:
    """The most rounds of this plan whose ε stays within `bound` (0 if round 1 alone exceeds it);
    one event's RDP curve, computed once (accountant.py), so each count costs microseconds."""
    low, high = 0, plan.rounds
    while low < high:
        mid = (low + high + 1) // 2
        if planned_epsilon(plan.booked, plan.sampled, plan.population, mid,
                           privacy.dp_delta, privacy.dp_accounting) <= bound:
            low = mid
        else:
            high = mid - 1
    return low


def check_plan_sane(privacy: Privacy, fed: Federation, plan: DpPlan) -> None:
    """Without a target ε, refuse a plan past dp-accept-epsilon: a run that promises no privacy
    (ε ≫ 1; Dwork & Roth 2014 §2.3 read ε as a bound on the odds ratio e^ε) and usually no model
    either (few clients a round with unit-scale noise)."""
    bound = privacy.dp_accept_epsilon
    if not privacy.on or privacy.dp_target_epsilon > 0.0 or plan.epsilon <= bound:
        return
    fewer = rounds_within(privacy, plan, bound)
    rounds = f"num-server-rounds={fewer} or fewer" if fewer else "fewer rounds (round 1 alone is past it)"
    raise ValueError(
        f"dp={privacy.dp!r} plans ε={plan.epsilon:.3g} at δ={privacy.dp_delta:g} ({plan.rounds} "
        f"rounds of {plan.sampled} of {plan.population} nodes, dp-noise-multiplier="
        f"{privacy.dp_noise_multiplier:g}), "
        f"above dp-accept-epsilon={bound:g}; ways out: more clients a round (fraction-train="
        f"{fed.fraction_train:g} samples {plan.sampled}), more noise (dp-noise-multiplier > "
        f"{privacy.dp_noise_multiplier:g}), {rounds}{min_replies_way_out(privacy, plan)}; or set "
        f"dp-target-epsilon, or dp-accept-epsilon "
        f"> {plan.epsilon:.3g} to accept it")


def check_planned_target(privacy: Privacy, fed: Federation, population: int,
                         algorithm: Algorithm | None = None) -> None:
    """The rounds planned (dp-on-target='refuse'; round 1 alone with 'stop') must fit the target
    ε with `population` nodes: dp-num-clients, or the nodes once known (server_app/run_checks.py),
    each round after the worst loss it accepts (privacy/server.py `worst_multiplier`); without a
    target, the plan must stay within dp-accept-epsilon (check_plan_sane)."""
    if not privacy.on:
        return
    if privacy.dp_target_epsilon <= 0.0:
        if algorithm is not None:
            check_plan_sane(privacy, fed, dp_plan(privacy, algorithm, fed, population))
        return
    n = sample_size(fed, population)
    rounds = fed.num_server_rounds if privacy.dp_on_target == "refuse" else 1
    planned = planned_epsilon(worst_multiplier(privacy, fed.min_replies, n), n, population, rounds,
                              privacy.dp_delta, privacy.dp_accounting)
    if planned > privacy.dp_target_epsilon:
        raise ValueError(target_error(privacy, planned, rounds, n, population, fed.min_replies))
