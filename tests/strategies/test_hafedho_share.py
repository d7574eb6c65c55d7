"""HaFedHo's participation weight p_i = |D_i| / |D| (spec §5) where a client cannot know |D|:
nodes that train on their own data-dir, and a user's ClientSession without `data=`. Four
rounds on two nodes of 3 and 9 rows must follow the paper's rule with the true federation size
(|D| = 12), computed here by hand in plain torch; p_i = 1 (what a node sees of its own rows)
gives another trajectory, which the test checks too, so it can fail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.client_app.session import ClientSession
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies.base import AdaptiveStrategy
from tests.support.user_package import write_user_package

SIZES = (3, 9)
MU, LR, K, ROUNDS = 2.0, 0.2, 2, 4

MODULE = '''
def load(data_dir):
    x, y = torch.load(data_dir + "/rows.pt")
    return Task(train=Rows(x, y), test=Rows(x, y), num_outputs=3, input_shape=(4,), name="rows")

def build(task):
    return torch.nn.Linear(4, task.num_outputs)
'''


@pytest.fixture
def nodes(tmp_path, monkeypatch) -> tuple[str, list[str]]:
    """A user package (task + model by name) and one data-dir per node, of SIZES rows."""
    module = write_user_package(tmp_path, monkeypatch, "share_pkg", MODULE)
    gen = torch.Generator().manual_seed(3)
    dirs = []
    for i, n in enumerate(SIZES):
        folder = tmp_path / f"node{i}"
        folder.mkdir()
        torch.save((torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)),
                   folder / "rows.pt")
        dirs.append(str(folder))
    return module, dirs


def _user_app(msg: Message, context: Context) -> Message:
    """A user's own ClientApp: its data, its loop, ClientSession without `data=`."""
    from share_pkg.mod import build, load

    task = load(str(context.node_config[wire.NODE_DATA_DIR]))
    model = build(task)
    session = ClientSession(msg, model, context=context)
    x, y = task.train.x, task.train.labels
    for _ in range(session.info.local_steps):
        logits = model(x)
        loss = session.loss(x, logits, F.cross_entropy(logits, y))
        session.backward(loss, logits)
        session.step()
    return session.reply(num_examples=len(y))


def _paper(x0: dict[str, torch.Tensor], data: list, shares: list[float]) -> dict[str, torch.Tensor]:
    """Spec §5 by hand, full participation: every client took part in the round before."""
    x = {n: t.clone() for n, t in x0.items()}
    g: dict[str, torch.Tensor] | None = None
    own: list[dict[str, torch.Tensor]] = [{} for _ in data]
    for _ in range(ROUNDS):
        deltas = []
        for i, (xi, yi) in enumerate(data):
            h = {n: g[n] - shares[i] * own[i][n] for n in x} if g is not None else \
                {n: torch.zeros_like(t) for n, t in x.items()}
            w = {n: t.clone().requires_grad_(True) for n, t in x.items()}
            for _ in range(K):  # ∇φ_i = ∇f_i + μh (the constant f has no gradient)
                loss = F.cross_entropy(F.linear(xi, w["weight"], w["bias"]), yi)
                grads = torch.autograd.grad(loss, [w["weight"], w["bias"]])
                with torch.no_grad():
                    for (n, p), gr in zip(w.items(), grads, strict=True):
                        p -= LR * (gr + MU * h[n])
            deltas.append({n: w[n].detach() - x[n] for n in x})
            own[i] = {n: -deltas[i][n] / LR for n in x}  # g_i = Σ_k ∇φ_i
        weights = [s / sum(SIZES) for s in SIZES]  # the server's examples-weighted mean
        mean = {n: sum(wt * d[n] for wt, d in zip(weights, deltas, strict=True)) for n in x}
        x = {n: x[n] + mean[n] for n in x}
        g = {n: -mean[n] / LR for n in x}
    return x


@pytest.mark.parametrize("handler", [train_or_refuse, _user_app], ids=["clientapp-data-dir", "user-session"])
def test_p_i_is_the_share_of_the_federation_the_server_knows(nodes, tmp_path, handler) -> None:
    pkg, dirs = nodes
    cfg = RunConfig.of(algorithm="hafedho", task=f"{pkg}:load", model=f"{pkg}:build", mu=MU, lr=LR,
                       lr_schedule="constant", local_steps=K, batch_size=64, weight_decay=0.0,
                       num_server_rounds=ROUNDS, client_state_dir=str(tmp_path / "state"),
                       max_contribution_ratio=0.0)  # the paper's plain mean (a round of two replies
    # is otherwise bounded against the history of earlier ones: docs/robustness.md)
    grid = InProcessGrid(len(SIZES), cfg.to_flower(), handler=handler)
    for context, folder in zip(grid.contexts.values(), dirs, strict=True):
        context.node_config[wire.NODE_DATA_DIR] = folder  # each node trains on all of its own rows
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    strategy = AdaptiveStrategy(cfg)
    strategy.initialize(model.state_dict(), ModelSpec.of(model))
    x0 = {n: t.clone() for n, t in model.state_dict().items()}
    for server_round in range(1, ROUNDS + 1):
        messages = list(strategy.configure_train(server_round, ArrayRecord(strategy.state.model),
                                                 ConfigRecord(), grid))
        strategy.aggregate_train(server_round, list(grid.send_and_receive(messages)))
        assert strategy.report.accepted == len(SIZES), strategy.report.rejected
    data = [torch.load(f"{folder}/rows.pt") for folder in dirs]
    expected = _paper(x0, data, [n / sum(SIZES) for n in SIZES])
    wrong = _paper(x0, data, [1.0, 1.0])  # p_i = |D_i| / |D_i|: a node's view of its own rows
    # float32 steps summed in another order: a few ulps of values O(1) per op, over 16 steps
    tol = 1e-5
    for n in expected:
        assert float((expected[n] - wrong[n]).abs().max()) > 100 * tol  # the test can fail
        torch.testing.assert_close(strategy.state.model[n], expected[n], rtol=0.0, atol=tol)


def test_a_message_with_g_but_no_federation_size_is_refused(nodes, tmp_path) -> None:
    """A client that took part last round needs |D|: without it, one line, never p_i = 1."""
    pkg, dirs = nodes
    cfg = RunConfig.of(algorithm="hafedho", task=f"{pkg}:load", model=f"{pkg}:build", lr=LR,
                       local_steps=1, batch_size=64, num_server_rounds=2)
    grid = InProcessGrid(1, cfg.to_flower(), handler=_user_app)
    grid.contexts[1].node_config[wire.NODE_DATA_DIR] = dirs[0]
    strategy = AdaptiveStrategy(cfg)
    strategy.initialize(torch.nn.Linear(4, 3).state_dict())
    for server_round in (1, 2):
        messages = list(strategy.configure_train(server_round, ArrayRecord(strategy.state.model),
                                                 ConfigRecord(), grid))
        if server_round == 2:  # neither its bytes nor its version (else: "held", codec/versions.py)
            del messages[0].content.array_records[wire.HAFEDHO_N_TOTAL]
            del messages[0].content.config_records[wire.VERSIONS][wire.HAFEDHO_N_TOTAL]
        replies = list(grid.send_and_receive(messages))
        strategy.aggregate_train(server_round, replies)
    assert replies[0].has_error()
    reason = replies[0].error.reason.strip().splitlines()[-1]
    assert "carries g but not 'n-total'" in reason and "p_i" in reason
