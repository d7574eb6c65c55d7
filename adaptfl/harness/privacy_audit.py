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
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.privacy import server
from adaptfl.privacy.accountant import epsilon
from adaptfl.privacy.audit_bound import epsilon_lower_bound
from adaptfl.privacy.mechanism import ALIASES, GaussianMean, round_seed, shared_records
from adaptfl.server_rules.aggregators import Combine, Items, Tensors

PROG = "python -m adaptfl.harness.privacy_audit"
# under the overrides given; an audit measures ε, so a plan past dp-accept-epsilon (the audit's
# own tiny-noise runs) is what it is there to test, not a run to refuse
DEFAULTS = {"dp": "central", "weighting": "uniform", "dp-accept-epsilon": 1e12}


@dataclass
class Canaries:
    """The audit's randomness (seeded: it is the auditor's, not the mechanism's) and its scores."""

    count: int
    seed: int = 0
    included: np.ndarray = field(init=False)  # S_i, bool [m]
    directions: torch.Tensor | None = None  # float32 [m, d], unit rows: drawn at the first Δ
    layout: list[tuple[str, torch.Size]] = field(default_factory=list)  # Δ's floating arrays
    scores: np.ndarray = field(init=False)  # Y_i, float64 [m]
    rounds: int = 0  # Δ releases scored

    def __post_init__(self) -> None:
        if self.count < 2:
            raise ValueError(f"--canaries {self.count}: need at least 2")
        self.rng = np.random.default_rng(self.seed)
        self.included = self.rng.random(self.count) < 0.5
        self.scores = np.zeros(self.count)

    def _draw(self, like: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """u_i: normalised Gaussian vectors over Δ's floating arrays (in `like`'s key order)."""
        self.layout = [(n, t.shape) for n, t in like.items() if t.is_floating_point()]
        dim = sum(int(np.prod(shape)) for _, shape in self.layout)
        # float32 throughout: m·d·4 bytes (1000 canaries on the 185k-parameter cnn: 0.74 GB)
        raw = self.rng.standard_normal((self.count, dim), dtype=np.float32)
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        self.directions = torch.from_numpy(raw)
        return self.directions

    def items(self, like: Mapping[str, torch.Tensor], bound: float) -> list[Tensors]:
        """The m slots of Δ's mean: C·u_i where included, zeros where not (integer arrays: 0)."""
        directions = self.directions if self.directions is not None else self._draw(like)
        zero = {n: torch.zeros_like(t) for n, t in like.items()}
        out = []
        for i in range(self.count):
            if not self.included[i]:
                out.append(zero)
                continue
            parts = torch.split(directions[i] * bound, [int(np.prod(s)) for _, s in self.layout])
            item = dict(zero)
            item.update({n: p.view(s).to(like[n].dtype)
                         for (n, s), p in zip(self.layout, parts, strict=True)})
            out.append(item)
        return out

    def score(self, released: Mapping[str, torch.Tensor]) -> None:
        """Y_i += ⟨Δ̃_t, u_i⟩ for this round's released Δ̃_t."""
        assert self.directions is not None
        flat = torch.cat([released[n].reshape(-1).float() for n, _ in self.layout])
        self.scores += (self.directions @ flat).double().numpy()
        self.rounds += 1

    def correct(self, k_in: int, k_out: int) -> int:
        """W: "included" right among the k_in highest scores plus "excluded" among the k_out lowest."""
        if k_in < 0 or k_out < 0 or k_in + k_out > self.count:
            raise ValueError(f"guesses {k_in}+{k_out} must be >= 0 and at most the {self.count} canaries")
        order = np.argsort(self.scores, kind="stable")
        high = order[self.count - k_in:] if k_in else order[:0]
        return int(self.included[high].sum() + (~self.included[order[:k_out]]).sum())


@dataclass
class CanaryMean(GaussianMean):
    """The DP mean with the canaries' m slots appended to every record's replies."""

    canaries: Canaries | None = None

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        assert self.canaries is not None
        name = ALIASES.get(record, record)
        if name == wire.DELTA:
            extra = self.canaries.items(items[0], self._bound(name, ctx))
        else:  # a canary shares nothing else: zeros keep every mean at n + m items
            extra = [{n: torch.zeros_like(t) for n, t in items[0].items()}] * self.canaries.count
        share = sum(weights) / len(weights)  # uniform (checked): each slot weighs as one reply
        out = super().combine([*items, *extra], [*weights, *[share] * len(extra)], record, ctx)
        if name == wire.DELTA:
            self.canaries.score(out)
        return out


@contextlib.contextmanager
def canaries_in(canaries: Canaries) -> Iterator[None]:
    """For the run inside: each round's DP mean is a CanaryMean whose noise counts the slots
    (the strategy calls `privacy.server.round_combine` through the module, so this reaches it;
    tests/harness/test_privacy_audit.py checks the noise std is z·C/(n + m))."""
    original = server.round_combine

    def combine(privacy, fed, contract, replies, sampled, server_round):  # noqa: ANN001, ANN202
        return CanaryMean(privacy, len(shared_records(contract)),
                          server.share_bound(fed, replies + canaries.count),
                          round_seed(privacy.dp_seed, "server", server_round),
                          server.count_stddev(privacy, sampled), canaries=canaries)

    setattr(server, "round_combine", combine)  # noqa: B010 - restored below
    try:
        yield
    finally:
        setattr(server, "round_combine", original)  # noqa: B010


def check(cfg: RunConfig) -> None:
    if cfg.privacy.dp != "central":
        raise ValueError(f"dp={cfg.privacy.dp!r}: the audit adds its canaries to the server's "
                         "noised mean, so it needs dp='central'")
    if cfg.federation.weighting != "uniform":
        raise ValueError(f"weighting={cfg.federation.weighting!r}: the audit needs "
                         "weighting='uniform' (a canary slot weighs as one reply)")
    if cfg.privacy.adaptive:  # the counts take part of z: the canary's noise is not z√k·C
        raise ValueError("dp-clip-lr > 0: the audit's reference is the canary mechanism's ε at "
                         "z√k per round, which adaptive clipping's counts lower; use dp-clip-lr=0")
    if cfg.output.resume or cfg.output.resume_from:  # the canaries' scores live in this process
        raise ValueError("resume: an audit scores every round in one process; start a fresh run")


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
              seed: int = 0, confidence: float = 0.95) -> AuditResult:
    """One dp run on the in-process engine with `canaries` canaries; `guesses` per side (k+ =
    k− = m/10 by default), fixed before the run as the bound requires."""
    from adaptfl.engine.inprocess import InProcessGrid
    from adaptfl.server_app.loop import run_federated

    check(cfg)
    k = max(1, canaries // 10) if guesses is None else guesses
    audit = Canaries(canaries, seed)
    audit.correct(k, k)  # refuses a bad k before the run
    with canaries_in(audit):
        out = run_federated(InProcessGrid(num_nodes, cfg.to_flower()), cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    rows = [r for r in rows if r["round"] >= 1 and "dp-noise-multiplier" in r]
    events = [(float(r["dp-noise-multiplier"]), int(r["replies-sampled"]), num_nodes) for r in rows]
    privacy = cfg.privacy
    correct = audit.correct(k, k)
    return AuditResult(
        canaries=canaries, guesses=(k, k), correct=correct, rounds=audit.rounds, delta=privacy.dp_delta,
        confidence=confidence,
        epsilon_audit=epsilon_lower_bound(canaries, 2 * k, correct, privacy.dp_delta, confidence),
        epsilon_run=float(rows[-1]["dp-epsilon"]) if rows else 0.0,
        epsilon_no_amplification=epsilon(events, privacy.dp_delta, "no-amplification"),
        epsilon_canary=canary_epsilon(privacy.dp_noise_multiplier, cfg.algorithm.reply_record_count(),
                                      audit.rounds, privacy.dp_delta),
        accounting=privacy.dp_accounting, results=out)


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
