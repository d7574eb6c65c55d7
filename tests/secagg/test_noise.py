"""The distributed discrete Gaussian (adaptfl/secagg/noise.py): its samples fit the exact pmf, come
from OS entropy, and n shares sum to the target variance. Every statistical test uses a fixed
generator, so it is deterministic; the last test shows the goodness-of-fit test has power."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from adaptfl.secagg import noise
from adaptfl.secagg.noise import discrete_gaussian, discrete_laplace, share_sigma

N = 200_000  # samples per statistical test
P_MIN = 1e-4  # goodness of fit: reject below this p-value

try:
    from scipy import stats
except ImportError:  # pragma: no cover - scipy is optional
    stats = None


def _chi2_bound(df: int) -> float:
    """The chi-square quantile at 1 - P_MIN (Wilson-Hilferty), used when scipy is missing."""
    z = 3.7190164854556804  # standard normal quantile at 1 - 1e-4
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _fits(observed: np.ndarray, expected: np.ndarray) -> bool:
    """Pearson's chi-square over the bins: True if the fit is not rejected at P_MIN."""
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = len(observed) - 1
    if stats is not None:
        return float(stats.chi2.sf(stat, df)) > P_MIN
    return stat < _chi2_bound(df)


def _pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact N_Z(0, σ²) pmf, normalised over ±12σ (the mass beyond is < e^-72)."""
    half = math.ceil(12 * sigma) + 3
    xs = np.arange(-half, half + 1)
    w = np.exp(-(xs.astype(np.float64) ** 2) / (2 * sigma**2))
    return xs, w / w.sum()


def _binned(samples: np.ndarray, xs: np.ndarray, pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One bin per integer with expected count >= 5; each tail lumped into the outermost bin."""
    expected = len(samples) * pmf
    inner = xs[expected >= 5]
    lo, hi = int(inner[0]), int(inner[-1])
    clipped = np.clip(samples, lo, hi) - lo
    observed = np.bincount(clipped, minlength=hi - lo + 1).astype(np.float64)
    exp_bins = expected[(xs >= lo) & (xs <= hi)].copy()
    exp_bins[0] += expected[xs < lo].sum()
    exp_bins[-1] += expected[xs > hi].sum()
    return observed, exp_bins


@pytest.mark.parametrize("sigma", [0.5, 0.7, 3.0, 25.0])
def test_fits_exact_pmf(sigma: float) -> None:
    # 1M samples: a 3% error in the acceptance's shift σ²/t fails at every σ here.
    xs, pmf = _pmf(sigma)
    samples = discrete_gaussian(sigma, 5 * N, rng=np.random.default_rng(1))
    assert _fits(*_binned(samples, xs, pmf))


def test_rounded_continuous_gaussian_is_rejected() -> None:
    # The test has power: round(N(0, σ²)) puts ~0.52 on 0 where N_Z puts ~0.57 (σ = 0.7).
    sigma = 0.7
    xs, pmf = _pmf(sigma)
    rounded = np.rint(np.random.default_rng(1).normal(0, sigma, 5 * N)).astype(np.int64)
    assert not _fits(*_binned(rounded, xs, pmf))


def test_discrete_laplace_fits_its_pmf() -> None:
    t = 3
    xs = np.arange(-60, 61)
    w = np.exp(-np.abs(xs) / t)
    samples = discrete_laplace(t, N, rng=np.random.default_rng(2))
    assert _fits(*_binned(samples, xs, w / w.sum()))


@pytest.mark.parametrize("sigma", [0.5, 3.0, 1e6, 1e9])
def test_mean_and_variance(sigma: float) -> None:
    if sigma < 30:  # N_Z's variance is below σ² for small σ: take the exact moments
        xs, pmf = _pmf(sigma)
        var = float((xs.astype(np.float64) ** 2 * pmf).sum())
        m4 = float((xs.astype(np.float64) ** 4 * pmf).sum())
    else:  # indistinguishable from the continuous Gaussian's
        var, m4 = sigma**2, 3 * sigma**4
    x = discrete_gaussian(sigma, N, rng=np.random.default_rng(3)).astype(np.float64)
    assert abs(x.mean()) < 5 * math.sqrt(var / N)
    assert abs(np.mean(x**2) - var) < 5 * math.sqrt((m4 - var**2) / N)


