"""DiLoCo / MuLoCo: the inner optimizer state kept per client (`local-state='persist'`) and the
outer Nesterov step, against torch's own optimizers; the kept state never crosses the wire.

The hand computation holds two `torch.optim.AdamW` (one per client, kept for the whole run, the
way a DiLoCo worker keeps its own) and one `torch.optim.SGD(momentum, nesterov=True)` stepping
the global model with p = -mean Δ; the real client session and strategy must follow it, also
for a client that skips round 2 and comes back in round 3 with its round-1 state.
"""

from __future__ import annotations

import copy
import logging
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.client_state import StateSource
from adaptfl.client_app.session import ClientSession
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.core.stage import ClientData
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.local_update.persist import export_local_state, import_local_state
from adaptfl.local_update.shell import LocalUpdate
from adaptfl.strategies import DiLoCo

LR, K, ROUNDS, WD = 0.01, 3, 3, 0.1
# float32: each round's few dozen elementwise ops round at 2^-24 relative, and our AdamW runs
# torch's fused kernel while the oracle runs its foreach one (a few ulps apart per step); over
# 3 rounds x 3 steps that stays well inside 64 ulps of the values (|x| ~ 1).
TOL = dict(rtol=64 * torch.finfo(torch.float32).eps, atol=64 * torch.finfo(torch.float32).eps)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _batches(pid: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The client's K batches, the same in every round (what the two sides must agree on)."""
    gen = torch.Generator().manual_seed(100 + pid)
    return [(torch.randn(5, 4, generator=gen) + pid, torch.randint(0, 2, (5,), generator=gen))
            for _ in range(K)]


def _context(node: int) -> Context:
    return Context(run_id=1, node_id=node, node_config={wire.NODE_PARTITION_ID: node - 1,
                                                        wire.NODE_NUM_PARTITIONS: 2},
                   state=RecordDict(), run_config={})


def _client(msg: Message, context: Context) -> Message:
    model = _model()
    session = ClientSession(msg, model, context=context, data=ClientData(num_examples=5))
    for x, y in _batches(context.node_id - 1):
        logits = model(x)
        session.backward(session.loss(x, logits, F.cross_entropy(logits, y)), logits)
        session.step()
    return session.reply(num_examples=5)


def _run(tmp_path, skip: dict[int, set[int]], **keys) -> tuple[dict[str, torch.Tensor], list[Message], str]:
    """The real strategy and client sessions; `skip`: round -> nodes whose reply never comes."""
    strategy = DiLoCo(lr=LR, local_steps=K, num_server_rounds=ROUNDS, client_state_dir=str(tmp_path),
                      **keys)
    model = _model()
    strategy.initialize(model.state_dict(), ModelSpec.of(model))
    grid, contexts, replies = InProcessGrid(2, {}), {n: _context(n) for n in (1, 2)}, []
    for r in range(1, ROUNDS + 1):
        sent = strategy.configure_train(r, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
        got = [_client(m, contexts[m.metadata.dst_node_id]) for m in sent
               if m.metadata.dst_node_id not in skip.get(r, set())]
        strategy.aggregate_train(r, got)
        assert strategy.report.accepted == len(got), strategy.report.rejected
        replies += got
    return strategy.state.model, replies, strategy.state.run_key


def _by_hand(skip: dict[int, set[int]]) -> dict[str, torch.Tensor]:
    """DiLoCo with torch's optimizers: a kept AdamW per client, SGD(nesterov) outside."""
    global_model = _model()
    outer = torch.optim.SGD(global_model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    workers = [_model() for _ in range(2)]
    inner = [torch.optim.AdamW(w.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=WD)
             for w in workers]
    for r in range(1, ROUNDS + 1):
        lr = LR * 0.5 * (1.0 + math.cos(math.pi * (r - 1) / ROUNDS))  # the cosine schedule
        deltas = []
        for pid in (0, 1):
            if pid + 1 in skip.get(r, set()):
                continue  # its AdamW keeps the state of its last round
            worker, opt = workers[pid], inner[pid]
            worker.load_state_dict(global_model.state_dict())
            for group in opt.param_groups:
                group["lr"] = lr
            for x, y in _batches(pid):
                opt.zero_grad()
                F.cross_entropy(worker(x), y).backward()
                opt.step()
            deltas.append({n: p.detach() - q.detach() for (n, p), q in
                           zip(worker.named_parameters(), global_model.parameters(), strict=True)})
        outer.zero_grad()
        for n, p in global_model.named_parameters():
            p.grad = -torch.stack([d[n] for d in deltas]).mean(0)  # equal sizes: the plain mean
        outer.step()
    return {n: t.detach() for n, t in global_model.state_dict().items()}


def test_diloco_equals_torch_adamw_kept_and_sgd_nesterov_with_a_skipped_round(tmp_path) -> None:
    skip = {2: {2}}  # node 2 sits out round 2 and comes back with its round-1 AdamW state
    ours, replies, _ = _run(tmp_path, skip)
    expected = _by_hand(skip)
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], **TOL, msg=name)
    # where each reply's kept state came from: none in round 1, then the disk (node 2's is
    # stale; client-state-memory is off by default: model-sized state stays out of the context)
    sources = [int(m.content[wire.METRICS][wire.LOCAL_STATE_SOURCE]) for m in replies]
    assert sources == [StateSource.NONE] * 2 + [StateSource.DISK] * 3
    # and the state is what matters: the same run starting fresh every round is another model
    fresh, _, _ = _run(tmp_path / "fresh", skip, local_state="fresh")
    assert any(not torch.allclose(fresh[n], expected[n], **TOL) for n in expected)


def test_the_kept_state_never_crosses_the_wire(tmp_path) -> None:
    """The contract of diloco/muloco/diloco-act is FedAvg's: the model down, Δ up, nothing else;
    the replies carry Δ and metrics only, and the bytes of a round are FedAvg's."""
    spec = ModelSpec.of(_model())
    fedavg = RunConfig.of(algorithm="fedavg").algorithm.contract(spec)
    for name in ("diloco", "muloco", "diloco-act"):
        contract = RunConfig.of(algorithm=name).algorithm.contract(spec)
        assert (contract.down, contract.up) == (fedavg.down, fedavg.up) == ({}, {}), name
    _, replies, _ = _run(tmp_path, {})
    assert all(set(m.content.array_records) == {wire.DELTA} for m in replies)
    assert all(set(m.content.metric_records) == {wire.METRICS} for m in replies)
    assert list(tmp_path.glob("run-*/partition-*/local-state.r3.pt"))  # kept on the client


@pytest.mark.slow
def test_bytes_per_round_equal_fedavgs(tiny_data, tmp_path) -> None:
    from adaptfl.server_app.loop import run_federated
    from tests.support.run_outputs import metric_rows

    rows = {}
    for name in ("fedavg", "diloco"):
        cfg = RunConfig.of(algorithm=name, num_server_rounds=2, local_steps=2, batch_size=16, model="mlp",
                           data_dir=tiny_data["fashion-mnist"],
                           figures=False, results_dir=str(tmp_path), run_name=name,
                           client_state_dir=str(tmp_path / "state"), accept_small_rounds=True)
        rows[name] = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))
    for key in ("bytes-down", "bytes-up"):
        assert [r[key] for r in rows["diloco"]] == [r[key] for r in rows["fedavg"]], key
        assert all(r[key] > 0 for r in rows["diloco"][1:])


