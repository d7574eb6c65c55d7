"""HaFedHo (seed 003): the rectification term, the participation rule, the server's g and f̂
averaging, and the fallback when a client's durable state is lost — on a tiny linear model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from adaptfl.algorithms.components.hafedho import RECTIFIED_LOSS, rectification
from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.client_state import ClientStateStore, StateSource
from adaptfl.client_app.session import build_optimizer
from adaptfl.codec.codec import array_bytes
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.core.stage import ClientData, ClientPart, ClientRound, PartOutput
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import HaFedHo
from adaptfl.workloads import ImageData

MU, LR = 0.5, 0.25
# 4 examples of 1x1x2 "images" (x = pixel/255), 2 classes; the client holds 2 of 6 examples.
DATA = ImageData(images=torch.tensor([[[[255, 0]]], [[[0, 255]]], [[[255, 255]]], [[[51, 102]]]],
                                     dtype=torch.uint8),
                 labels=torch.tensor([0, 1, 1, 0]), num_classes=2, mean=(0.0,), std=(1.0,))
INDICES = torch.tensor([0, 1])
DATASET_SIZE = 6  # |D| as the server sends it: p_i = 2/6
G_PREV = {"1.weight": torch.tensor([[1.0, -2.0], [0.5, 0.0]]), "1.bias": torch.tensor([0.25, -1.0])}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2, 2))


def _cfg(**kw) -> RunConfig:
    base = dict(algorithm="hafedho", mu=MU, lr=LR, lr_schedule="constant", local_steps=1,
                batch_size=8, weight_decay=0.0, num_server_rounds=5)
    return RunConfig.of(**{**base, **kw})


def _context(state: RecordDict | None = None) -> Context:
    return Context(run_id=7, node_id=3, node_config={wire.NODE_PARTITION_ID: 0,
                                                     wire.NODE_NUM_PARTITIONS: 3},
                   state=state if state is not None else RecordDict(), run_config={})


def _term(model, cfg: RunConfig, server_round: int, context: Context, state_dir,
          records: dict | None = None) -> ClientPart:
    """HaFedHo's client part for one round, as the session starts it."""
    ctx = ClientRound(model, cfg.algorithm, cfg.round_info(server_round), records or {},
                      ClientStateStore(context, str(state_dir), server_round),
                      ClientData())
    ctx.num_examples = len(INDICES)  # what the reply will claim (the session sets it)
    (term,) = cfg.algorithm.terms
    return term.start(ctx)


def _train(model: torch.nn.Module, cfg: RunConfig, part: ClientPart, server_round: int
           ) -> tuple[dict, PartOutput]:
    """The round's K local SGD steps on the partition (batch >= partition) with the term."""
    opt = build_optimizer(model, cfg.algorithm, cfg.round_info(server_round))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = DATA.batch(INDICES)
    losses = []
    for _ in range(cfg.local.local_steps):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        extra = part.loss(x, logits)
        opt.zero_grad(set_to_none=True)
        (loss if extra is None else loss + extra).backward()
        part.correct_(dict(model.named_parameters()))
        opt.step()
        losses.append(float(loss.detach()))
    delta = {n: p.detach() - start[n] for n, p in model.named_parameters()}
    return delta, part.finish(opt, delta, sum(losses) / len(losses))


def _server_records(f_prev: float) -> dict:
    return {wire.HAFEDHO_G: {k: v.clone() for k, v in G_PREV.items()},
            wire.HAFEDHO_F_HAT: {"f-hat": torch.tensor([f_prev])},
            wire.HAFEDHO_N_TOTAL: {"n-total": torch.tensor([float(DATASET_SIZE)], dtype=torch.float64)}}


def test_participation_rule_by_hand() -> None:
    own = {"w": torch.tensor([3.0, 6.0])}
    g = {"w": torch.tensor([1.0, 1.0])}
    h, f = rectification(g, 2.0, own, 0.9, p_i=1 / 3, took_part=True)
    assert h["w"].tolist() == [0.0, -1.0] and f == pytest.approx(2.0 - 0.3)  # g - p_i·g_i
    h, f = rectification(g, 2.0, own, 0.9, p_i=1 / 3, took_part=False)
    assert h["w"].tolist() == [1.0, 1.0] and f == 2.0  # raw aggregates
    assert rectification(None, 0.0, own, 0.9, 1 / 3, True) == ({}, 0.0)  # round 1: no g yet


