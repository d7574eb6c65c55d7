"""The pieces that keep hostile but well-formed replies out of the server state, on hand-built
values: record domains, the weight cap, the invariant check, and the robust aggregators
(median, trimmed mean, Krum / multi-Krum, adaptive clipping) against hand-computed results."""

from __future__ import annotations

import math

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.core.domain import FINITE, MOMENT, NONNEG, PSD, SQUARABLE, SQUARE_BOUND
from adaptfl.server_rules.aggregate import cap_shares
from adaptfl.server_rules.aggregators import AggregationRefused, Combine
from adaptfl.server_rules.aggregators.clip import Clip
from adaptfl.server_rules.aggregators.krum import Krum
from adaptfl.server_rules.aggregators.mean import Mean
from adaptfl.server_rules.aggregators.median import Median, coordinate_median
from adaptfl.server_rules.aggregators.trimmed_mean import TrimmedMean
from adaptfl.strategies.invariants import InvariantViolated, check_state
from adaptfl.strategies.state import ServerState


def _items(*rows: list[float]) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor(r)} for r in rows]


def _combine(aggregator, items, weights=None, record="delta", domains=None, memory=None) -> tuple:
    ctx = Combine(aggregator, list(weights or [1.0] * len(items)), domains or {}, memory or {},
                  new_memory={k: dict(v) for k, v in (memory or {}).items()})
    return ctx(items, record), ctx


# --- domains ------------------------------------------------------------------------------------
def test_domains_refuse_what_the_math_cannot_use() -> None:
    assert FINITE.why_outside(torch.tensor([3.4e38])) is None  # finite: the mean's problem
    assert "squared" in SQUARABLE.why_outside(torch.tensor([1e30]))
    assert SQUARABLE.why_outside(torch.tensor([SQUARE_BOUND * 0.99])) is None
    assert "negative" in NONNEG.why_outside(torch.tensor([1.0, -1e-3]))
    assert NONNEG.why_outside(torch.tensor([1e30])) is None  # Sophia's h, a server rule's v
    assert "squared" in MOMENT.why_outside(torch.tensor([1e30]))  # FedACT's v is also squarable
    assert "negative" in MOMENT.why_outside(torch.tensor([-1.0]))
    assert "non-finite" in NONNEG.why_outside(torch.tensor([float("nan")]))
    assert NONNEG.why_outside(torch.tensor([3], dtype=torch.int64) * -1) is None  # ints: exact


def test_psd_accepts_float32_outer_product_sums_and_refuses_the_rest() -> None:
    g = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    honest = 0.95 * (g[:32].T @ g[:32]) + 0.05 * (g[32:].T @ g[32:])  # rank 16, float32 rounding
    low_rank = g[:3].T @ g[:3]  # PSD with 13 zero eigenvalues
    assert PSD.why_outside(honest) is None and PSD.why_outside(low_rank) is None
    assert PSD.why_outside(torch.zeros(4, 4)) is None
    flipped = honest.clone()
    flipped -= 2.0 * float(torch.linalg.eigvalsh(honest.double())[-1]) * torch.outer(
        torch.linalg.eigh(honest.double())[1][:, -1], torch.linalg.eigh(honest.double())[1][:, -1]).float()
    assert "positive semi-definite" in PSD.why_outside(flipped)
    skew = honest.clone()
    skew[0, 1] += 1.0
    assert "not symmetric" in PSD.why_outside(skew)
    assert "square" in PSD.why_outside(torch.ones(2, 3))