# --- the kept state itself ------------------------------------------------------------------------
def _optimizer(model: torch.nn.Module, preconditioner: str) -> LocalUpdate:
    named = list(model.named_parameters())
    extra = {"adam": {"bias_correction": "local"}, "adamw": {"bias_correction": "local"},
             "muon": {"muon_routing": "all-2d"}}.get(preconditioner, {})  # both matrices: Muon's
    return LocalUpdate(named, preconditioner=preconditioner, **extra)


def _steps(model: torch.nn.Module, opt: LocalUpdate, seed: int, n: int = 2) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x, y = torch.randn(6, 4, generator=gen), torch.randint(0, 2, (6,), generator=gen)
        opt.zero_grad()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        opt.bs = 6
        opt.step()


@pytest.mark.parametrize("preconditioner", ["adamw", "adam", "sgd", "muon", "soap", "sophia"])
def test_exported_state_continues_the_same_trajectory(preconditioner: str) -> None:
    """Kept state -> a new optimizer on a new model object: the next steps are the very steps the
    old optimizer would have taken (moments, step counts, SOAP's bases, Muon's momentum)."""
    model = _model()
    opt = _optimizer(model, preconditioner)
    _steps(model, opt, seed=1, n=11)  # past SOAP's and Sophia's 10-step refreshes
    stored = export_local_state(opt)
    assert "0.weight/step" in stored and stored["0.weight/step"].item() == 11
    twin = copy.deepcopy(model)
    opt2 = _optimizer(twin, preconditioner)
    assert import_local_state(opt2, stored) is None
    _steps(model, opt, seed=2)
    _steps(twin, opt2, seed=2)
    for (n, a), b in zip(model.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b), (preconditioner, n)


