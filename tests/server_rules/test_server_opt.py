"""Server optimizers: the same replies give the same next model as Flower's own strategies,
and one FedAdamom step computed by hand."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_rules.server_opt.adamom import Adamom
from adaptfl.strategies import AdaptiveStrategy

F32 = torch.float32
SPEC = ModelSpec({"w": ((2, 2), F32), "b": ((3,), F32)}, ("w", "b"))
X0 = {"w": torch.tensor([[0.5, -1.0], [2.0, 0.25]]), "b": torch.tensor([0.0, 1.0, -3.0])}
# Per round, two clients' model changes (dyadic values: sums are exact in float32) and sizes 1:3.
ROUNDS = [
    [({"w": [[0.5, 0.25], [-1.0, 0.0]], "b": [0.125, -0.5, 1.0]}, 1),
     ({"w": [[-0.25, 0.75], [0.5, 0.0]], "b": [0.0, 0.25, -2.0]}, 3)],
    [({"w": [[1.0, -0.5], [0.25, 0.5]], "b": [-0.25, 0.5, 0.0]}, 1),
     ({"w": [[0.0, -0.25], [-0.75, 0.5]], "b": [0.5, 0.0, 0.0]}, 3)],
    [({"w": [[-0.5, 0.0], [0.0, 0.125]], "b": [1.0, -1.0, 0.5]}, 1),
     ({"w": [[0.25, 0.25], [0.25, -0.125]], "b": [-0.5, 0.5, 0.25]}, 3)],
]
HYPER = dict(server_beta1=0.8, server_beta2=0.95, server_tau=0.05)


def _flower(algorithm: str, eta: float):
    kw = dict(fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    b1, b2, tau = HYPER["server_beta1"], HYPER["server_beta2"], HYPER["server_tau"]
    return {
        "fedavgm": lambda: FedAvgM(server_learning_rate=eta, server_momentum=0.7, **kw),
        "fedadam": lambda: FedAdam(eta=eta, beta_1=b1, beta_2=b2, tau=tau, **kw),
        "fedyogi": lambda: FedYogi(eta=eta, beta_1=b1, beta_2=b2, tau=tau, **kw),
        "fedadagrad": lambda: FedAdagrad(eta=eta, tau=tau, **kw),
    }[algorithm]()


def _reply(content: RecordDict, to: Message) -> Message:
    return Message(content=content, reply_to=to)


@pytest.mark.parametrize("algorithm,eta", [("fedavgm", 0.9), ("fedadam", 0.1), ("fedyogi", 0.05),
                                           ("fedadagrad", 0.2)])
def test_same_replies_give_the_same_model_as_flower(algorithm: str, eta: float) -> None:
    grid = InProcessGrid(2, {})
    hyper = {"fedavgm": dict(server_momentum=0.7), "fedadagrad": dict(server_tau=HYPER["server_tau"])}
    ours = AdaptiveStrategy(RunConfig.of(algorithm=algorithm, eta=eta, **hyper.get(algorithm, HYPER)))
    ours.initialize({k: v.clone() for k, v in X0.items()}, SPEC)
    flower = _flower(algorithm, eta)
    flower_x = ArrayRecord({k: v.clone() for k, v in X0.items()})
    for server_round, clients in enumerate(ROUNDS, start=1):
        sent = list(ours.configure_train(server_round, ArrayRecord(ours.state.model), ConfigRecord(), grid))
        flower_sent = list(flower.configure_train(server_round, flower_x, ConfigRecord(), grid))
        current = flower_x.to_torch_state_dict()
        ours_replies, flower_replies = [], []
        for pid, (delta, n) in enumerate(clients):
            d = {k: torch.tensor(v) for k, v in delta.items()}
            ours_replies.append(_reply(RecordDict({
                wire.DELTA: ArrayRecord(d), wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: n})}), sent[pid]))
            flower_replies.append(_reply(RecordDict({
                "arrays": ArrayRecord({k: current[k] + d[k] for k in d}),
                "metrics": MetricRecord({"num-examples": n})}), flower_sent[pid]))
        ours.aggregate_train(server_round, ours_replies)
        flower_x, _ = flower.aggregate_train(server_round, flower_replies)
        expected = flower_x.to_torch_state_dict()
        for k in X0:
            torch.testing.assert_close(ours.state.model[k], expected[k].to(F32),
                                       rtol=1e-5, atol=1e-6, msg=f"{algorithm} round {server_round} {k}")
    # The moments live in the serialisable state (a resumed run continues them).
    assert any(k.startswith("server-opt/") for k in ours.state.extras)


def test_fedadamom_one_step_by_hand() -> None:
    x = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0, 0.0])}
    delta = {"a": torch.tensor([2.0, 0.0]), "b": torch.tensor([1.0, 1.0])}
    m0 = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([-1.0, 2.0])}
    v0 = {"a": torch.tensor([4.0, 0.0]), "b": torch.tensor([0.0, 8.0])}
    new_x, moments = Adamom(eta=0.5, b2=0.5, adamom_eps=1e-3).rule(x, delta, {"m": m0, "v": v0}, 1)
    # v = 0.5·v0 + 0.5·Δ² = a: [4, 0], b: [0.5, 4.5]; ONE mean over all 4 coordinates: v̄ = 9/4
    assert moments["v"]["a"].tolist() == [4.0, 0.0] and moments["v"]["b"].tolist() == [0.5, 4.5]
    # β1 = clip(1 - v/v̄, 0, 1-ε): a: [clip(1-16/9)=0, clip(1-0)=0.999]; b: [1-2/9, clip(1-2)=0]
    beta = {"a": [0.0, 0.999], "b": [7.0 / 9.0, 0.0]}
    # m = β1·m0 + (1-β1)·Δ
    m = {"a": [2.0, 0.999], "b": [-7.0 / 9.0 + 2.0 / 9.0, 1.0]}
    for k in m:
        expected_m = torch.tensor(m[k])
        torch.testing.assert_close(moments["m"][k], expected_m)
        torch.testing.assert_close(new_x[k], x[k] + 0.5 * expected_m)  # x + η·m, no 1/sqrt(v)
        assert all(0.0 <= b <= 0.999 for b in beta[k])


def test_fedadamom_composes_with_any_client_recipe() -> None:
    algorithm = RunConfig.of(algorithm="fedact", server_opt="adamom").algorithm
    server, trust = algorithm.server_opt, algorithm.trust
    assert (server.name, server.eta, trust.name) == ("adamom", 1.0, "act")
    assert algorithm.correction.weight == 0.5 and algorithm.moments.synced  # FedACT's clients kept


@pytest.mark.parametrize("key,value", [("server-momentum", 1.0), ("server-tau", 0.0),
                                       ("b2", 1.5), ("adamom-eps", 0.0), ("eta", -0.1),
                                       ("server-opt", "sgdm")])
def test_bad_server_hyperparameters_are_named(key: str, value: object) -> None:
    algorithm = {"server-momentum": "fedavgm", "server-tau": "fedadam", "b2": "fedadamom",
                 "adamom-eps": "fedadamom", "eta": "fedadam", "server-opt": "fedavg"}[key]
    with pytest.raises(ValueError, match=key):
        RunConfig.from_flower({"algorithm": algorithm, key: value})


def test_nesterov_matches_torch_sgd_nesterov_through_the_strategy() -> None:
    """server-opt='nesterov' over three rounds of weighted replies = torch.optim.SGD(momentum=β,
    nesterov=True) stepping x with the gradient p = -mean Δ; its momentum is server state, and
    a strategy restored from that state (a resume) takes the very same third step."""
    from adaptfl.strategies.state import ServerState

    grid = InProcessGrid(2, {})
    cfg = RunConfig.of(algorithm="fedavg", server_opt="nesterov", eta=0.7, server_momentum=0.8)
    ours = AdaptiveStrategy(cfg)
    ours.initialize({k: v.clone() for k, v in X0.items()}, SPEC)
    oracle = {k: torch.nn.Parameter(v.clone()) for k, v in X0.items()}
    sgd = torch.optim.SGD(list(oracle.values()), lr=0.7, momentum=0.8, nesterov=True)
    for server_round, clients in enumerate(ROUNDS, start=1):
        if server_round == 3:  # resume: a fresh strategy from the checkpointed state
            fresh = AdaptiveStrategy(cfg)
            fresh.initialize({k: v.clone() for k, v in X0.items()}, SPEC)
            fresh.state = ServerState.from_bytes(ours.state.to_bytes())
            ours = fresh
        sent = list(ours.configure_train(server_round, ArrayRecord(ours.state.model), ConfigRecord(), grid))
        replies, mean = [], {k: torch.zeros_like(v) for k, v in X0.items()}
        for pid, (delta, n) in enumerate(clients):
            d = {k: torch.tensor(v) for k, v in delta.items()}
            content = RecordDict({wire.DELTA: ArrayRecord(d),
                                  wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: n})})
            replies.append(_reply(content, sent[pid]))
            for k in d:
                mean[k] += d[k] * n / 4
        ours.aggregate_train(server_round, replies)
        sgd.zero_grad()
        for k, p in oracle.items():
            p.grad = -mean[k]
        sgd.step()
        for k in X0:  # dyadic inputs; the one rounding is float32's in the momentum products
            torch.testing.assert_close(ours.state.model[k], oracle[k].detach(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(ours.state.extras["server-opt/momentum"][k],
                                       sgd.state[oracle[k]]["momentum_buffer"], rtol=1e-6, atol=1e-6)


def test_nesterov_differs_from_heavy_ball() -> None:
    """The look-ahead term matters: from the second step on, Nesterov ≠ FedAvgM's x - η·m."""
    from adaptfl.server_rules.server_opt.avgm import AvgM
    from adaptfl.server_rules.server_opt.nesterov import Nesterov

    x, d = {"w": torch.tensor([1.0])}, {"w": torch.tensor([0.5])}
    nx, nm = Nesterov(eta=1.0, server_momentum=0.5).rule(x, d, {}, 1)
    hx, hm = AvgM(eta=1.0, server_momentum=0.5).rule(x, d, {}, 1)
    torch.testing.assert_close(nm["momentum"]["w"], hm["momentum"]["w"])  # same momentum m = -Δ
    assert float(nx["w"]) == 1.0 + 0.5 + 0.25 and float(hx["w"]) == 1.5  # x + Δ + β·Δ vs x + Δ