def test_psd_projection_is_the_nearest_psd_matrix() -> None:
    a = torch.tensor([[2.0, 0.0], [0.0, -1.0]])
    assert torch.allclose(PSD.project(a), torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    assert PSD.why_outside(PSD.project(torch.tensor([[0.0, 3.0], [3.0, 0.0]]))) is None


# --- the weight cap -----------------------------------------------------------------------------
def test_weight_cap_water_fills_and_leaves_honest_weights_bit_identical() -> None:
    honest = [100.0, 120.0, 90.0]
    assert cap_shares(honest, 0.5) is not honest and cap_shares(honest, 0.5) == honest
    liar = [100.0, 100.0, 100.0, float(2**62)]
    shares = cap_shares(liar, 0.4)
    assert shares[3] == pytest.approx(0.4) and sum(shares) == pytest.approx(1.0)
    assert shares[0] == shares[1] == shares[2] == pytest.approx(0.2)
    # two over the cap: both at the cap, the rest keep their 1:3 proportion of what is left
    shares = cap_shares([1.0, 3.0, 1e9, 1e9], 0.3)
    assert shares == pytest.approx([0.1, 0.3, 0.3, 0.3])
    assert cap_shares([5.0, 1e9], 0.3) == [1.0, 1.0]  # 2 x 0.3 < 1: equal shares are closest


# --- aggregators --------------------------------------------------------------------------------
def test_median_is_coordinate_wise_and_unweighted() -> None:
    items = _items([1.0, 10.0], [2.0, -5.0], [100.0, 0.0])
    out, _ = _combine(Median(), items, weights=[1.0, 1.0, 1e12])  # a liar's weight buys nothing
    assert out["w"].tolist() == [2.0, 0.0]
    out, _ = _combine(Median(), _items([1.0], [2.0], [4.0], [1e30]))
    assert out["w"].tolist() == [3.0]  # even n: mean of the two middle values


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.bfloat16])
def test_coordinate_median_selects_the_values_a_sort_would(dtype: torch.dtype) -> None:
    """The selected middle values (numpy's partition) are the sorted ones, with NaN after every
    number as torch sorts it, ±inf and zeros; bf16 (no numpy twin) takes the sort itself."""
    generator = torch.Generator().manual_seed(0)
    for n in range(1, 12):
        for shape in ((n,), (n, 7), (n, 3, 5)):
            values = torch.randn(shape, generator=generator).to(dtype)
            flat = values.view(-1)
            flat[::5] = 0.0
            if n > 2:
                flat[1::7], flat[2::11], flat[3::13] = math.nan, math.inf, -math.inf
            ordered = values.sort(dim=0).values
            expected = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
            kept = values.clone()
            for got in (coordinate_median(values), coordinate_median(values.clone(), reorder=True)):
                assert got.shape == expected.shape and got.dtype == dtype, (shape, got.shape)
                assert torch.equal(got.isnan(), expected.isnan()), (n, shape)
                assert torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0)), (n, shape)
            assert torch.equal(values.nan_to_num(7.0), kept.nan_to_num(7.0))  # left as it was


def test_trimmed_mean_cuts_beta_n_at_each_end() -> None:
    items = _items([1.0], [2.0], [3.0], [4.0], [1e30])
    out, ctx = _combine(TrimmedMean(trim_fraction=0.2), items)  # cut 1 per end
    assert out["w"].tolist() == [3.0] and ctx.stats["trimmed-per-end"] == 1.0
    out, _ = _combine(TrimmedMean(trim_fraction=0.2), items[:4])  # ⌊0.8⌋ = 0: plain mean
    assert out["w"].tolist() == [2.5]


