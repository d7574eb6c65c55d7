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
    σ_b           when set, the adaptive clipping's counts must leave the records some of z
"""

from __future__ import annotations

from adaptfl.algorithms.algorithm import Algorithm
from adaptfl.algorithms.sampling import sample_size
from adaptfl.algorithms.settings import Federation
from adaptfl.core.privacy_settings import Privacy
from adaptfl.privacy.accountant import planned_epsilon
from adaptfl.privacy.mechanism import records_noise_multiplier
from adaptfl.privacy.server import target_error, worst_multiplier


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
    if privacy.dp_count_stddev > 0.0:  # σ_b set: the adaptive counts' share of z is known now
        records_noise_multiplier(privacy, algorithm.reply_record_count(), privacy.dp_count_stddev)
    if privacy.dp_num_clients > 0:
        check_planned_target(privacy, fed, privacy.dp_num_clients)


def check_planned_target(privacy: Privacy, fed: Federation, population: int) -> None:
    """The rounds planned (dp-on-target='refuse'; round 1 alone with 'stop') must fit the target
    ε with `population` nodes (dp-num-clients, or the nodes once known: server_app/run_checks.py),
    each round after the worst loss it accepts (privacy/server.py `worst_multiplier`)."""
    if not privacy.on or privacy.dp_target_epsilon <= 0.0:
        return
    n = sample_size(fed, population)
    rounds = fed.num_server_rounds if privacy.dp_on_target == "refuse" else 1
    planned = planned_epsilon(worst_multiplier(privacy, fed.min_replies, n), n, population, rounds,
                              privacy.dp_delta, privacy.dp_accounting)
    if planned > privacy.dp_target_epsilon:
        raise ValueError(target_error(privacy, planned, rounds, n, population, fed.min_replies))
