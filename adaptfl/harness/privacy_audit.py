"""An empirical privacy audit in one training run (Steinke, Nasr & Jagielski, NeurIPS 2023):
`python -m adaptfl.harness.privacy_audit [--canaries 1000] [run-config key=value ...]`.

    canaries   m random directions u_i (independent unit vectors over Δ's floating arrays,
               from `--audit-seed`), each included with probability ½ (S_i, from the same
               seeded RNG). A canary is a slot of the server's DP mean in every round: C_Δ·u_i
               if included, a zero contribution if not, so the mean always has n + m items and
               the noise is calibrated to that count (b = 1/(n + m)); no canary is trained or
               sampled. The slots are appended to the mechanism's input set inside the round
               (`CanaryMean`, a `GaussianMean`): each goes through the same clipping (to the
               round's C_Δ) and gets the same noise as the real replies. Every other shared
               record (v, Θ_i, …) gets a zero item per slot, so every record's mean has the
               n + m items its noise assumes.
    scores     white-box (the paper's setting for DP-SGD where the auditor sees every
               iterate): Y_i = Σ_t ⟨Δ̃_t, u_i⟩, Δ̃_t the released noised mean Δ of round t (what
               the mechanism outputs; the model and every broadcast state are post-processing
               of it). The canary enters the aggregate directly, as the paper's white-box
               experiments insert canary gradients into DP-SGD's sum, here at user level: no
               training is needed to score it.
    guesses    "included" for the k+ highest scores, "excluded" for the k− lowest (k fixed before
               the run), W = the correct ones; ε from W by the main theorem (audit_bound.py) at `--
               confidence` and the run's dp-delta.

The reference, the canary mechanism's own ε: switching S_i changes round t's noised sum by
C_Δ·u_i, of norm ≤ C_Δ, under noise of std z√k·C_Δ per coordinate of the sum (k records share
z): a Gaussian mechanism of noise multiplier z√k per round, with no sampling (a canary is in
every round when included), composed over the rounds scored (`canary_epsilon`). That is what the
canaries can detect, and about half the accountant's `no-amplification` ε (z/2 per round:
replace-one, 2·C, which a canary never is), so an audit against the latter could not catch a
mechanism with half its noise. An audit above the canary ε means the mechanism leaks more than
accounted (or the 5 % chance at 95 % confidence). Adaptive clipping is refused: its counts take
part of z, so the records' noise is not z√k·C. The audited run is for the audit: m slots of
canaries and zeros swamp the n real replies' mean.

Under dp='client' the noise is the nodes', so the canaries are canary nodes in the cohort, each
noising its own reply with the node's code (node_canaries.py; inside SecAgg+, its integers with
the SecAgg+ node's code: secure_canaries.py); the reference is the same canary ε.

Its runs book in ledgers of their own, <ledger dir>/audits/ (privacy/ledger.py `apart`): the
server's and, under dp='client', every simulated node's. An audit run tests the mechanism, at
noise chosen to be caught, and its outputs are the auditor's, so it must not spend or jam the
budget that later runs on the data are checked against (docs/privacy.md, "A ledger across
runs"); a `dp-ledger` or `dp-node-ledger` named on purpose is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.sampling import sample_size
from adaptfl.core import wire
from adaptfl.harness.canaries import Canaries
from adaptfl.harness.node_canaries import NodeCanaries
from adaptfl.harness.secure_canaries import SecureCanaries, secure_cohort
from adaptfl.privacy import client, ledger, node_ledger, server
from adaptfl.privacy.accountant import epsilon
from adaptfl.privacy.audit_bound import epsilon_lower_bound
from adaptfl.privacy.audit_power import detected_share
from adaptfl.privacy.mechanism import ALIASES, GaussianMean, round_seed, shared_records
from adaptfl.server_rules.aggregators import Combine, Items, Tensors
from adaptfl.strategies.base import AdaptiveStrategy

if TYPE_CHECKING:
    from adaptfl.algorithms.settings import Federation
    from adaptfl.core.contract import Contract
    from adaptfl.core.privacy_settings import Privacy

PROG = "python -m adaptfl.harness.privacy_audit"
# under the overrides given; an audit measures ε, so a plan past dp-accept-epsilon (the audit's
# own tiny-noise runs) is what it is there to test, not a run to refuse
# an audit measures ε on whatever rounds it is given: it refuses no plan and no small round
DEFAULTS = {"dp": "central", "weighting": "uniform", "dp-accept-epsilon": 1e12, "accept-small-rounds": True}


@dataclass
class CanaryMean(GaussianMean):
    """The DP mean with the canaries' slots appended to every record's replies."""

    canaries: Canaries | None = None
    server_round: int = 0

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        assert self.canaries is not None
        name = ALIASES.get(record, record)
        share = sum(weights) / len(weights)  # uniform (checked): each slot weighs as one reply
        extra, extra_weights = self.canaries.slots(items[0], name, self._bound(name, ctx), share,
                                                   self.server_round)
        out = super().combine([*items, *extra], [*weights, *extra_weights], record, ctx)
        if name == wire.DELTA:
            self.canaries.score(out)
        return out


@contextlib.contextmanager
def canaries_in(canaries: Canaries) -> Iterator[None]:
    """For the run inside: each round's DP mean is a CanaryMean whose noise counts the slots
    (the strategy calls `privacy.server.round_combine` through the module, so this reaches it;
    tests/harness/test_privacy_audit.py checks the noise std is z·C/(n + m)); for canary nodes
    (dp='client') every instruction names the n + m nodes of the cohort, and they read its recipe."""
    original, instruction = server.round_combine, AdaptiveStrategy.instruction

    def combine(privacy: Privacy, fed: Federation, contract: Contract, replies: int, sampled: int,
                server_round: int) -> GaussianMean:
        return CanaryMean(privacy, len(shared_records(contract)),
                          server.share_bound(fed, replies + canaries.count),
                          round_seed(privacy.dp_seed, "server", server_round),
                          server.count_stddev(privacy, sampled), canaries=canaries,
                          server_round=server_round)

    def cohort(self: AdaptiveStrategy, server_round: int, config: ConfigRecord | None = None,
               sampled: int | None = None) -> RecordDict:
        if sampled is None:  # the preflight's one-node dry run: no cohort
            return instruction(self, server_round, config)
        content = instruction(self, server_round, config, sampled + canaries.count)
        canaries.recipe = dict(content.config_records[wire.RECIPE])  # type: ignore[attr-defined]
        canaries.server_round = server_round  # type: ignore[attr-defined]
        canaries.shared = shared_records(self.contract())  # type: ignore[attr-defined]
        return content

    setattr(server, "round_combine", combine)  # noqa: B010 - restored below
    if isinstance(canaries, NodeCanaries):
        setattr(AdaptiveStrategy, "instruction", cohort)  # noqa: B010 - restored below
    try:
        with secure_cohort(canaries) if isinstance(canaries, SecureCanaries) else contextlib.nullcontext():
            yield
    finally:
        setattr(server, "round_combine", original)  # noqa: B010
        setattr(AdaptiveStrategy, "instruction", instruction)  # noqa: B010


def check(cfg: RunConfig) -> None:
    if cfg.privacy.dp not in ("central", "client"):
        raise ValueError(f"dp={cfg.privacy.dp!r}: the audit adds its canaries to the server's "
                         "noised mean (dp='central') or as canary nodes (dp='client')")
    if cfg.secagg.on and cfg.privacy.dp != "client":  # canary nodes add their integers to the sum
        raise ValueError(f"secagg={cfg.secagg.secagg!r} with dp={cfg.privacy.dp!r}: the audit's "
                         "canaries join a SecAgg+ sum as canary nodes, under dp='client' only")
    if cfg.federation.weighting != "uniform":
        raise ValueError(f"weighting={cfg.federation.weighting!r}: the audit needs "
                         "weighting='uniform' (a canary slot weighs as one reply)")
    if cfg.privacy.adaptive:  # the counts take part of z: the canary's noise is not z√k·C
        raise ValueError("dp-clip-lr > 0: the audit's reference is the canary mechanism's ε at "
                         "z√k per round, which adaptive clipping's counts lower; use dp-clip-lr=0")
    if cfg.output.resume or cfg.output.resume_from:  # the canaries' scores live in this process
        raise ValueError("resume: an audit scores every round in one process; start a fresh run")


AUDIT_NODE_BUDGET = 1e12  # ε: past any run the audit plays


def node_floor(cfg: RunConfig, cohort: int) -> dict[str, Any]:
    """Every node's floor in a dp='client' audit: exactly the run's z, C_Δ, C_s and the cohort
    of n + m, so a node adds no more noise than the run books (the audit sees the nodes' noise)."""
    privacy = cfg.privacy
    return {client.MIN_NOISE: privacy.dp_noise_multiplier, client.MAX_CLIP: privacy.dp_clip_norm,
            client.MAX_STATE_CLIP: privacy.dp_state_clip_norm, client.MAX_COHORT: cohort,
            client.TESTING_SEED: privacy.dp_testing_reproducible_noise,
            # the simulated nodes' own budget: their ledgers book what they release, but may not
            # stop the weak-noise runs the audit exists to catch (one release at z = 0.25: ε 8,363)
            node_ledger.MAX_EPSILON: AUDIT_NODE_BUDGET}


@dataclass(frozen=True)
class AuditResult:
    canaries: int
    guesses: tuple[int, int]  # k+, k−
    correct: int
    rounds: int
    delta: float
    confidence: float
    epsilon_audit: float  # the empirical lower bound
    epsilon_run: float  # the run's accountant, its own dp-accounting
    epsilon_no_amplification: float  # the accountant's replace-one bound without sampling
    epsilon_canary: float  # the canary mechanism's own ε: what a failure is measured against
    accounting: str
    results: Path
    detected_share: float = 0.0  # the largest share of its noise a mechanism is caught at (audit_power.py)
    ledger: str = ""  # the ledger the run booked in: the audit's own, unless dp-ledger named one

    def lines(self) -> list[str]:
        k_in, k_out = self.guesses
        out = [f"audit: {self.canaries} canaries, {k_in}+{k_out} guesses, {self.correct} correct, "
               f"{self.rounds} rounds scored (white-box: each canary against the released noised "
               "mean Δ of every round)",
               f"empirical ε ≥ {self.epsilon_audit:.4g} at {self.confidence:.0%} confidence "
               f"(δ={self.delta:g}): a lower bound from this one run",
               f"accountant's ε = {self.epsilon_run:.4g} (dp-accounting={self.accounting}, "
               f"δ={self.delta:g})"]
        if self.accounting != "no-amplification":
            out.append(f"accountant's ε without amplification = {self.epsilon_no_amplification:.4g}")
        out.append(f"canary mechanism's ε = {self.epsilon_canary:.4g} (the reference: z√k per round, "
                   "a canary in every round it is included in, added or removed)")
        half = "catches" if self.detected_share >= 0.5 else "does not catch"
        out.append(f"power: at these settings the audit fails a mechanism drawing {self.detected_share:.2f} "
                   f"of its noise or less in half of simulated audits (the canary scores' model); it "
                   f"{half} half the noise (docs/privacy.md, 'The audit's power')")
        if self.ledger:
            out.append(f"booked in {self.ledger} (the audit's own ledger unless dp-ledger named "
                       "one; not the data's: docs/privacy.md, 'A ledger across runs')")
        if self.failed:
            out.append("audit FAILED: the empirical lower bound exceeds the canary mechanism's ε: "
                       "the mechanism leaks more than it accounts for")
        return out

    @property
    def failed(self) -> bool:
        return self.epsilon_audit > self.epsilon_canary


def canary_epsilon(z: float, records: int, rounds: int, delta: float) -> float:
    """ε at δ of the canary mechanism: a Gaussian of noise multiplier z·√records per round on a
    canary of norm ≤ C_Δ, composed over `rounds` (the accountant's events are z/2 per round, so
    its event multiplier here is 2·z·√records)."""
    return epsilon([(2.0 * z * records ** 0.5, 1, 1)] * rounds, delta, "no-amplification")


def run_audit(cfg: RunConfig, num_nodes: int, canaries: int = 1000, guesses: int | None = None,
              seed: int = 0, confidence: float = 0.95,
              node_config: Mapping[str, Any] | None = None) -> AuditResult:
    """One dp run on the in-process engine with `canaries` canaries; `guesses` per side (k+ =
    k− = m/10 by default), fixed before the run as the bound requires. Under dp='client' the
    canaries are canary nodes and every node's floor is `node_floor`, with `node_config`'s keys
    over it (a weaker floor: what the audit is to catch)."""
    from adaptfl.engine.inprocess import InProcessGrid
    from adaptfl.server_app.loop import run_federated
    from adaptfl.strategies.skips import RunAborted

    check(cfg)
    k = max(1, canaries // 10) if guesses is None else guesses
    grid = InProcessGrid(num_nodes, cfg.to_flower())
    audit: Canaries = Canaries(canaries, seed)
    if cfg.privacy.dp == "client":
        floor = {**node_floor(cfg, sample_size(cfg.federation, num_nodes) + canaries), **(node_config or {})}
        audit = SecureCanaries(canaries, seed, node_config=floor, bits=cfg.secagg.secagg_modulus_bits) \
            if cfg.secagg.on else NodeCanaries(canaries, seed, node_config=floor)
        for context in grid.contexts.values():
            context.node_config.update(floor)
    audit.correct(k, k)  # refuses a bad k before the run
    with canaries_in(audit), ledger.apart(ledger.AUDITS):  # not the data's ledger: see above
        try:
            out = run_federated(grid, cfg)
        except RunAborted as err:  # every round refused (a node's floor) or skipped
            raise ValueError(f"{err}: no round released a mean, nothing to audit") from None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    rows = [r for r in rows if r["round"] >= 1 and "dp-noise-multiplier" in r]
    if not audit.rounds:  # unscored canaries would still be "guessed", by their index
        raise ValueError(f"no round released a mean (every one refused or skipped: {out}): "
                         "nothing to audit")
    events = [(float(r["dp-noise-multiplier"]), int(r["replies-sampled"]), num_nodes) for r in rows]
    privacy = cfg.privacy
    correct = audit.correct(k, k)
    records = cfg.algorithm.reply_record_count()
    reference = canary_epsilon(privacy.dp_noise_multiplier, records, audit.rounds, privacy.dp_delta)
    return AuditResult(
        canaries=canaries, guesses=(k, k), correct=correct, rounds=audit.rounds, delta=privacy.dp_delta,
        confidence=confidence,
        epsilon_audit=epsilon_lower_bound(canaries, 2 * k, correct, privacy.dp_delta, confidence),
        epsilon_run=float(rows[-1]["dp-epsilon"]) if rows else 0.0,
        epsilon_no_amplification=epsilon(events, privacy.dp_delta, "no-amplification"),
        epsilon_canary=reference, accounting=privacy.dp_accounting, results=out, ledger=booked_in(out),
        detected_share=detected_share(canaries, k, audit.rounds, privacy.dp_noise_multiplier * records ** 0.5,
                                      reference, privacy.dp_delta, confidence))


def booked_in(out: Path) -> str:
    """The ledger file the run's rounds went to (server-confidential.jsonl names it)."""
    rows = [json.loads(line) for line in (out / "server-confidential.jsonl").read_text().splitlines() if line]
    return next((str(r["dp-ledger-file"]) for r in reversed(rows) if "dp-ledger-file" in r), "")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=int, default=10)
    parser.add_argument("--canaries", type=int, default=1000, help="m, each included with probability 1/2")
    parser.add_argument("--guesses", type=int, default=None,
                        help="k: 'included' for the k highest scores, 'excluded' for the k lowest "
                             "(default m/10)")
    parser.add_argument("--audit-seed", type=int, default=0, help="the canaries' directions and inclusion")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("overrides", nargs="*", help="run-config key=value pairs (docs/privacy.md)")
    return parser


def main(argv: list[str] | None = None) -> None:
    import logging

    from adaptfl.engine.__main__ import parse_overrides, refuse

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = RunConfig.from_flower({**DEFAULTS, **parse_overrides(args.overrides)})
        result = run_audit(cfg, args.num_nodes, args.canaries, args.guesses, args.audit_seed,
                           args.confidence)
    except (ValueError, OSError, ImportError) as err:
        raise refuse(err) from None
    print(f"results: {result.results}")
    print("\n".join(result.lines()))
    if result.failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
