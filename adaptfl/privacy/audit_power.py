"""What a one-run audit (audit_bound.py) can catch at its settings: the largest share of the
booked noise at which it fails the mechanism in at least half of its runs.

The canary mechanism's scores, in units of one canary's contribution C_Δ·b per round: an
included canary adds 1 each round and every score gets the round's noise N(0, σ²), σ = z√k the
canary mechanism's noise multiplier (harness/privacy_audit.py `canary_epsilon`), so over R rounds
Y_i = R·S_i + N(0, R·(s·σ)²) for a mechanism drawing s times its noise. The auditor guesses the
k highest "included" and the k lowest "excluded" and fails the mechanism when the bound from its
correct guesses exceeds the reference ε. This is exact for canary nodes (dp='client': one
coordinate each, no cross-talk) and optimistic for dp='central''s dense directions, whose scores
also carry the other canaries' and the replies' projections.
"""

from __future__ import annotations

import numpy as np

from adaptfl.privacy.audit_bound import epsilon_lower_bound

TRIALS = 20  # simulated audits per noise share
STEP = 0.01  # the share is found to this


def caught(canaries: int, guesses: int, rounds: int, sigma: float, share: float, reference: float,
           delta: float, confidence: float, trials: int = TRIALS, seed: int = 0) -> float:
    """The fraction of simulated audits that fail a mechanism drawing `share` of its noise."""
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(trials):
        included = rng.integers(0, 2, canaries)
        scores = rounds * included + rng.normal(0.0, share * sigma * rounds ** 0.5, canaries)
        order = np.argsort(scores, kind="stable")
        correct = int(included[order[-guesses:]].sum() + (1 - included[order[:guesses]]).sum())
        fails += epsilon_lower_bound(canaries, 2 * guesses, correct, delta, confidence) > reference
    return fails / trials


def detected_share(canaries: int, guesses: int, rounds: int, sigma: float, reference: float,
                   delta: float, confidence: float, trials: int = TRIALS, seed: int = 0) -> float:
    """The largest share s of the noise (to STEP) at which the audit fails the mechanism in at
    least half the simulated audits; 0 when even a noiseless one is not caught. Bisection: fewer
    noise, more correct guesses, a larger bound."""
    def fails(share: float) -> bool:
        return caught(canaries, guesses, rounds, sigma, share, reference, delta, confidence,
                      trials, seed) >= 0.5

    if not fails(0.0):
        return 0.0
    low, high = 0.0, 1.0  # fails(low), and an honest mechanism (share 1) is the reference's
    while high - low > STEP:
        mid = (low + high) / 2.0
        low, high = (mid, high) if fails(mid) else (low, mid)
    return low