def test_objective_term_value_and_gradient(tmp_path) -> None:
    model = _model()
    term = _term(model, _cfg(), 2, _context(), tmp_path, _server_records(1.5))
    assert not term.took_part and term.source == StateSource.NONE
    with torch.no_grad():  # move w away from w_t by a known amount
        model[1].weight.add_(torch.tensor([[0.5, 0.5], [1.0, -1.0]]))
        model[1].bias.add_(torch.tensor([2.0, 0.0]))
    value = term.loss(torch.zeros(1), torch.zeros(1))
    # μ·(f + hᵀ(w - w_t)), h = g (no participation): hᵀΔw = 0.5-1.0+0.5+0 + 0.5 = 0.5
    assert float(value.detach()) == pytest.approx(MU * (1.5 + 0.5))
    value.backward()
    for n, p in model.named_parameters():  # ∇ of the term is μ·h
        torch.testing.assert_close(p.grad, MU * G_PREV[n])


def test_one_client_round_by_hand_and_both_rectify_modes(tmp_path) -> None:
    """K=1 SGD step: w1 = w0 - lr·(∇f_i(w0) + μh); f̂_i = f_i(w0); stored g_i = -Δ/lr."""
    results = {}
    for mode in ("objective", "gradient"):
        model = _model()
        w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
        cfg = _cfg(rectify=mode)
        context = _context()
        term = _term(model, cfg, 2, context, tmp_path / mode, _server_records(1.5))
        delta, out = _train(model, cfg, term, 2)
        results[mode] = delta
        # Independent computation of ∇f_i(w0) on the whole partition (batch >= partition).
        ref = _model()
        x, y = DATA.batch(INDICES)
        loss = F.cross_entropy(ref(x), y)
        loss.backward()
        for n, p in ref.named_parameters():
            expected = -LR * (p.grad + MU * G_PREV[n])
            torch.testing.assert_close(delta[n], expected)
            assert torch.equal(w0[n], p.detach())
        assert out.metrics[wire.F_HAT] == pytest.approx(float(loss))
        assert out.metrics[wire.TOOK_PART] == 0 and out.metrics[wire.CLIENT_STATE] == 0
        saved = context.state.array_records["adaptfl-hafedho.r2"].to_torch_state_dict()
        assert int(saved["round"]) == 2
        torch.testing.assert_close(saved["g.1.bias"], -delta["1.bias"] / LR)
        # the surrogate φ_i's value needs f: only the objective mode has it (and reports it)
        assert (RECTIFIED_LOSS in out.metrics) == (mode == "objective")
    for n in results["objective"]:  # ∇φ_i = ∇f_i + μh: the same SGD step either way
        torch.testing.assert_close(results["objective"][n], results["gradient"][n])


def _state_after_round(context: Context, state_dir, server_round: int) -> None:
    model = _model()
    _train(model, _cfg(), _term(model, _cfg(), server_round, context, state_dir, _server_records(1.0)),
           server_round)


def test_took_part_last_round_subtracts_its_own_share(tmp_path) -> None:
    context = _context()
    _state_after_round(context, tmp_path, 2)
    own = context.state.array_records["adaptfl-hafedho.r2"].to_torch_state_dict()
    term = _term(_model(), _cfg(), 3, context, tmp_path, _server_records(1.0))
    assert term.took_part and term.source == StateSource.MEMORY
    p_i = 2 / 6
    for n in G_PREV:
        torch.testing.assert_close(term.h[n], G_PREV[n] - p_i * own[f"g.{n}"])
    assert term.f == pytest.approx(1.0 - p_i * float(own["f-hat"]))
    # Skipped round 3: in round 4 the state is from round 2, so it did NOT take part last round.
    later = _term(_model(), _cfg(), 4, context, tmp_path, _server_records(1.0))
    assert not later.took_part and later.source == StateSource.MEMORY
    torch.testing.assert_close(later.h["1.weight"], G_PREV["1.weight"])


def test_restart_restores_from_disk_and_lost_state_falls_back(tmp_path) -> None:
    _state_after_round(_context(), tmp_path, 2)
    # A restarted SuperNode: empty context.state, same run and partition -> restored from disk.
    restored = _term(_model(), _cfg(), 3, _context(), tmp_path, _server_records(1.0))
    assert restored.took_part and restored.source == StateSource.DISK
    # State gone everywhere (new disk): behaves as "did not take part last round", and says so.
    model = _model()
    lost = _term(model, _cfg(), 3, _context(), tmp_path / "empty", _server_records(1.0))
    assert not lost.took_part and lost.source == StateSource.NONE
    torch.testing.assert_close(lost.h["1.weight"], G_PREV["1.weight"])
    assert lost.f == 1.0
    metrics = _train(model, _cfg(), lost, 3)[1].metrics
    assert metrics[wire.TOOK_PART] == 0 and metrics[wire.CLIENT_STATE] == int(StateSource.NONE)


def census_handler(claims: dict[int, object], pids: dict[int, object] | None = None):  # noqa: ANN201
    """A node handler answering the census (QUERY) with `claims` by node id (partition id node − 1
    unless `pids` says otherwise); a node without a claim fails it, as an app without @app.query."""
    from flwr.app import Error

    def handle(msg: Message, context) -> Message:  # noqa: ANN001
        node = context.node_id
        if msg.metadata.message_type != MessageType.QUERY or node not in claims:
            return Message(Error(code=0, reason="no query handler"), reply_to=msg)
        pid = (pids or {}).get(node, node - 1)
        return Message(RecordDict({wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: claims[node],
                                                               wire.PARTITION_ID: pid})}), reply_to=msg)
    return handle


