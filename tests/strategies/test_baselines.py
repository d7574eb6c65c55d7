"""Client-side baselines on problems whose answer is known.

SCAFFOLD: two clients with quadratics of different curvature and different optima. FedAvg's
fixed point is biased by client drift (K > 1 local steps); SCAFFOLD's control variates remove
the drift and it reaches the global optimum with the same steps. Both sides run the real code
(ScaffoldTerm + LocalUpdate on the client, ScaffoldStrategy on the server, the variates taken
from the server's messages).
"""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from adaptfl.algorithms.components.feddyn import FedDyn
from adaptfl.algorithms.components.moon import contrastive_loss
from adaptfl.algorithms.components.prox import Prox
from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.client_state import ClientStateStore
from adaptfl.client_app.session import ClientSession
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.core.stage import ClientData, ClientRound
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import AdaptiveStrategy

A = [torch.tensor([2.0, 0.2]), torch.tensor([0.2, 2.0])]  # diagonal Hessians
OPT = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])]  # local optima
# Global optimum of ½Σ_i (w - a_i)ᵀA_i(w - a_i): (ΣA_i)^{-1} Σ A_i a_i
W_STAR = (A[0] * OPT[0] + A[1] * OPT[1]) / (A[0] + A[1])
LR, K, ROUNDS = 0.1, 10, 150


class Point(torch.nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.clone())


def _client_round(msg: Message, pid: int, context: Context) -> Message:
    """A user's own training loop on a quadratic, through the client session (the real
    SCAFFOLD client part: c from the message, c_i durable, Δc_i in the reply)."""
    model = Point(torch.zeros(2))
    session = ClientSession(msg, model, context=context, data=ClientData())
    for _ in range(session.info.local_steps):
        loss = session.loss(None, None, 0.5 * (A[pid] * (model.w - OPT[pid]) ** 2).sum())
        session.backward(loss)
        session.step()
    return session.reply(num_examples=1)


def _run(algorithm: str, tmp_path) -> torch.Tensor:
    cfg = RunConfig.of(algorithm=algorithm, lr=LR, lr_schedule="constant", local_steps=K,
                       weight_decay=0.0, num_server_rounds=ROUNDS, client_state_dir=str(tmp_path))
    strategy = AdaptiveStrategy(cfg)
    strategy.initialize({"w": torch.zeros(2)}, ModelSpec({"w": ((2,), torch.float32)}, ("w",)))
    grid = InProcessGrid(2, {})
    contexts = {node: Context(run_id=1, node_id=node, node_config={wire.NODE_PARTITION_ID: node - 1,
                                                                   wire.NODE_NUM_PARTITIONS: 2},
                              state=RecordDict(), run_config={}) for node in (1, 2)}
    for r in range(1, ROUNDS + 1):
        messages = strategy.configure_train(r, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
        replies = [_client_round(m, m.metadata.dst_node_id - 1, contexts[m.metadata.dst_node_id])
                   for m in messages]
        strategy.aggregate_train(r, replies)
        assert strategy.report.accepted == 2, strategy.report.rejected
    return strategy.state.model["w"]


@pytest.mark.slow
def test_scaffold_reaches_the_global_optimum_where_fedavg_drifts(tmp_path) -> None:
    fedavg = _run("fedavg", tmp_path / "fedavg")
    scaffold = _run("scaffold", tmp_path / "scaffold")
    assert float((scaffold - W_STAR).norm()) < 1e-4, scaffold
    assert float((fedavg - W_STAR).norm()) > 0.05, fedavg  # client drift: a biased fixed point


def _round(model: torch.nn.Module, algorithm: str, tmp_path, server_round: int = 2, **kw) -> ClientRound:
    cfg = RunConfig.of(algorithm=algorithm, **kw)
    context = Context(run_id=1, node_id=1, node_config={wire.NODE_PARTITION_ID: 0,
                                                        wire.NODE_NUM_PARTITIONS: 1},
                      state=RecordDict(), run_config={})
    return ClientRound(model, cfg.algorithm, cfg.round_info(server_round), {},
                       ClientStateStore(context, str(tmp_path), server_round),
                       ClientData())


def test_fedprox_term_is_half_mu_squared_distance(tmp_path) -> None:
    model = Point(torch.tensor([1.0, 2.0]))
    part = Prox(mu=0.4).start(_round(model, "fedprox", tmp_path, mu=0.4))
    with torch.no_grad():
        model.w.add_(torch.tensor([3.0, -4.0]))
    value = part.loss(torch.zeros(1), torch.zeros(1))
    assert float(value.detach()) == pytest.approx(0.5 * 0.4 * 25.0)
    value.backward()
    torch.testing.assert_close(model.w.grad, 0.4 * torch.tensor([3.0, -4.0]))


def test_feddyn_correction_and_state_update(tmp_path) -> None:
    model = Point(torch.tensor([1.0, 1.0]))
    term = FedDyn(dyn_alpha=0.5)
    part = term.start(_round(model, "feddyn", tmp_path, dyn_alpha=0.5))
    part.prev_grad = {"w": torch.tensor([1.0, -1.0])}
    with torch.no_grad():
        model.w.add_(torch.tensor([2.0, 0.0]))
    model.w.grad = torch.tensor([0.5, 0.5])
    part.correct_(dict(model.named_parameters()))  # ∇ + α(θ - θ^{t-1}) - ∇L_i(θ_i^{t-1})
    torch.testing.assert_close(model.w.grad, torch.tensor([0.5 + 1.0 - 1.0, 0.5 + 0.0 + 1.0]))
    part.finish(None, {"w": torch.tensor([2.0, 0.0])}, 0.0)  # ∇L_i ← ∇L_i - α·Δ
    again = term.start(_round(Point(torch.zeros(2)), "feddyn", tmp_path, server_round=3, dyn_alpha=0.5))
    assert again.prev_grad["w"].tolist() == [0.0, -1.0]  # restored from disk: [1-0.5·2, -1-0]


def test_moon_contrastive_loss_by_hand() -> None:
    z = torch.tensor([[1.0, 0.0]])
    z_glob = torch.tensor([[1.0, 0.0]])  # cos = 1
    z_prev = torch.tensor([[0.0, 1.0]])  # cos = 0
    tau = 0.5
    expected = -torch.log(torch.exp(torch.tensor(2.0)) / (torch.exp(torch.tensor(2.0)) + 1.0))
    torch.testing.assert_close(contrastive_loss(z, z_glob, z_prev, tau), expected)


def test_feddyn_server_by_hand() -> None:
    strategy = AdaptiveStrategy(RunConfig.of(algorithm="feddyn", dyn_alpha=0.5))
    strategy.initialize({"w": torch.tensor([1.0, 1.0])}, ModelSpec({"w": ((2,), torch.float32)}, ("w",)))
    sent = list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(),
                                         InProcessGrid(4, {})))  # N = 4 connected, all sampled
    reply = Message(content=RecordDict({wire.DELTA: ArrayRecord({"w": torch.tensor([2.0, -2.0])}),
                                        wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: 1})}),
                    reply_to=sent[0])
    strategy.aggregate_train(1, [reply])
    # |S|/N = 1/4: h = 0 - 0.5·(1/4)·[2, -2] = [-0.25, 0.25]; θ = [1,1] + [2,-2] - h/α = [3.5, -1.5]
    assert strategy.state.extras["feddyn-h"]["w"].tolist() == [-0.25, 0.25]
    assert strategy.state.model["w"].tolist() == [3.5, -1.5]
