"""The contribution bound end to end (issue 32 §1; docs/robustness.md "Contribution bound"): one
client of five claims 9× the median's examples and sends Δ × −9, both inside the per-part screens
(max-weight-ratio, screen-ratio: 81× a median client). `max-contribution-ratio=2` keeps every
algorithm family within MARGIN of its clean run and costs an honest Dirichlet run at most
HONEST_MARGIN; the default (0, off: benchmarks/contribution_bound.py measured why) lets the
attack through. tests/e2e/test_hostile_e2e.py's setup, one torch thread."""

from __future__ import annotations

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.settings import Federation
from adaptfl.client_app.app import train_or_refuse
from adaptfl.core import wire
from tests.e2e.test_hostile_e2e import Rewrite, _accuracy, hostile
from tests.e2e.test_hostile_e2e import _config as _hostile_config

MARGIN = 0.05  # of 200 test images; clean runs reach ~0.78-0.80 here
HONEST_MARGIN = 0.02
BOUND = 2.0  # the measured candidate (the table in docs/robustness.md)
ALGORITHMS = ["fedavg", "fedact", "scaffold", "fedpac-sophia", "hafedho"]
pytestmark = pytest.mark.slow  # seven 8-round runs: ~50 s, out of the fast subset


def scaled(delta_factor: float, examples: int) -> Rewrite:
    """Δ (and SCAFFOLD's Δc) × `delta_factor`; num-examples × `examples` (iid: every honest claim
    is the same, so × 9 is 9× the round's median), or = `examples` if above 1e6."""
    def rewrite(arrays: dict, metrics: dict) -> None:
        for record in (wire.DELTA, wire.DELTA_C):
            if record in arrays:
                arrays[record] = {n: delta_factor * t if t.is_floating_point() else t
                                  for n, t in arrays[record].items()}
        claim = int(metrics[wire.NUM_EXAMPLES])
        metrics[wire.NUM_EXAMPLES] = int(examples if examples > 1e6 else claim * examples)
    return rewrite


NINE_BY_MINUS_NINE = scaled(-9.0, 9)  # 81× a median client, inside both per-part screens
CAPPED_FLIP = scaled(-0.9, 2**62)  # the weight at its cap, Δ flipped under the screen


def _config(tiny_data, tmp_path, algorithm: str, **kw) -> RunConfig:  # noqa: ANN001
    return _hostile_config(tiny_data, tmp_path, algorithm, rounds=8, num_threads=1, **kw)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_bound_keeps_one_81x_client_of_five_within_the_margin(algorithm, tiny_data,
                                                                 tmp_path) -> None:
    clean = _accuracy(_config(tiny_data, tmp_path, algorithm), train_or_refuse)
    attacked = _accuracy(_config(tiny_data, tmp_path, algorithm, max_contribution_ratio=BOUND),
                         hostile(NINE_BY_MINUS_NINE))
    assert attacked >= clean - MARGIN, (attacked, clean)


def test_the_default_is_off_and_lets_the_81x_client_through(tiny_data, tmp_path) -> None:
    """What the bound is for; the default stays 0 because no ratio kept the capped flip within
    MARGIN (docs/robustness.md). If this fails the default changed: update the docs' section."""
    assert Federation().max_contribution_ratio == 0.0
    clean = _accuracy(_config(tiny_data, tmp_path, "fedact"), train_or_refuse)
    attacked = _accuracy(_config(tiny_data, tmp_path, "fedact"), hostile(NINE_BY_MINUS_NINE))
    assert attacked < clean - 2 * MARGIN, (attacked, clean)  # measured: 0.030 vs 0.790


def test_an_honest_dirichlet_run_under_the_bound_stays_within_the_honest_margin(tiny_data,
                                                                             tmp_path) -> None:
    """α = 0.3: the two largest clients' weights are capped at 2× the median's every round and
    about one reply in five clipped (benchmarks/contribution_bound.py)."""
    off = _accuracy(_config(tiny_data, tmp_path, "fedavg", partitioning="dirichlet",
                            max_contribution_ratio=0.0), train_or_refuse)
    on = _accuracy(_config(tiny_data, tmp_path, "fedavg", partitioning="dirichlet",
                           max_contribution_ratio=BOUND), train_or_refuse)
    assert abs(on - off) <= HONEST_MARGIN, (on, off)
