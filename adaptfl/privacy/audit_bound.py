"""The statistics of a one-run privacy audit (Steinke, Nasr & Jagielski, "Privacy Auditing with
One (1) Training Run", NeurIPS 2023): from the count of correct guesses about m canaries, each
included with probability ½, the largest ε that (ε, δ)-DP is rejected at, with confidence 1 − p.

Their main theorem for the (ε, δ) case (its number was not re-checked against the paper): when
the mechanism is (ε, δ)-DP in each canary's inclusion and an auditor makes r guesses (the rest
abstain), W, the number of correct ones, satisfies for every v

    P[W ≥ v] ≤ f(v) + 2·m·δ·max_{i=1..m} (f(v − i) − f(v)) / i,
    f(v) = P[Binomial(r, q) ≥ v],  q = e^ε / (1 + e^ε)

(q: the accuracy of ε-DP randomised response; for i ≥ v the quotient only shrinks, f(v − i)
being 1, so i runs to v). Observing v correct guesses thus rejects (ε, δ)-DP at p-value
`p_value(...)`; the empirical ε is the largest ε whose p-value stays below p (it is increasing
in ε). Plain float arithmetic with log-space binomial terms: r is at most a few thousand.
"""

from __future__ import annotations

import math


def binomial_pmf(j: int, r: int, q: float) -> float:
    """P[Binomial(r, q) = j]."""
    if j < 0 or j > r:
        return 0.0
    if q in (0.0, 1.0):  # log(0): the mass sits on one end
        return float(j == (r if q == 1.0 else 0))
    log = (math.lgamma(r + 1) - math.lgamma(j + 1) - math.lgamma(r - j + 1)
           + j * math.log(q) + (r - j) * math.log1p(-q))
    return math.exp(log)


def binomial_tail(v: int, r: int, q: float) -> float:
    """f(v) = P[Binomial(r, q) ≥ v] (1 for v ≤ 0)."""
    if v <= 0:
        return 1.0
    return min(1.0, math.fsum(binomial_pmf(j, r, q) for j in range(v, r + 1)))


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The main theorem's bound on P[W ≥ v] under (ε, δ)-DP: m canaries, r guesses, v correct."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m})")
    if eps < 0.0 or not 0.0 <= delta <= 1.0:
        raise ValueError(f"need eps >= 0 and delta in [0, 1], got {eps}, {delta}")
    q = 1.0 / (1.0 + math.exp(-eps))
    tail = binomial_tail(v, r, q)
    if delta == 0.0:
        return min(1.0, tail)
    worst, between = 0.0, 0.0  # between = f(v − i) − f(v) = P[v − i ≤ Binomial < v]
    for i in range(1, v + 1):
        between += binomial_pmf(v - i, r, q)
        worst = max(worst, between / i)
    return min(1.0, tail + 2.0 * m * delta * worst)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95,
                        tol: float = 1e-6) -> float:
    """The largest ε (to `tol`) at which (ε, δ)-DP is rejected with `confidence`: p_value < 1 −
    confidence. 0 when even ε = 0 is not rejected (e.g. half the guesses right)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")
    alpha = 1.0 - confidence
    if r == 0 or p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    low, high = 0.0, 1.0  # p_value(low) < alpha <= p_value(high)
    while p_value(m, r, v, high, delta) < alpha:
        low, high = high, 2.0 * high
        if high > 1e4:  # never rejected at any ε: all right with δ = 0 and r = ∞ only
            return math.inf
    while high - low > tol:
        mid = (low + high) / 2.0
        if p_value(m, r, v, mid, delta) < alpha:
            low = mid
        else:
            high = mid
    return low
