"""Distributed discrete Gaussian noise for secure aggregation with distributed DP (Kairouz, Liu &
Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure
Aggregation", ICML 2021): each client adds N_Z(0, σ²/n) to its quantised update before masking,
so the server only ever sees the sum, which carries noise of variance ≈ σ².

Why discrete: SecAgg sums integers mod 2^m. Continuous noise would have to be rounded into that
ring, and rounded Gaussian noise is not what the DP analysis covers; an integer sample from the
discrete Gaussian is, and the sum over Z mod 2^m stays an integer (wrap-around aside) that it covers.

Why OS entropy: noise from a seedable generator is only as unpredictable as its seed; with a 32-bit
seed space anyone holding the sum can search every seed, regenerate the noise and subtract it. The
bits here come from the OS CSPRNG (`secrets`), with no seed to search. The `rng` argument exists
only for reproducible tests.

Caveat: the sum of n independent N_Z(0, σ²/n) is not exactly N_Z(0, σ²); Kairouz et al. bound
the gap, which shrinks exponentially in the per-client σ² and is negligible for per-client σ ≫ 1.

Sampler: Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian for Differential Privacy",
Algorithm 3), vectorised: discrete Laplace proposals of scale t = ⌊σ⌋ + 1, each accepted with
probability exp(-(|Y| - σ²/t)² / (2σ²)). Known limitation: the acceptance test is computed in
float64, so this is not the paper's exact rational-arithmetic sampler.
"""

from __future__ import annotations

import math
import secrets

import numpy as np

# A margin below t ≈ 2.4e14, where -t·log(U) (≤ 37.5·t) leaves float64's exact integers (2^53).
MAX_SIGMA = 1e12
_BATCH_MAX = 1 << 20  # proposals per round, bounds memory for large `size`


def _uniforms_from_bits(bits: np.ndarray) -> np.ndarray:
    """uint64 bits -> floats in (0, 1) on the 53-bit grid ((b>>11)+0.5)·2^-53: never 0 or 1."""
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _uniforms(n: int, rng: np.random.Generator | None) -> np.ndarray:
    # 8 bytes per uniform; the OS CSPRNG unless a test passes its own generator.
    raw = secrets.token_bytes(8 * n) if rng is None else rng.bytes(8 * n)
    return _uniforms_from_bits(np.frombuffer(raw, dtype=np.uint64))


def _geometric(t: float, u: np.ndarray) -> np.ndarray:
    """Geometric on {0, 1, ...} with success prob 1 - exp(-1/t), by inversion: P(G >= k) = e^{-k/t}.

    No overflow or loss up to MAX_SIGMA: U >= 2^-54, so G <= 37.5·t < 2^53 is an exact integer in
    float64 and int64; the 53-bit grid of U only coarsens G beyond G ≈ t·(36.7 - ln t): 16·t at
    t = 1e9, where the acceptance below is < e^-100 (9·t and < e^-30 at MAX_SIGMA).
    """
    g: np.ndarray = np.floor(np.log(u) / (-1.0 / t)).astype(np.int64)
    return g


def discrete_laplace(t: int, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Samples with pmf ∝ exp(-|x|/t) over the integers: the difference of two iid geometrics."""
    u = _uniforms(2 * size, rng)
    x: np.ndarray = _geometric(float(t), u[:size]) - _geometric(float(t), u[size:])
    return x


def _check_sigma(sigma: float, name: str = "sigma") -> float:
    sigma = float(sigma)
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {sigma!r}")
    return sigma


def discrete_gaussian(sigma: float, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """`size` int64 samples of N_Z(0, sigma²): pmf ∝ exp(-x²/(2σ²)) over the integers.

    `rng` is for tests only; None (the default) draws every bit from the OS CSPRNG.
    """
    sigma = _check_sigma(sigma)
    if sigma > MAX_SIGMA:
        raise ValueError(f"sigma must be <= {MAX_SIGMA:g} (float64 exactness), got {sigma!r}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size!r}")
    if sigma == 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    t = math.floor(sigma) + 1
    var = sigma * sigma
    shift = var / t
    accepted: list[np.ndarray] = []
    have = 0
    while have < size:
        # Acceptance is at least ~0.4 over the supported σ range, so 2.5x the missing count
        # (plus a floor against small-count tails) usually finishes in one or two rounds.
        n = min(_BATCH_MAX, max(64, int(2.5 * (size - have))))
        y = discrete_laplace(t, n, rng)
        u = _uniforms(n, rng)
        keep = u < np.exp(-((np.abs(y) - shift) ** 2) / (2 * var))
        accepted.append(y[keep])
        have += int(keep.sum())
    # The proposals are iid, so keeping the first `size` accepted ones is unbiased.
    return np.concatenate(accepted)[:size]


def share_sigma(total_sigma: float, clients: int) -> float:
    """Per-client σ such that `clients` independent shares sum to variance total_sigma²: σ/√n."""
    total_sigma = _check_sigma(total_sigma, "total_sigma")
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients!r}")
    return total_sigma / math.sqrt(clients)
