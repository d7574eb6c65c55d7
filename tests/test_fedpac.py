"""FedPAC / FedMIX-P servers with hand-built replies: Θ averaged by name for each optimizer
(SOAP's conv factors with 4 modes, a mode above max_precond_dim), the wire round trip with
shapes and dtypes, malformed Θ dropped, light uploads expanded, g_G, drift and bytes."""

from __future__ import annotations

import pytest
import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.local_update.theta import compress, drift, expand, light_spec, theta_spec
from adaptfl.strategies import FedMIXPStrategy, FedPACStrategy, ModelSpec
from adaptfl.strategies.state import ServerState
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict

F32 = torch.float32
SHAPES = {"conv.weight": (3, 2, 2, 2), "conv.bias": (3,), "fc.weight": (4, 12), "fc.bias": (4,)}
SPEC = ModelSpec({n: (s, F32) for n, s in SHAPES.items()}, tuple(SHAPES))
MAX_DIM = 6  # fc.weight's mode of 12 stays unrotated: no gg1 for it


def _cfg(algorithm: str, **kw) -> RunConfig:
    return RunConfig(algorithm=algorithm, local_steps=2, lr=0.5, lr_schedule="constant",
                     max_precond_dim=MAX_DIM, muon_routing="all-2d", **kw)


def _state() -> ServerState:
    return ServerState(0, {n: torch.zeros(s) for n, s in SHAPES.items()}, run_key="t")


def _theta(optimizer: str, fill: float) -> dict[str, torch.Tensor]:
    spec = theta_spec(optimizer, list(SHAPES.items()), "all-2d", MAX_DIM)
    gen = torch.Generator().manual_seed(int(fill))
    return {k: fill + torch.rand(s, generator=gen) for k, (s, _) in spec.items()}


def _reply(node: int, theta: dict, n: int, pid: int, delta: float = 1.0) -> Message:
    InProcessGrid(1, {})  # Flower's task identity, so messages can be built here
    content = RecordDict({
        wire.DELTA: ArrayRecord({k: torch.full(s, delta) for k, s in SHAPES.items()}),
        wire.THETA_LOCAL: ArrayRecord(theta),
        wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: n, wire.PARTITION_ID: pid}),
    })
    ins = Message(content=RecordDict({}), dst_node_id=node, message_type=MessageType.TRAIN)
    return Message(content=content, reply_to=ins)


def test_theta_spec_has_soap_factors_per_mode_and_skips_large_modes() -> None:
    spec = theta_spec("soap", list(SHAPES.items()), "hidden", MAX_DIM)
    assert spec == {"conv.weight/gg0": ((3, 3), F32), "conv.weight/gg1": ((2, 2), F32),
                    "conv.weight/gg2": ((2, 2), F32), "conv.weight/gg3": ((2, 2), F32),
                    "fc.weight/gg0": ((4, 4), F32)}


@pytest.mark.parametrize("optimizer", ["sophia", "muon", "soap"])
def test_server_averages_theta_by_name_and_reports_drift(optimizer: str) -> None:
    strategy = FedPACStrategy(_cfg(f"fedpac-{optimizer}"), SPEC, _state())
    a, b = _theta(optimizer, 1.0), _theta(optimizer, 5.0)
    # B first: the weighted mean must not depend on arrival order.
    strategy.aggregate_train(1, [_reply(2, b, 3, 1, delta=-1.0), _reply(1, a, 1, 0)])
    assert strategy.report.accepted == 2, strategy.report.rejected
    theta = strategy.state.extras[wire.THETA]
    assert set(theta) == set(a)
    for k in a:
        torch.testing.assert_close(theta[k], 0.25 * a[k] + 0.75 * b[k])
        assert theta[k].dtype == F32 and theta[k].shape == a[k].shape
    # g_G = -mean Δ / (K·lr) with mean Δ = 0.25·1 + 0.75·(-1) = -0.5, K·lr = 1
    assert torch.equal(strategy.state.extras[wire.G_G]["fc.bias"], torch.full((4,), 0.5))
    expected = sum(float((t[k] - theta[k]).square().sum()) for t in (a, b) for k in a) / 2
    assert strategy.report.metrics["preconditioner-drift"] == pytest.approx(expected, rel=1e-5)
    payload = strategy.payload()  # next round: Θ^r and g_G go down with the model
    assert set(payload) == {wire.THETA, wire.G_G}


def test_fedmixp_sends_its_reference_and_no_correction_by_default() -> None:
    strategy = FedMIXPStrategy(_cfg("fedmixp-soap"), SPEC, _state())
    strategy.aggregate_train(1, [_reply(1, _theta("soap", 1.0), 1, 0)])
    assert set(strategy.payload()) == {wire.THETA}
    assert strategy.report.bytes_up > 0


@pytest.mark.parametrize("bad", ["shape", "dtype", "nan", "missing", "unknown"])
def test_malformed_theta_is_dropped_and_state_untouched(bad: str) -> None:
    strategy = FedPACStrategy(_cfg("fedpac-soap"), SPEC, _state())
    theta = _theta("soap", 1.0)
    if bad == "shape":
        theta["conv.weight/gg0"] = torch.zeros(2, 2)
    elif bad == "dtype":
        theta["conv.weight/gg0"] = theta["conv.weight/gg0"].double()
    elif bad == "nan":
        theta["fc.weight/gg0"][0, 0] = float("nan")
    elif bad == "missing":
        del theta["conv.weight/gg3"]
    else:
        theta["fc.weight/gg1"] = torch.zeros(12, 12)  # above max_precond_dim: not part of Θ
    strategy.aggregate_train(1, [_reply(1, theta, 1, 0)])
    assert strategy.report.accepted == 0 and "theta-i" in next(iter(strategy.report.rejected.values()))
    assert wire.THETA not in strategy.state.extras


@pytest.mark.parametrize("optimizer", ["sophia", "muon", "soap"])
def test_light_upload_round_trips_and_is_expanded_before_averaging(optimizer: str) -> None:
    strategy = FedPACStrategy(_cfg(f"fedpac-{optimizer}", light=True, light_c=0.5), SPEC, _state())
    full = strategy.theta_full_spec()
    a = _theta(optimizer, 1.0)
    small = compress(a, 0.5)
    assert {k: (tuple(v.shape), v.dtype) for k, v in small.items()} == light_spec(full, 0.5)
    strategy.aggregate_train(1, [_reply(1, small, 1, 0)])
    assert strategy.report.accepted == 1, strategy.report.rejected
    got = strategy.state.extras[wire.THETA]
    for k, v in expand(small, full).items():
        torch.testing.assert_close(got[k], v)
    assert 0.0 < strategy.report.metrics["theta-compression"] < 1.0
    if optimizer == "soap":  # top-r eigenpairs of a symmetric matrix of rank ≤ r are exact
        low = {k: (v[:, :1] @ v[:, :1].T) for k, v in a.items()}
        torch.testing.assert_close(expand(compress(low, 0.5), full), low, atol=1e-5, rtol=1e-4)
    if optimizer == "sophia":  # one mean per tensor
        assert torch.equal(got["conv.bias/hessian"], a["conv.bias/hessian"].mean().expand(3))


def test_drift_is_zero_for_identical_states() -> None:
    a = _theta("sophia", 1.0)
    assert drift([a, a], a) == 0.0
    assert drift([a, _theta("sophia", 2.0)], a) > 0.0