def _reply(to: Message, delta: dict, n: int, f_hat: float | None) -> Message:
    metrics = {wire.NUM_EXAMPLES: n, wire.PARTITION_ID: to.metadata.dst_node_id - 1}
    if f_hat is not None:
        metrics[wire.F_HAT] = f_hat
    content = RecordDict({wire.DELTA: ArrayRecord({k: torch.tensor(v) for k, v in delta.items()}),
                          wire.METRICS: MetricRecord(metrics)})
    return Message(content=content, reply_to=to)


def test_server_averages_g_and_f_hat_by_hand() -> None:
    strategy = HaFedHo(lr=0.5, lr_schedule="constant", local_steps=2)
    strategy.initialize({"w": torch.tensor([1.0, 1.0])}, ModelSpec({"w": ((2,), torch.float32)}, ("w",)))
    grid = InProcessGrid(3, {}, handler=census_handler({1: 1, 2: 3, 3: 2}))
    first = list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid))
    assert set(first[0].content.array_records) == {wire.ARRAYS}  # nothing to rectify with yet
    strategy.aggregate_train(1, [_reply(first[0], {"w": [1.0, -2.0]}, 1, 0.8),
                                 _reply(first[1], {"w": [-1.0, 2.0]}, 3, 0.4),
                                 _reply(first[2], {"w": [9.0, 9.0]}, 1, None)])  # no f̂: dropped
    assert "f-hat" in strategy.report.rejected["3"] and strategy.report.accepted == 2
    # mean Δ (1:3) = [-0.5, 1.0]; x = [0.5, 2.0]; g = -mean Δ / lr = [1.0, -2.0]
    assert strategy.state.model["w"].tolist() == [0.5, 2.0]
    assert strategy.state.extras[wire.HAFEDHO_G]["w"].tolist() == [1.0, -2.0]
    # f̂ = (1·0.8 + 3·0.4) / 4 = 0.5
    assert float(strategy.state.extras[wire.HAFEDHO_F_HAT]["f-hat"]) == pytest.approx(0.5)
    # |D|: the census's claims before round 1, 1 + 3 + 2 (strategies/census.py), the dropped
    # reply's node among them
    assert strategy.state.extras[wire.HAFEDHO_N_TOTAL]["n-total"].tolist() == [6.0]
    second = list(strategy.configure_train(2, ArrayRecord(strategy.state.model), ConfigRecord(), grid))
    assert set(second[0].content.array_records) == {wire.ARRAYS, wire.HAFEDHO_G, wire.HAFEDHO_F_HAT,
                                                    wire.HAFEDHO_N_TOTAL}
    # x, g, f̂, |D| (float64) to three clients, each array with its .npy header
    two, one = array_bytes((2,), torch.float32), array_bytes((1,), torch.float32)
    assert strategy.report.bytes_down == 3 * (two + two + one + array_bytes((1,), torch.float64))
    # Round 2's cohort: node 2 now claims 5 (counted once: its 3 stays) and node 3 (dropped
    # before) 2: |D| = 1 + 3 + 2, every client seen
    strategy.aggregate_train(2, [_reply(second[1], {"w": [0.0, 0.0]}, 5, 0.1),
                                 _reply(second[2], {"w": [0.0, 0.0]}, 2, 0.1)])
    assert strategy.state.extras[wire.HAFEDHO_N_TOTAL]["n-total"].tolist() == [6.0]


def test_a_robust_aggregator_bounds_a_liars_share_of_the_federation() -> None:
    """Under the median each client's claim counts at most the median claim: one claim of 10^9
    examples leaves |D| = 5·10; under the mean at max-weight-ratio (10) × the median."""
    from adaptfl.algorithms.config import RunConfig as Config
    from adaptfl.strategies.examples import round_examples

    claims = [{wire.PARTITION_ID: i, wire.NUM_EXAMPLES: n} for i, n in enumerate([10, 10, 10, 10, 10**9])]
    for rule, expected in (("median", 50.0), ("mean", 40.0 + 100.0)):
        strategy = HaFedHo(Config.of(algorithm="hafedho", aggregator=rule, min_replies=5))
        strategy.initialize({"w": torch.tensor([1.0])}, ModelSpec({"w": ((1,), torch.float32)}, ("w",)))
        strategy.num_nodes = 5
        replies = [type("R", (), {"metrics": m})() for m in claims]
        assert strategy._examples(replies)[0] == expected == round_examples(  # type: ignore[arg-type]
            {}, claims, None, True, 5, 1.0 if rule == "median" else 10.0)[0]
