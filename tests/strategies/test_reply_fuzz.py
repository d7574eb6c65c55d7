"""Property-based fuzzing of the replies (issue 21 §1): whatever one reply contains (records,
array names, dtypes, shapes, values, raw bytes, metric keys and types), the round either
accepts it or drops it with a reason; no exception escapes into the round, and the state the
round leaves stays within its invariants. One hostile reply among four honest ones, over every
algorithm's contract.

Hypothesis runs derandomized (a fixed seed, no example database) with a bounded number of
examples per algorithm, so CI sees the same cases every time; `ADAPTFL_FUZZ_EXAMPLES=500`
searches wider locally.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptfl.algorithms.catalog import catalog
from adaptfl.core import wire
from adaptfl.strategies.invariants import check_state
from tests.strategies.test_hostile_replies import GRID, HOSTILE, _honest, _message, _strategy

EXAMPLES = int(os.environ.get("ADAPTFL_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ALGORITHMS = sorted(catalog())

DTYPES = ["float32", "float64", "float16", "int64", "int32", "uint8", "bool", "complex64"]
SPECIAL = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 3.4e38, -3.4e38, 1e-45, 0.0,
           -0.0, -1.0, 1.0]
INTS = st.sampled_from([0, 1, -1, 10, 2**31, 2**62, 2**63 - 1, -2**63, 2**64, 10**30])
FLOATS = st.sampled_from(SPECIAL) | st.floats(allow_nan=True, allow_infinity=True)
METRIC_VALUES = (st.lists(INTS.filter(lambda v: -2**63 <= v < 2**63), max_size=3) | INTS | FLOATS
                 | st.lists(st.floats(allow_nan=True), max_size=3))
KEYS = st.sampled_from([wire.NUM_EXAMPLES, wire.PARTITION_ID, wire.F_HAT, "train-loss", "x"])
SHAPES = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def _array(data: st.DataObject, like: torch.Tensor | None) -> Array:
    """An array that differs from `like` in dtype, shape, values, or bytes."""
    kind = data.draw(st.sampled_from(["dtype", "shape", "value", "raw"]))
    base = like.numpy().copy() if like is not None else np.zeros((2, 2), np.float32)
    if kind == "dtype":
        return Array(base.astype(data.draw(st.sampled_from(DTYPES))))
    if kind == "shape":
        return Array(np.full(data.draw(SHAPES), data.draw(FLOATS), dtype=base.dtype))
    if kind == "value" and base.size and base.dtype.kind == "f":
        flat = base.reshape(-1)
        where = data.draw(st.integers(0, flat.size - 1))
        with np.errstate(over="ignore", invalid="ignore"):
            flat[where] = data.draw(FLOATS)
            if data.draw(st.booleans()):
                base = base * np.asarray(data.draw(FLOATS), dtype=base.dtype)
        return Array(base)
    shape = data.draw(st.sampled_from([tuple(base.shape), (10**9,), (3, -1), ()]))
    return Array(dtype=data.draw(st.sampled_from([str(base.dtype), "float32", "object", "<U3", "x"])),
                 shape=shape, stype=data.draw(st.sampled_from(["numpy.ndarray", "torch", ""])),
                 data=data.draw(st.binary(max_size=64)))


def _tensor(array: Array) -> torch.Tensor | None:
    """The array's values, or None if an earlier edit made it undecodable."""
    try:
        return torch.from_numpy(array.numpy().copy())
    except Exception:  # noqa: BLE001 - raw bytes from an earlier edit
        return None


def _mutate(data: st.DataObject, reply: dict) -> RecordDict:
    """The honest reply with 1-3 hostile edits, as the RecordDict a client would send."""
    records: dict[str, dict[str, Array]] = {
        r: {n: Array(t) for n, t in tensors.items()} for r, tensors in reply["arrays"].items()}
    metrics = dict(reply["metrics"])
    extra: dict[str, object] = {}
    for _ in range(data.draw(st.integers(1, 3))):
        edit = data.draw(st.sampled_from(["metric", "array", "drop-array", "add-array", "metric",
                                          "drop-record", "add-record", "array", "drop-metric",
                                          "foreign"]))
        name = data.draw(st.sampled_from(sorted(records))) if records else None
        if edit == "array" and name and records[name]:
            key = data.draw(st.sampled_from(sorted(records[name])))
            records[name][key] = _array(data, _tensor(records[name][key]))
        elif edit == "drop-array" and name and records[name]:
            records[name].pop(data.draw(st.sampled_from(sorted(records[name]))))
        elif edit == "add-array" and name:
            records[name][data.draw(st.sampled_from(["w", "extra", "b/hessian", ""]))] = _array(data, None)
        elif edit == "drop-record" and name:
            records.pop(name)
        elif edit == "add-record":
            records[data.draw(st.sampled_from([wire.V_LOCAL, wire.DELTA_C, "zzz"]))] = {
                "w": _array(data, None)}
        elif edit == "metric":
            metrics[data.draw(KEYS)] = data.draw(METRIC_VALUES)
        elif edit == "drop-metric" and metrics:
            metrics.pop(data.draw(st.sampled_from(sorted(metrics))))
        elif edit == "foreign":
            extra[data.draw(st.sampled_from(["config", "metrics-2"]))] = True
    content = RecordDict({r: ArrayRecord(dict(arrays)) for r, arrays in records.items()})
    content[wire.METRICS] = MetricRecord(metrics)
    if "config" in extra:
        content["config"] = ConfigRecord({"a": 1})
    if "metrics-2" in extra:
        content["more"] = MetricRecord({"a": 1})
    return content


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@FUZZ
@given(data=st.data())
@pytest.mark.slow
def test_any_one_reply_is_accepted_or_dropped_with_a_reason(algorithm: str, data) -> None:
    strategy = _strategy(algorithm)
    sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(
        1, ArrayRecord(strategy.state.model), ConfigRecord(), GRID)}
    replies = [_message(sent[n], _honest(strategy, n)) for n in range(1, HOSTILE)]
    replies.append(Message(content=_mutate(data, _honest(strategy, HOSTILE)), reply_to=sent[HOSTILE]))
    strategy.aggregate_train(1, replies)  # raises nothing, whatever the reply held
    report = strategy.report
    assert report.accepted + len(report.rejected) == HOSTILE
    assert all(isinstance(why, str) and why for why in report.rejected.values())
    assert set(report.rejected) <= {str(HOSTILE)}, report.rejected  # never an honest reply
    assert not report.skipped or report.skip_reason
    check_state(strategy.state, strategy.contract(), strategy.cfg.algorithm)


def test_num_examples_as_a_list_is_dropped_not_a_crash() -> None:
    """The reply of issue 21 §1: a KeyError in validation on main, for every algorithm."""
    strategy = _strategy("fedavg")
    sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(
        1, ArrayRecord(strategy.state.model), ConfigRecord(), GRID)}
    bad = _honest(strategy, HOSTILE)
    bad["metrics"][wire.NUM_EXAMPLES] = [1, 2]
    replies = [_message(sent[n], _honest(strategy, n)) for n in range(1, HOSTILE)]
    strategy.aggregate_train(1, [*replies, _message(sent[HOSTILE], bad)])
    assert "num-examples" in strategy.report.rejected[str(HOSTILE)]
    assert strategy.report.accepted == 4 and not strategy.report.skipped
