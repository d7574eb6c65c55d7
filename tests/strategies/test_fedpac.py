"""FedPAC / FedMIX-P servers with hand-built replies: Θ averaged by name for each optimizer
(SOAP's conv factors with 4 modes, a mode above max_precond_dim), the wire round trip with
shapes and dtypes, malformed Θ dropped, light uploads expanded, g_G, drift and bytes."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from adaptfl.algorithms.components.sharing import full_theta
from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.local_update.rules.soap import SOAP
from adaptfl.local_update.theta import compress, drift, expand, light_spec, theta_spec
from adaptfl.strategies import AdaptiveStrategy

F32 = torch.float32
SHAPES = {"conv.weight": (3, 2, 2, 2), "conv.bias": (3,), "fc.weight": (4, 12), "fc.bias": (4,)}
SPEC = ModelSpec({n: (s, F32) for n, s in SHAPES.items()}, tuple(SHAPES))
MAX_DIM = 6  # fc.weight's mode of 12 stays unrotated: no gg1 for it


GRID = InProcessGrid(2, {})  # nodes 1, 2; also Flower's task identity, so messages can be built


def _strategy(algorithm: str, **kw) -> AdaptiveStrategy:
    extra = {"max_precond_dim": MAX_DIM} if algorithm.endswith("soap") else \
        {"muon_routing": "all-2d"} if algorithm.endswith("muon") else {}
    strategy = AdaptiveStrategy(RunConfig.of(algorithm=algorithm, local_steps=2, lr=0.5,
                                             lr_schedule="constant", **extra, **kw))
    strategy.initialize({n: torch.zeros(s) for n, s in SHAPES.items()}, SPEC)
    return strategy


def _theta(optimizer: str, fill: float) -> dict[str, torch.Tensor]:
    spec = full_theta(SPEC, _strategy(f"fedpac-{optimizer}").cfg.algorithm)
    gen = torch.Generator().manual_seed(int(fill))
    theta = {k: fill + torch.rand(s, generator=gen) for k, (s, _) in spec.items()}
    # SOAP's statistics are symmetric PSD (validation refuses others): M·Mᵀ / d
    return {k: t @ t.T / t.shape[0] if "/gg" in k else t for k, t in theta.items()}


def _sent(strategy: AdaptiveStrategy, server_round: int = 1) -> dict[int, Message]:
    messages = strategy.configure_train(server_round, ArrayRecord(strategy.state.model), None, GRID)
    return {m.metadata.dst_node_id: m for m in messages}


def _reply(to: Message, theta: dict, n: int, delta: float = 1.0) -> Message:
    content = RecordDict({
        wire.DELTA: ArrayRecord({k: torch.full(s, delta) for k, s in SHAPES.items()}),
        wire.THETA_LOCAL: ArrayRecord(theta),
        wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: n}),
    })
    return Message(content=content, reply_to=to)


def test_theta_spec_has_soap_factors_per_mode_and_skips_large_modes() -> None:
    spec = theta_spec(SOAP(max_precond_dim=MAX_DIM), list(SHAPES.items()))
    assert spec == {"conv.weight/gg0": ((3, 3), F32), "conv.weight/gg1": ((2, 2), F32),
                    "conv.weight/gg2": ((2, 2), F32), "conv.weight/gg3": ((2, 2), F32),
                    "fc.weight/gg0": ((4, 4), F32)}


@pytest.mark.parametrize("optimizer", ["sophia", "muon", "soap"])
def test_server_averages_theta_by_name_and_reports_drift(optimizer: str) -> None:
    strategy = _strategy(f"fedpac-{optimizer}")
    a, b = _theta(optimizer, 1.0), _theta(optimizer, 5.0)
    sent = _sent(strategy)
    # B first: the weighted mean must not depend on arrival order.
    strategy.aggregate_train(1, [_reply(sent[2], b, 3, delta=-1.0), _reply(sent[1], a, 1)])
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
    assert set(strategy.contract().down) == {wire.THETA, wire.G_G}


def test_fedmixp_sends_its_reference_and_no_correction_by_default() -> None:
    strategy = _strategy("fedmixp-soap")
    strategy.aggregate_train(1, [_reply(_sent(strategy)[1], _theta("soap", 1.0), 1)])
    assert set(strategy.payload()) == {wire.THETA}
    assert strategy.report.bytes_up > 0


@pytest.mark.parametrize("bad", ["shape", "dtype", "nan", "missing", "unknown"])
def test_malformed_theta_is_dropped_and_state_untouched(bad: str) -> None:
    strategy = _strategy("fedpac-soap")
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
    strategy.aggregate_train(1, [_reply(_sent(strategy)[1], theta, 1)])
    assert strategy.report.accepted == 0 and "theta-i" in next(iter(strategy.report.rejected.values()))
    assert wire.THETA not in strategy.state.extras


@pytest.mark.parametrize("optimizer", ["sophia", "muon", "soap"])
def test_light_upload_round_trips_and_is_expanded_before_averaging(optimizer: str) -> None:
    strategy = _strategy(f"fedpac-{optimizer}", light=True, light_c=0.5)
    full = full_theta(SPEC, strategy.cfg.algorithm)
    a = _theta(optimizer, 1.0)
    small = compress(a, 0.5)
    assert {k: (tuple(v.shape), v.dtype) for k, v in small.items()} == light_spec(full, 0.5)
    strategy.aggregate_train(1, [_reply(_sent(strategy)[1], small, 1)])
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