def test_a_state_of_another_model_is_refused_untouched() -> None:
    model = _model()
    opt = _optimizer(model, "adamw")
    _steps(model, opt, seed=1)
    stored = export_local_state(opt)
    other = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    fresh = _optimizer(other, "adamw")
    before = export_local_state(fresh)
    assert "has shape" in import_local_state(fresh, stored)
    assert all(torch.equal(before[k], v) for k, v in export_local_state(fresh).items())
    partial = {k: v for k, v in stored.items() if not k.startswith("2.")}
    assert "step counts for 2 of 4" in import_local_state(_optimizer(_model(), "adamw"), partial)


def test_lost_state_is_reported_and_restarts_from_zero(tmp_path) -> None:
    """A SuperNode restart (empty context.state) finds the disk copy; with the disk gone too the
    client starts from zero, as in its first round, and says so."""
    _, _, run_key = _run(tmp_path, {})
    strategy = DiLoCo(lr=LR, local_steps=K, num_server_rounds=ROUNDS + 1, client_state_dir=str(tmp_path))
    model = _model()
    strategy.initialize(model.state_dict(), ModelSpec.of(model))
    strategy.state.run_key = run_key  # the same job (as a resume keeps it)
    msg = next(iter(strategy.configure_train(ROUNDS + 1, ArrayRecord(strategy.state.model), ConfigRecord(),
                                             InProcessGrid(2, {}))))
    restarted = _context(msg.metadata.dst_node_id)  # empty context.state: a restarted SuperNode
    assert _source(_client(msg, restarted)) == StateSource.DISK
    for path in tmp_path.glob("run-*/*/local-state.r*.pt"):
        path.unlink()
    assert _source(_client(msg, _context(msg.metadata.dst_node_id))) == StateSource.NONE


def test_another_partitions_kept_state_is_refused(tmp_path, caplog) -> None:
    """Partition 1's AdamW state copied over partition 0's (issue 32 §6) is not loaded as its
    own (it was, as local-state-source=2): refused as a damaged file is, naming the mismatch."""
    _, _, run_key = _run(tmp_path, {})
    strategy = DiLoCo(lr=LR, local_steps=K, num_server_rounds=ROUNDS + 1, client_state_dir=str(tmp_path))
    model = _model()
    strategy.initialize(model.state_dict(), ModelSpec.of(model))
    strategy.state.run_key = run_key
    msg = next(m for m in strategy.configure_train(ROUNDS + 1, ArrayRecord(strategy.state.model),
                                                   ConfigRecord(), InProcessGrid(2, {}))
               if m.metadata.dst_node_id == 1)
    mine = tmp_path / f"run-{run_key}" / "partition-0" / f"local-state.r{ROUNDS}.pt"
    shutil.copyfile(tmp_path / f"run-{run_key}" / "partition-1" / mine.name, mine)
    with caplog.at_level(logging.WARNING, logger="adaptfl.client_app.client_state"):
        assert _source(_client(msg, _context(1))) == StateSource.NONE
    assert any(str(mine) in r.getMessage() and "client 'partition-1', not 'partition-0'" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def _source(reply: Message) -> int:
    return int(reply.content[wire.METRICS][wire.LOCAL_STATE_SOURCE])


def test_persist_refuses_bias_corrections_on_the_global_step() -> None:
    with pytest.raises(ValueError, match="local-state='persist' carries the step count"):
        RunConfig.of(algorithm="fedact", local_state="persist")
    cfg = RunConfig.of(algorithm="fedact", local_state="persist", bias_correction="local")
    assert cfg.algorithm.local_state.persists and cfg.algorithm.moments.synced  # v̄ imported over it
    assert RunConfig.of(algorithm="diloco").weight_decay == WD
    assert RunConfig.of(algorithm="diloco", preconditioner="sgd").weight_decay == 1e-3  # sgd's own
    assert RunConfig.of(algorithm="diloco", weight_decay=0.0).weight_decay == 0.0


def test_the_named_strategies_carry_the_papers_defaults() -> None:
    from adaptfl.strategies import DiLoCoACT, MuLoCo

    diloco, muloco, act = DiLoCo().cfg, MuLoCo().cfg, DiLoCoACT().cfg
    for cfg, rule in ((diloco, "adamw"), (muloco, "muon"), (act, "adamw")):
        a = cfg.algorithm
        assert (a.preconditioner.name, a.server_opt.name, a.local_state.name) == (rule, "nesterov", "persist")
        assert (a.server_opt.eta, a.server_opt.server_momentum) == (0.7, 0.9)
    adamw = diloco.algorithm.preconditioner
    assert (adamw.beta1, adamw.beta2, adamw.bias_correction) == (0.9, 0.95, "local")
    assert act.algorithm.trust.name == "act" and act.weight_decay == WD
    assert diloco.algorithm.trust.name == "none" and muloco.weight_decay == 0.01  # Muon's own