def test_krum_picks_the_reply_closest_to_its_neighbours() -> None:
    items = _items([0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [50.0, 50.0])
    # f=1, n=5: each score sums the 2 nearest squared distances; the four honest points all score
    # 2, the outlier far more; ties go to the earliest reply
    out, ctx = _combine(Krum(krum_byzantine=1, krum_select=1), items)
    assert out["w"].tolist() == [0.0, 0.0] and ctx.stats["krum-selected"] == 1.0
    out, _ = _combine(Krum(krum_byzantine=1, krum_select=0), items, weights=[1, 1, 1, 3, 1])
    assert out["w"].tolist() == pytest.approx([4 / 6, 4 / 6])  # n - f = 4 kept, weighted 1:1:1:3
    with pytest.raises(AggregationRefused, match="needs 5 replies"):
        _combine(Krum(krum_byzantine=1), items[:4])
    with pytest.raises(ValueError, match="needs at least 5 replies per round"):
        Krum().check_federation(3)
    Krum().check_federation(5)


def test_clip_follows_the_adaptive_rule_per_record() -> None:
    items = _items([3.0, 4.0], [0.0, 1.0], [0.0, 2.0], [300.0, 400.0])  # norms 5, 1, 2, 500
    out, ctx = _combine(Clip(clip_norm=2.0, clip_quantile=0.5, clip_lr=0.2), items)
    # C = 2: the first and last are scaled to norm 2; 2 of 4 within C, so b = γ and C stays
    clipped = [[1.2, 1.6], [0.0, 1.0], [0.0, 2.0], [1.2, 1.6]]
    assert out["w"].tolist() == pytest.approx([sum(c[i] for c in clipped) / 4 for i in range(2)])
    assert ctx.stats["clip-norm"] == 2.0 and ctx.stats["clipped-share"] == 0.5
    assert float(ctx.new_memory["clip-norm"]["delta"]) == pytest.approx(2.0)
    # all within C: b = 1 > γ, so C shrinks by exp(-0.2·0.5); all clipped: C grows by exp(0.1).
    # (Flower 1.42's server-side wrapper feeds the CLIPPED share into the same formula, which
    # shrinks C here too: updates above C would drive C towards 0.)
    _, ctx = _combine(Clip(clip_norm=10.0), _items([1.0], [2.0]))
    assert float(ctx.new_memory["clip-norm"]["delta"]) == pytest.approx(10.0 * math.exp(-0.1))
    _, ctx = _combine(Clip(clip_norm=0.1), _items([1.0], [2.0]))
    assert float(ctx.new_memory["clip-norm"]["delta"]) == pytest.approx(0.1 * math.exp(0.1))
    # other records start at the median of their first norms, and keep their own C after that
    _, ctx = _combine(Clip(clip_norm=0.1), _items([1.0], [3.0], [100.0]), record="v")
    assert float(ctx.new_memory["clip-norm"]["v"]) == pytest.approx(3.0 * math.exp(-0.2 * (2 / 3 - 0.5)))
    out, ctx = _combine(Clip(), _items([1.0], [3.0], [100.0]), record="v",
                        memory={"clip-norm": {"v": torch.tensor([2.0], dtype=torch.float64)}})
    assert out["w"].tolist() == pytest.approx([(1.0 + 2.0 + 2.0) / 3])


def test_coordinate_wise_rules_keep_psd_statistics_psd() -> None:
    # three PSD matrices whose coordinate-wise median, [[1, 2], [2, 1]], has eigenvalue -1
    items = [{"gg0": torch.tensor([[4.0, 2.0], [2.0, 1.0]])}, {"gg0": torch.tensor([[1.0, 2.0], [2.0, 4.0]])},
             {"gg0": torch.zeros(2, 2)}]
    assert all(PSD.why_outside(item["gg0"]) is None for item in items)
    assert PSD.why_outside(torch.tensor([[1.0, 2.0], [2.0, 1.0]])) is not None
    for rule in (Median(), TrimmedMean(trim_fraction=0.34)):  # trimmed: the median of 3
        out, _ = _combine(rule, items, record="theta", domains={"theta": {"gg0": PSD}})
        assert PSD.why_outside(out["gg0"]) is None, rule.name
    out, _ = _combine(Mean(), items, record="theta", domains={"theta": {"gg0": PSD}})
    assert PSD.why_outside(out["gg0"]) is None  # convex combinations need no projection


# --- the invariant check ------------------------------------------------------------------------
def _state(**extras) -> ServerState:
    return ServerState(1, {"w": torch.ones(2), "count": torch.tensor(3)}, extras=dict(extras))


@pytest.mark.parametrize("algorithm,record,bad,good,why", [
    ("fedact", wire.V_BAR, [1.0, -1.0], [1.0, 0.0], "negative"),
    ("fedact", wire.DELTA_G, [float("inf"), 0.0], [-1.0, 0.0], "non-finite"),
    ("fedadam", "server-opt/v", [-1.0, 0.0], [1.0, 0.0], "negative"),
    ("fedadam", "server-opt/m", [float("nan"), 0.0], [-1.0, 0.0], "non-finite"),
    ("fedavg", "aggregator/clip-norm", [0.0], [0.5], "> 0"),
    ("feddyn", "feddyn-h", [float("inf"), 0.0], [-3.0, 0.0], "non-finite"),
])
def test_invariants_name_the_entry_outside_its_domain(algorithm, record, bad, good, why) -> None:
    cfg = RunConfig.of(algorithm=algorithm)
    contract = cfg.algorithm.contract(ModelSpec({"w": ((2,), torch.float32)}, ("w",)))
    with pytest.raises(InvariantViolated, match=why) as err:
        check_state(_state(**{record: {"w": torch.tensor(bad)}}), contract, cfg.algorithm)
    assert record in str(err.value)
    check_state(_state(**{record: {"w": torch.tensor(good)}}), contract, cfg.algorithm)
    with pytest.raises(InvariantViolated, match=r"model\[w\]"):
        check_state(ServerState(1, {"w": torch.tensor([1.0, float("inf")])}), contract, cfg.algorithm)
