"""DP says what it costs before round 1 (docs/privacy.md, "What a run plans to spend"): the
planned ε at the run's δ and the noise in one line, ε in every progress line, and a plan past
dp-accept-epsilon without a target refused with its numbers and the ways out."""

from __future__ import annotations

import logging

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.privacy.accountant import planned_epsilon
from adaptfl.server_app.loop import run_federated
from tests.conftest import needs_fashion_mnist

# the run, shortened: 2 of 10 nodes a round at z = 1, 2 rounds: ε 12.7 (1 round: 8.7)
PLAN = dict(dp="central", weighting="uniform", fraction_train=0.2, num_server_rounds=2, local_steps=1,
            batch_size=8, model="mlp", run_name="t", accept_small_rounds=True)
EPSILON_2_ROUNDS = planned_epsilon(1.0, 2, 10, 2, 1e-5, "without-replacement")


class FlowerLikeGrid(InProcessGrid):
    static_nodes = False  # as under Flower: the nodes are known at round 1 only


@pytest.fixture
def adaptfl_log(caplog: pytest.LogCaptureFixture,
                monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """adaptfl's lines, each once, whether or not the ServerApp stopped their propagation."""
    logger = logging.getLogger("adaptfl")
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="adaptfl")
    yield caplog
    logger.removeHandler(caplog.handler)


def _run(tmp_path, tiny_data, calls: list[int] | None = None, **kw):  # noqa: ANN001, ANN202
    cfg = RunConfig.of(figures=False,
                       results_dir=str(tmp_path), data_dir=tiny_data["fashion-mnist"], **{**PLAN, **kw})

    def counted(msg, context):  # noqa: ANN001, ANN202
        if calls is not None:
            calls.append(context.node_id)
        return train_or_refuse(msg, context)

    return run_federated(FlowerLikeGrid(10, cfg.to_flower(), handler=counted), cfg)


@needs_fashion_mnist
def test_a_plan_past_the_bound_is_refused_before_any_client_trains(tmp_path, tiny_data) -> None:
    assert 10.0 < EPSILON_2_ROUNDS < 13.0
    calls: list[int] = []
    with pytest.raises(ValueError) as refused:
        _run(tmp_path, tiny_data, calls)
    why = str(refused.value)
    assert f"dp='central' plans ε={EPSILON_2_ROUNDS:.3g} at δ=1e-05 (2 rounds of 2 of 10 nodes" in why, why
    for way_out in ("more clients a round (fraction-train=0.2 samples 2)",
                    "more noise (dp-noise-multiplier > 1)", "num-server-rounds=1 or fewer",
                    "dp-target-epsilon", f"dp-accept-epsilon > {EPSILON_2_ROUNDS:.3g}"):
        assert way_out in why, (way_out, why)
    assert calls == []  # refused before round 1's instructions were sent


@needs_fashion_mnist
def test_the_plan_is_said_before_round_1_and_epsilon_on_every_round(tmp_path, tiny_data,
                                                                    adaptfl_log) -> None:
    _run(tmp_path, tiny_data, dp_accept_epsilon=20.0)  # the acknowledgement
    lines = [r.getMessage() for r in adaptfl_log.records]
    plan = [i for i, line in enumerate(lines) if "plan: ε=" in line]
    first_round = next(i for i, line in enumerate(lines) if line.startswith("[ROUND 1/2]"))
    assert len(plan) == 1 and plan[0] < first_round, lines
    assert lines[plan[0]].startswith(f"dp='central' plan: ε={EPSILON_2_ROUNDS:.3g} at δ=1e-05 after 2 "
                                     "rounds of 2 of 10 nodes, dp-noise-multiplier=1; noise std "), lines
    rounds = [line for line in lines if line.startswith(("[ROUND 1/2]", "[ROUND 2/2]"))]
    assert len(rounds) == 2 and all(", ε " in line for line in rounds), rounds
    assert rounds[-1].endswith(f", ε {EPSILON_2_ROUNDS:.3g}")  # all planned rounds spent: the plan


@needs_fashion_mnist
def test_a_target_replaces_the_bound(tmp_path, tiny_data) -> None:
    """With dp-target-epsilon the user has said what ε is acceptable: that check alone applies."""
    _run(tmp_path, tiny_data, num_server_rounds=1, dp_target_epsilon=12.0)


def test_with_dp_num_clients_the_plan_is_refused_with_the_config() -> None:
    """dp-num-clients declares N, so the refusal comes before Flower starts (check_overrides)."""
    with pytest.raises(ValueError, match=r"plans ε=12.7 .* above dp-accept-epsilon=10"):
        RunConfig.of(**{**PLAN, "dp_num_clients": 10})
    RunConfig.of(**{**PLAN, "dp_num_clients": 10, "num_server_rounds": 1})  # ε 8.7: fine


def test_a_dp_client_plan_says_the_replies_it_assumes_and_its_refusals_name_min_replies() -> None:
    """dp='client' books each round at min-replies of the n noise shares: the plan says so, and
    a refusal names min-replies=n as a way out, with the ε it gives."""
    from adaptfl.algorithms.privacy_checks import dp_plan, plan_line

    client = {**PLAN, "dp": "client", "dp_num_clients": 10}
    with pytest.raises(ValueError) as refused:
        RunConfig.of(**client)
    assert f"min-replies=2 (each round booked at all 2 noise shares, not 1: ε={EPSILON_2_ROUNDS:.3g})" \
        in str(refused.value), str(refused.value)
    with pytest.raises(ValueError, match=r"or min-replies=2 \(each round booked at all 2 noise shares\)"):
        RunConfig.of(**client, dp_target_epsilon=13.0)
    cfg = RunConfig.of(**{**client, "min_replies": 2, "num_server_rounds": 1})  # ε 8.7: within the bound
    line = plan_line(cfg.privacy, dp_plan(cfg.privacy, cfg.algorithm, cfg.federation, 10))
    assert line.endswith("each round booked as if only 2 of the 2 replies arrive (min-replies=2: "
                         "z·√(m/n) = 1)"), line
    one = RunConfig.of(**{**client, "num_server_rounds": 1, "dp_accept_epsilon": 1e3})
    assert "as if only 1 of the 2 replies arrive (min-replies=1: z·√(m/n) = 0.707)" in \
        plan_line(one.privacy, dp_plan(one.privacy, one.algorithm, one.federation, 10))
