"""Strategies fed hand-built replies, checked against hand-computed results."""

from __future__ import annotations

import pytest
import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import FedACTStrategy, FedAvgStrategy, ModelSpec
from adaptfl.strategies.state import ServerState
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

F32 = torch.float32
SPEC = ModelSpec({"w": ((2,), F32), "b": ((1,), F32)}, ("w", "b"))


def _cfg(**kw) -> RunConfig:
    base = dict(algorithm="fedact", local_steps=2, lr=0.5, lr_schedule="constant",
                num_server_rounds=3)
    return RunConfig(**{**base, **kw})


def _state() -> ServerState:
    return ServerState(0, {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}, run_key="t")


def _instruction(node: int) -> Message:
    InProcessGrid(1, {})  # sets Flower's task identity so messages can be created here
    return Message(content=RecordDict({}), dst_node_id=node, message_type=MessageType.TRAIN)


def _reply(node: int, delta: dict, v: dict | None, num_examples: int, pid: int,
           extra_metrics: dict | None = None) -> Message:
    content = RecordDict({
        wire.DELTA: ArrayRecord({k: torch.tensor(x) for k, x in delta.items()}),
        wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: num_examples, wire.PARTITION_ID: pid,
                                    wire.TRAIN_LOSS: 1.0, **(extra_metrics or {})}),
    })
    if v is not None:
        content[wire.V_LOCAL] = ArrayRecord({k: torch.tensor(x) for k, x in v.items()})
    return Message(content=content, reply_to=_instruction(node))


GOOD_A = dict(delta={"w": [1.0, 0.0], "b": [2.0]}, v={"w": [1.0, 1.0], "b": [1.0]},
              num_examples=1, pid=0)
GOOD_B = dict(delta={"w": [-1.0, 4.0], "b": [0.0]}, v={"w": [3.0, 5.0], "b": [9.0]},
              num_examples=3, pid=1)


def _tensors(d: dict) -> dict:
    return {k: v.tolist() for k, v in d.items()}


def test_fedact_server_aggregates_to_hand_computed_values() -> None:
    strategy = FedACTStrategy(_cfg(), SPEC, _state())
    # B arrives first: the result must not depend on arrival order.
    strategy.aggregate_train(1, [_reply(2, **GOOD_B), _reply(1, **GOOD_A)])
    state = strategy.state
    # mean Δ (weights 1:3): w = [(1-3)/4, 12/4] = [-0.5, 3], b = 2/4 = 0.5
    assert _tensors(state.model) == {"w": [0.5, 5.0], "b": [3.5]}
    # Δ_G = -mean Δ / (K·lr) = -mean Δ / 1
    assert _tensors(state.extras[wire.DELTA_G]) == {"w": [0.5, -3.0], "b": [-0.5]}
    # v̄ = (1·v_A + 3·v_B) / 4
    assert _tensors(state.extras[wire.V_BAR]) == {"w": [2.5, 4.0], "b": [7.0]}
    assert state.server_round == 1
    assert strategy.report.accepted == 2 and not strategy.report.rejected


def test_uniform_weighting_and_fedavg_keeps_no_extras() -> None:
    strategy = FedAvgStrategy(_cfg(algorithm="fedavg", weighting="uniform"), SPEC, _state())
    a = {**GOOD_A, "v": None}
    b = {**GOOD_B, "v": None}
    strategy.aggregate_train(1, [_reply(1, **a), _reply(2, **b)])
    assert _tensors(strategy.state.model) == {"w": [1.0, 4.0], "b": [4.0]}
    assert strategy.state.extras == {}


def test_configure_train_ships_delta_g_and_v_bar_once_they_exist() -> None:
    grid = InProcessGrid(2, {})
    strategy = FedACTStrategy(_cfg(), SPEC, _state())
    first = list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(),
                                          grid))
    assert len(first) == 2
    assert set(first[0].content.array_records) == {wire.MODEL}
    strategy.aggregate_train(1, [_reply(1, **GOOD_A), _reply(2, **GOOD_B)])
    second = list(strategy.configure_train(2, ArrayRecord(strategy.state.model), ConfigRecord(),
                                           grid))
    content = second[0].content
    assert set(content.array_records) == {wire.MODEL, wire.DELTA_G, wire.V_BAR}
    assert content.config_records[wire.RECIPE]["rho"] == 0.5
    assert content.config_records[wire.RECIPE]["step-offset"] == 2  # (r-1)·K
    # 3 tensors of 3 floats each, to 2 clients
    assert strategy.report.bytes_down == 2 * 3 * 3 * 4