def test_symmetric() -> None:
    # Signs: under symmetry #positive ~ Binomial(#nonzero, ½); 1M samples catch a 3% scale
    # mismatch between the two geometrics. Then count(k) vs count(-k): a chi-square over the pairs.
    x = discrete_gaussian(3.0, 5 * N, rng=np.random.default_rng(4))
    positive, negative = int((x > 0).sum()), int((x < 0).sum())
    assert abs(positive - negative) < 5 * math.sqrt(positive + negative)
    ks = np.arange(1, 12)
    pos = np.array([(x == k).sum() for k in ks], dtype=np.float64)
    neg = np.array([(x == -k).sum() for k in ks], dtype=np.float64)
    stat = float(((pos - neg) ** 2 / (pos + neg)).sum())
    bound = float(stats.chi2.isf(P_MIN, len(ks))) if stats is not None else _chi2_bound(len(ks)) * 1.05
    assert stat < bound


def test_large_sigma_keeps_its_low_digits() -> None:
    # No float loss in the geometric inversion at σ = 1e9: the last digit is uniform.
    x = discrete_gaussian(1e9, N, rng=np.random.default_rng(5))
    observed = np.bincount(x % 10, minlength=10).astype(np.float64)
    assert _fits(observed, np.full(10, N / 10))
    assert np.abs(x).max() < 10 * 1e9


def test_geometric_inversion_at_large_scale() -> None:
    t = 1e9 + 1
    g = noise._geometric(t, noise._uniforms(N, np.random.default_rng(6)))
    q = math.exp(-1 / t)
    mean, sd = q / (1 - q), math.sqrt(q) / (1 - q)
    assert g.min() >= 0
    assert abs(g.mean() - mean) < 5 * sd / math.sqrt(N)


def test_uniforms_stay_inside_the_open_interval() -> None:
    u = noise._uniforms_from_bits(np.array([0, 1 << 11, 2**64 - 1], dtype=np.uint64))
    assert u[0] == 2.0**-54 and u[1] == 1.5 * 2.0**-53 and u[2] == 1 - 2.0**-54
    assert np.isfinite(np.log(u)).all()


@pytest.mark.parametrize("size", [0, 1, 7, 1000])
def test_dtype_and_shape(size: int) -> None:
    x = discrete_gaussian(2.5, size)
    assert x.dtype == np.int64 and x.shape == (size,)


def test_sigma_zero_gives_zeros() -> None:
    x = discrete_gaussian(0.0, 50)
    assert x.dtype == np.int64 and x.shape == (50,) and not x.any()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 2 * noise.MAX_SIGMA])
def test_invalid_sigma_is_named(bad: float) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        discrete_gaussian(bad, 10)


def test_negative_size_raises() -> None:
    with pytest.raises(ValueError, match="-3"):
        discrete_gaussian(1.0, -3)


def test_os_entropy_differs_between_calls() -> None:
    np.random.seed(0)  # the legacy global generator must play no part
    a = discrete_gaussian(1e6, 64)
    np.random.seed(0)
    b = discrete_gaussian(1e6, 64)
    assert not np.array_equal(a, b)


def test_all_randomness_comes_from_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    # Replace the CSPRNG by a replayable byte stream: equal streams give equal samples, so no
    # other source of randomness is mixed in.
    def replay() -> None:
        gen = np.random.default_rng(7)
        monkeypatch.setattr(noise.secrets, "token_bytes", lambda n: gen.bytes(n))

    replay()
    a = discrete_gaussian(5.0, 1000)
    replay()
    b = discrete_gaussian(5.0, 1000)
    assert np.array_equal(a, b)


def test_test_rng_is_reproducible() -> None:
    a = discrete_gaussian(4.0, 100, rng=np.random.default_rng(8))
    b = discrete_gaussian(4.0, 100, rng=np.random.default_rng(8))
    assert np.array_equal(a, b)


def test_share_sigma() -> None:
    assert share_sigma(30.0, 10) == pytest.approx(30 / math.sqrt(10))
    assert share_sigma(2.0, 1) == 2.0
    for bad in (0, -1):
        with pytest.raises(ValueError, match=str(bad)):
            share_sigma(1.0, bad)
    with pytest.raises(ValueError, match="nan"):
        share_sigma(float("nan"), 3)


def test_ten_shares_sum_to_the_target_variance() -> None:
    total, clients, n = 30.0, 10, 100_000
    per = share_sigma(total, clients)
    s = discrete_gaussian(per, clients * n, rng=np.random.default_rng(9)).reshape(clients, n).sum(0)
    var = total**2
    assert abs(s.mean()) < 5 * math.sqrt(var / n)
    assert abs(np.mean(s.astype(np.float64) ** 2) - var) < 5 * var * math.sqrt(2 / n)


@pytest.mark.skipif(stats is None, reason="scipy not installed")
def test_fallback_bound_matches_scipy() -> None:
    for df in (9, 40, 200):
        assert _chi2_bound(df) == pytest.approx(float(stats.chi2.isf(P_MIN, df)), rel=0.02)
