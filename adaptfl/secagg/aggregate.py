"""A SecAgg+ round of an AdaptiveStrategy: sizes the fixed point, runs the protocol (server.py),
and hands the strategy's aggregation the unmasked mean as each live node's reply.

Every record a client shares (Δ, the uploads, the averaged metrics) is in the one masked
vector, so the server learns only their sums; what it sees per node is the plain metrics
(num-examples, the partition id, the loss). The aggregation then runs unchanged on m replies
that all carry the mean: a uniform mean of m copies of the mean is the mean, and everything
after it (server optimizer, components' state, |S|/N, the invariants, dp's ledger) is
post-processing of the sum. Under dp='client' each node adds its share of a discrete Gaussian
to its integers before masking (noise.py), calibrated to the rounded integers' reach, so the sum
carries the whole noise of z.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp import Grid

from adaptfl.core.domain import Domain
from adaptfl.core.privacy_settings import Privacy
from adaptfl.privacy.mechanism import metric_domains, shared_records, start_bound
from adaptfl.privacy.release import detail_level
from adaptfl.secagg import fixedpoint
from adaptfl.secagg.server import Admit, OutOfReach, SecAggServer, SecureRefused, SecureRound, ring_seed
from adaptfl.strategies.secagg_search import EXCLUDED, NARROWED, STOPPED, SUSPECTS
from adaptfl.strategies.validation import DecodedReply, ReplyRejected, _check_metrics

if TYPE_CHECKING:
    from adaptfl.strategies.base import AdaptiveStrategy

log = logging.getLogger(__name__)


def record_ranges(strategy: AdaptiveStrategy) -> dict[str, float]:
    """Each shared record's range c: secagg-clip(-<record>), or under dp its clipping norm (no
    entry of a vector clipped to C is larger, so the range clips nothing dp has not)."""
    cfg = strategy.cfg
    names = shared_records(strategy.contract())
    if cfg.privacy.dp == "client":
        return {r: start_bound(cfg.privacy, r) for r in names}
    return {r: cfg.secagg.clip_of(r) for r in names}


def node_noise_std(privacy: Privacy, bound: int, slots: list[fixedpoint.Slot], sampled: int) -> float:
    """dp='client': each node's std of discrete noise, z·S/√n, S the integer vector's L2 reach
    with the rounding (fixedpoint.sensitivity): the n shares sum to noise multiplier z over the
    rounded integers, so the accountant's z holds as it is. Each node computes it again itself
    (secagg/client.py) and refuses a round that asks for less."""
    if privacy.dp != "client" or bound <= 0:
        return 0.0
    return privacy.dp_noise_multiplier * fixedpoint.sensitivity(bound, slots) / math.sqrt(sampled)


def secure_round(strategy: AdaptiveStrategy, grid: Grid, server_round: int, messages: list[Message],
                 timeout: float | None) -> tuple[ArrayRecord | None, MetricRecord | None, list[int]]:
    """(the round's aggregate, its metrics, the sampled nodes that never answered)."""
    assert strategy.state is not None and strategy.spec is not None
    cfg, contract = strategy.cfg, strategy.contract()
    nodes = [m.metadata.dst_node_id for m in messages]
    shares, threshold = cfg.secagg.round_shares(len(nodes))
    privacy, bits = cfg.privacy, cfg.secagg.secagg_modulus_bits
    k = len(shared_records(contract))
    z_sqrt_k = privacy.dp_noise_multiplier * math.sqrt(k) if privacy.dp == "client" else 0.0
    ranges = record_ranges(strategy)
    slots = fixedpoint.layout(contract, strategy.spec, ranges.__getitem__)
    bound = fixedpoint.budget(bits, len(nodes), z_sqrt_k, fixedpoint.rounding_width(slots))
    server = SecAggServer(shares, threshold, bits, bound, node_noise_std(privacy, bound, slots, len(nodes)),
                          timeout, ring_seed(cfg.federation.seed, server_round), server_round,
                          plan=cfg.secagg.round_shares)
    try:
        why = fixedpoint.refusal(bits, len(nodes), z_sqrt_k, slots)  # the mean mostly rounding
        if why:
            raise SecureRefused(why)
        out = server.run(grid, nodes, {m.metadata.dst_node_id: m.content for m in messages}, slots,
                         ranges, admit(strategy))
    except SecureRefused as why:
        _note(strategy, server.out)
        if isinstance(why, OutOfReach):  # whose input it was: group testing over the next rounds
            search = strategy.state.secagg_search
            _searched(strategy, server_round,
                      search.after_failure(server_round, why.live, cfg.secagg.secagg_liars))
        return (*strategy._skip(server_round, str(why)), _missing(server.out.dropped))
    _note(strategy, server.out)
    strategy.state.secagg_search.after_pass()
    _searched(strategy, server_round, (False, []))
    assert out.total is not None
    records, averaged = fixedpoint.decode_mean(out.total, slots, bound, len(out.live))
    for name in contract.up:  # a record of no arrays (Muon routing nothing) has no slot
        records.setdefault(name, {})
    records = {name: project(contract.domains.get(name, {}), arrays) for name, arrays in records.items()}
    replies = [DecodedReply(arrays=records, metrics={**out.metrics[n], **averaged},
                            num_bytes=0) for n in out.live]
    aggregate, metrics = strategy.aggregate_accepted(server_round, replies, secure=True)
    return aggregate, metrics, _missing(out.dropped)


def project(domains: dict[str, Domain], arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The mean back into each array's domain (v ≥ 0, Θ symmetric PSD): post-processing; the
    rounding of n inputs may leave a PSD matrix's sum a hair outside the cone."""
    return {n: domains[n].project(t) if n in domains and t.is_floating_point() else t
            for n, t in arrays.items()}


def admit(strategy: AdaptiveStrategy) -> Admit:
    """Each masked reply's plain metrics checked as any reply's, and its partition id bound,
    before unmasking: a node refused after the unmask could not be taken out of the sum."""
    contract, privacy = strategy.contract(), strategy.cfg.privacy
    plain = {k: v for k, v in metric_domains(contract, privacy).items() if k not in contract.up_metrics}

    def check(metrics_by_node: dict[int, dict[str, Any]]) -> dict[int, str]:
        assert strategy.state is not None
        why: dict[int, str] = {}
        checked: dict[int, DecodedReply] = {}
        for node, metrics in metrics_by_node.items():
            try:
                values = _check_metrics(metrics, frozenset(), plain, detail_level(privacy.on))
            except ReplyRejected as err:
                why[node] = str(err)
                continue
            checked[node] = DecodedReply(arrays={}, metrics=values, num_bytes=0)
        return {**why, **strategy._bind(checked)}  # committed with the round's state

    return check


def _note(strategy: AdaptiveStrategy, out: SecureRound) -> None:
    """The round's drops, bytes and answers into the strategy's report."""
    report = strategy.report
    strategy.learn_held(out.versions)  # a node dropped before its masked input is forgotten
    for node, why in out.dropped.items():
        strategy._reject(str(node), f"secagg+ {why}")
    report.answered = len(out.live)
    report.bytes_down, report.bytes_up = out.bytes_down, out.bytes_up
    report.down_bytes, report.up_bytes = {"secagg+": out.bytes_down}, {"secagg+": out.bytes_up}


def _searched(strategy: AdaptiveStrategy, server_round: int, outcome: tuple[bool, list[int]]) -> None:
    """The search's columns of the row (strategies/secagg_search.py): the suspects left, whether this
    round's failure ruled an explanation out (then max-skipped-rounds does not count it), every node
    left out, and why the search stopped if it did (logged on each round it fails since)."""
    assert strategy.state is not None
    search, (narrowed, named), bound = strategy.state.secagg_search, outcome, strategy.cfg.secagg.secagg_liars
    row, level = strategy.report.secagg, detail_level(strategy.cfg.privacy.on)
    suspects, explained = search.suspects(bound), search.explained(bound)
    if suspects:
        row[SUSPECTS] = suspects
    if narrowed:
        row[NARROWED] = True
    if search.excluded:
        row[EXCLUDED] = {str(n): why for n, why in search.excluded.items()}
    if isinstance(explained, str):
        row[STOPPED] = explained
        if search.failed and search.failed[-1] == server_round:
            log.warning("%s", explained)
    for node in named:
        log.log(level, "%s", search.excluded[node])


def _missing(dropped: dict[int, str]) -> list[int]:
    return sorted(n for n, why in dropped.items() if why.endswith("no reply"))

