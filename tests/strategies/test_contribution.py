"""The contribution bound (strategies/contribution.py) against hand-computed tensors: the center
is the coordinate-wise median, a reply's weighted deviation from it is clipped to ratio × the
round's median one, weights count, nothing moves when nothing is above the bound."""

from __future__ import annotations

import math

import pytest
import torch

from adaptfl.core import wire
from adaptfl.strategies import contribution
from adaptfl.strategies.contribution import (
    SMALL_ROUND_RATIO,
    center,
    clip_contributions,
    clip_to_history,
    small_round_note,
    tolerance_note,
)
from adaptfl.strategies.screen import CLAIMS
from adaptfl.strategies.validation import DecodedReply


def _replies(*deltas: list[float]) -> list[DecodedReply]:
    return [DecodedReply({wire.DELTA: {"w": torch.tensor(d), "steps": torch.tensor(3)}}, {}, 0)
            for d in deltas]


def test_the_center_is_the_coordinate_wise_median_and_its_slices_do_not_change_it(monkeypatch) -> None:
    arrays = [torch.tensor([1.0, 9.0, -2.0]), torch.tensor([5.0, 0.0, 4.0]), torch.tensor([3.0, 7.0, 8.0])]
    assert torch.equal(center(arrays), torch.tensor([3.0, 7.0, 4.0]))
    assert torch.equal(center(arrays[:2]), torch.tensor([3.0, 4.5, 1.0]))  # even: the middle two's mean
    big = [torch.randn(7, 11, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    whole = center(big)
    monkeypatch.setattr(contribution, "SLICE", 20)  # 4 coordinates of the 5 arrays a slice: 20 slices
    assert torch.equal(center(big), whole) and whole.shape == (7, 11)


def test_a_reply_far_from_the_median_is_pulled_back_to_ratio_times_the_median_deviation() -> None:
    # center (0, 0); deviations 1, 1, 1, 2, 20 -> median 1, bound 3: the last scaled to 3, same direction
    replies = _replies([1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -2.0], [12.0, 16.0])
    clipped = clip_contributions(replies, [1.0] * 5, 3.0, wire.DELTA)
    assert clipped == {4}
    assert torch.allclose(replies[4].arrays[wire.DELTA]["w"], torch.tensor([1.8, 2.4]))
    assert torch.equal(replies[3].arrays[wire.DELTA]["w"], torch.tensor([0.0, -2.0]))  # 2 < 3: kept
    assert torch.equal(replies[4].arrays[wire.DELTA]["steps"], torch.tensor(3))  # integers untouched


def test_the_deviation_is_measured_from_the_median_not_from_zero() -> None:
    """Around zero a flipped reply of the honest norm passes every bound; around the median it
    is as far as twice the honest step and is pulled back towards the others."""
    replies = _replies([10.0, 0.0], [10.0, 1.0], [10.0, -1.0], [10.5, 0.0], [-10.0, 0.0])
    assert clip_contributions(replies, [1.0] * 5, 3.0, wire.DELTA) == {4}
    # center (10, 0); deviations 0, 1, 1, 0.5, 20 -> median 1: the flip ends at distance 3 from it
    assert torch.allclose(replies[4].arrays[wire.DELTA]["w"], torch.tensor([7.0, 0.0]))


def test_a_weight_counts_in_the_deviation() -> None:
    """The same deviation of 2 passes at the median weight and is clipped at 10× it (20 > 3)."""
    same = ([0.0, 1.0], [1.0, 0.0], [0.0, -1.0], [-1.0, 0.0], [0.0, 2.0])
    light, heavy = _replies(*same), _replies(*same)
    assert clip_contributions(light, [1.0] * 5, 3.0, wire.DELTA) == set()
    assert clip_contributions(heavy, [1.0, 1.0, 1.0, 1.0, 10.0], 3.0, wire.DELTA) == {4}
    assert torch.allclose(heavy[4].arrays[wire.DELTA]["w"], torch.tensor([0.0, 0.3]))  # 10 · 0.3 = 3


@pytest.mark.parametrize("ratio,count", [(0.0, 5), (3.0, 2)])
def test_off_at_ratio_0_and_below_three_replies(ratio: float, count: int) -> None:
    replies = _replies(*([0.0, 0.0],) * (count - 1), [100.0, 0.0])
    before = [r.arrays[wire.DELTA]["w"] for r in replies]
    assert clip_contributions(replies, [1.0] * count, ratio, wire.DELTA) == set()
    assert all(r.arrays[wire.DELTA]["w"] is b for r, b in zip(replies, before, strict=True))


def test_a_round_with_nothing_above_the_bound_keeps_the_same_tensors() -> None:
    replies = _replies([1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -2.5])
    before = [r.arrays[wire.DELTA]["w"] for r in replies]
    assert clip_contributions(replies, [1.0] * 4, 3.0, wire.DELTA) == set()
    assert all(r.arrays[wire.DELTA]["w"] is b for r, b in zip(replies, before, strict=True))


def test_the_clipped_mean_moves_at_most_ratio_times_a_median_replys_term() -> None:
    """The per-round bound docs/robustness.md states: with equal weights, one reply of n moves
    the mean, from the mean of the others drawn to the center, by at most ratio × the median
    deviation / n."""
    gen = torch.Generator().manual_seed(0)
    honest = [torch.randn(50, generator=gen) + 3.0 for _ in range(4)]
    for attack in (-9.0 * honest[0], 1e6 * torch.ones(50), honest[0] * 0):
        replies = _replies(*(h.tolist() for h in honest), attack.tolist())
        middle = center([r.arrays[wire.DELTA]["w"] for r in replies])
        deviations = sorted(float((r.arrays[wire.DELTA]["w"] - middle).norm()) for r in replies)
        clip_contributions(replies, [1.0] * 5, 3.0, wire.DELTA)
        term = (replies[4].arrays[wire.DELTA]["w"] - middle).norm() / 5
        assert float(term) <= 3.0 * deviations[2] / 5 * (1 + 1e-6)
        assert math.isfinite(float(term))


def test_a_ratio_below_1_is_refused_in_one_line_and_0_turns_it_off() -> None:
    from adaptfl.algorithms.config import RunConfig

    with pytest.raises(ValueError, match="max-contribution-ratio=0.5: below 1 it clips the round's median"):
        RunConfig.of(max_contribution_ratio=0.5)
    assert RunConfig.of(max_contribution_ratio=0).federation.max_contribution_ratio == 0.0
    assert RunConfig.of().federation.max_contribution_ratio == 2.0  # the default robustness.md measures


def test_a_small_round_is_bounded_by_the_history_median_of_sizes_and_claims() -> None:
    # history: sizes 1, 2, 3 (median 2), claims 10, 10, 40 (median 10); ratio 1 (SMALL_ROUND_RATIO)
    history = {wire.DELTA: [1.0, 2.0, 3.0], CLAIMS: [10.0, 10.0, 40.0]}
    replies = _replies([3.0, 4.0], [0.0, 1.0])  # sizes 5 and 1
    assert clip_to_history(replies, [10.0, 90.0], SMALL_ROUND_RATIO, wire.DELTA, history) == {0, 1}
    # reply 0: weight 1× the median claim, size 5 > 2: scaled to 2; reply 1: 9× the median claim
    # times size 1 is 9 > 2: scaled to 2 / 9, so its term in the mean is a median reply's
    assert torch.allclose(replies[0].arrays[wire.DELTA]["w"], torch.tensor([1.2, 1.6]))
    assert torch.allclose(replies[1].arrays[wire.DELTA]["w"], torch.tensor([0.0, 2.0 / 9.0]))
    assert torch.equal(replies[1].arrays[wire.DELTA]["steps"], torch.tensor(3))
    lone = _replies([0.6, 0.8])  # size 1 at the median claim: under the bound, the same tensor
    before = lone[0].arrays[wire.DELTA]["w"]
    assert clip_to_history(lone, [10.0], SMALL_ROUND_RATIO, wire.DELTA, history) == set()
    assert lone[0].arrays[wire.DELTA]["w"] is before


def test_a_young_history_or_the_bound_off_bounds_no_small_round() -> None:
    young = {wire.DELTA: [1.0, 2.0], CLAIMS: [10.0, 10.0]}  # one liar of two could be its median
    assert clip_to_history(_replies([30.0, 40.0]), [10.0], 1.0, wire.DELTA, young) == set()
    grown = {wire.DELTA: [1.0, 2.0, 3.0], CLAIMS: [10.0, 10.0, 10.0]}
    assert clip_to_history(_replies([30.0, 40.0]), [10.0], 0.0, wire.DELTA, grown) == set()
    assert clip_to_history(_replies([30.0, 40.0]), [10.0], 1.0, wire.DELTA, grown) == {0}


def test_the_small_round_note_says_what_bounds_a_reply_before_round_1() -> None:
    from adaptfl.algorithms.config import RunConfig

    assert small_round_note(RunConfig.of(algorithm="fedavg"), 3, 5) is None
    line = small_round_note(RunConfig.of(algorithm="fedavg", fraction_train=0.4), 2, 5)
    assert line is not None and line.startswith("fraction-train=0.4 samples 2 of 5 nodes a round: "
                                                 "no round median")
    assert line.endswith("a hostile client cancels every round it is sampled in (measured, one a round: "
                         "up to -0.5 of accuracy); fraction-train=0.6 (3 of 5 a round) bounds each "
                         "reply by its round's median (docs/robustness.md, 'Rounds of one and two "
                         "replies')"), line
    lone = small_round_note(RunConfig.of(algorithm="fedavg", fraction_train=0.1), 1, 7)
    assert lone is not None and "a hostile client reverses every round" in lone
    assert "fraction-train=0.43 (3 of 7 a round)" in lone  # round(0.43 × 7) = 3
    two = small_round_note(RunConfig.of(algorithm="fedavg", fraction_train=0.5), 1, 2)
    assert two is not None and "; 3 or more nodes a round bounds each reply" in two
    off = small_round_note(RunConfig.of(algorithm="fedavg", fraction_train=0.2, screen_ratio=0.0,
                                        max_contribution_ratio=0.0), 1, 5)
    assert off is not None and off.endswith("no reply bound is on: one hostile reply can set a "
                                            "round's whole update")


def test_the_tolerance_note_says_what_the_aggregator_holds_and_what_holds_more() -> None:
    from adaptfl.algorithms.config import RunConfig

    line = tolerance_note(RunConfig.of(algorithm="fedact"), 7, 7)
    assert line == ("aggregator='mean' bounds one hostile reply a round, not several colluding ones; "
                    "aggregator='trimmed-mean' hostile-fraction=0.3 min-replies=3 tolerates 3 of the 7 a "
                    "round would sample (docs/robustness.md, 'Colluders at the bound')")
    assert tolerance_note(RunConfig.of(algorithm="fedact"), 2, 2).endswith(
        "no aggregator holds colluders among 2 nodes (3 or more are needed)")
    sized = RunConfig.of(algorithm="fedact", aggregator="trimmed-mean", hostile_fraction=0.2)
    assert tolerance_note(sized, 7, 7) == ("aggregator='trimmed-mean' hostile-fraction=0.2 tolerates 2 "
                                        "hostile replies of the 7 a round samples")