def _malformed() -> dict[str, Message]:
    nan = {**GOOD_B, "delta": {"w": [float("nan"), 1.0], "b": [0.0]}}
    inf = {**GOOD_B, "v": {"w": [1.0, float("inf")], "b": [0.0]}}
    shape = {**GOOD_B, "delta": {"w": [1.0, 1.0, 1.0], "b": [0.0]}}
    missing = {**GOOD_B, "delta": {"w": [1.0, 1.0]}}
    unknown = {**GOOD_B, "delta": {"w": [1.0, 1.0], "b": [0.0], "extra": [1.0]}}
    no_v = {**GOOD_B, "v": None}
    wrong_dtype = _reply(2, **GOOD_B)
    wrong_dtype.content[wire.DELTA] = ArrayRecord({"w": torch.tensor([1.0, 1.0], dtype=torch.float64),
                                                   "b": torch.tensor([0.0])})
    bad_metric = _reply(2, **GOOD_B, extra_metrics={"surprise": 1.0})
    zero_examples = _reply(2, **{**GOOD_B, "num_examples": 0})
    return {
        "non-finite": _reply(2, **nan), "inf": _reply(2, **inf), "shape": _reply(2, **shape),
        "missing arrays": _reply(2, **missing), "unknown arrays": _reply(2, **unknown),
        "array records": _reply(2, **no_v), "dtype": wrong_dtype, "unknown keys": bad_metric,
        "positive int": zero_examples,
    }


@pytest.mark.parametrize("kind", sorted(_malformed()))
def test_malformed_reply_is_dropped_and_state_is_untouched(kind: str) -> None:
    bad = _malformed()[kind]
    strategy = FedACTStrategy(_cfg(), SPEC, _state())
    strategy.aggregate_train(1, [_reply(1, **GOOD_A)])
    before = strategy.state.to_bytes()
    arrays, _ = strategy.aggregate_train(2, [bad])
    assert arrays is None and strategy.report.skipped
    assert strategy.state.to_bytes() == before
    reason = strategy.report.rejected[2]
    if kind != "inf":
        assert kind in reason.replace("non-finite values", "non-finite"), reason
    assert strategy.report.metrics["replies-rejected"] == 1

    # Next to a good reply, the bad one contributes nothing.
    with_bad = FedACTStrategy(_cfg(), SPEC, _state())
    with_bad.aggregate_train(1, [_reply(1, **GOOD_A), bad])
    alone = FedACTStrategy(_cfg(), SPEC, _state())
    alone.aggregate_train(1, [_reply(1, **GOOD_A)])
    assert with_bad.state.to_bytes() == alone.state.to_bytes()


def test_error_reply_and_oversized_reply_are_dropped() -> None:
    from flwr.app import Error

    err = Message(Error(code=2, reason="boom"), reply_to=_instruction(3))
    strategy = FedACTStrategy(_cfg(max_reply_mb=1e-6), SPEC, _state())
    strategy.aggregate_train(1, [err, _reply(1, **GOOD_A)])
    assert "boom" in strategy.report.rejected[3]
    assert "exceeds the bound" in strategy.report.rejected[1]
    assert strategy.report.skipped and strategy.state.server_round == 0


def test_min_replies_skips_the_round() -> None:
    strategy = FedACTStrategy(_cfg(min_replies=2), SPEC, _state())
    before = strategy.state.to_bytes()
    strategy.aggregate_train(1, [_reply(1, **GOOD_A)])
    assert strategy.report.skipped and strategy.state.to_bytes() == before


def test_block_v_sync_expects_one_value_per_tensor() -> None:
    strategy = FedACTStrategy(_cfg(v_sync="block"), SPEC, _state())
    full = _reply(1, **GOOD_A)
    strategy.aggregate_train(1, [full])
    assert "shape" in strategy.report.rejected[1]
    block = _reply(1, **{**GOOD_A, "v": {"w": [2.0], "b": [1.0]}})
    strategy.aggregate_train(1, [block])
    assert _tensors(strategy.state.extras[wire.V_BAR]) == {"w": [2.0], "b": [1.0]}


def test_state_round_trips_through_bytes() -> None:
    strategy = FedACTStrategy(_cfg(), SPEC, _state())
    strategy.aggregate_train(1, [_reply(1, **GOOD_A)])
    again = ServerState.from_bytes(strategy.state.to_bytes())
    assert again.to_bytes() == strategy.state.to_bytes()
    assert _tensors(again.extras[wire.V_BAR]) == _tensors(strategy.state.extras[wire.V_BAR])
