"""Many clients without timing anything: the partition is computed once per process (not per
round, not per message), the server keeps no reply past its round, and what the server process
holds of the clients' durable state (Flower's simulation keeps every node's `context.state` in
the server's process) is bounded by `client-state-memory`."""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
import weakref

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app import app as client_app
from adaptfl.client_app.client_state import context_bytes
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from adaptfl.workloads import partitioning
from tests.support.run_outputs import metric_rows

NODES, ROUNDS = 60, 3
SMALL = dict(model="mlp", num_server_rounds=ROUNDS, local_steps=1, batch_size=8, fraction_train=0.05,
             partitioning="iid", diagnostics_every=0, run_name="t")


def _cfg(tmp_path, tiny_data, **extra) -> RunConfig:
    return RunConfig.of(figures=False, results_dir=str(tmp_path / "out"), data_dir=tiny_data["fashion-mnist"],
                        client_state_dir=str(tmp_path / "state"), **{**SMALL, **extra})


@pytest.mark.slow
def test_the_partition_is_computed_once_for_all_rounds_and_clients(tmp_path, tiny_data,
                                                                   monkeypatch) -> None:
    cfg = _cfg(tmp_path, tiny_data, seed=1234, fraction_train=0.2)  # a seed no other test uses
    calls = []
    real = client_app.partition_indices
    monkeypatch.setattr(client_app, "partition_indices",
                        lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    before = partitioning._cached_partitioner.cache_info().misses
    rows = metric_rows(run_federated(InProcessGrid(NODES, cfg.to_flower()), cfg))
    sampled = [r["replies-sampled"] for r in rows]
    assert sampled == [12] * ROUNDS and [r["replies-accepted"] for r in rows] == sampled
    # one look-up per client, the first time it is sampled (then its rows come from its
    # context.state: a deployed ClientApp is a fresh process every message), never one per
    # existing client per round; clients were sampled again, so some look-ups were saved
    assert len(calls) == len(set(calls)) < sum(sampled)
    # ... and one computation of the 60-way split: the server's check of every node's partition
    # and all the clients' messages share it
    assert partitioning._cached_partitioner.cache_info().misses - before == 1


@pytest.mark.slow
def test_the_server_keeps_no_reply_past_its_round(tmp_path, tiny_data) -> None:
    cfg = _cfg(tmp_path, tiny_data)
    grid = InProcessGrid(NODES, cfg.to_flower())
    seen: list[list[weakref.ref]] = []
    send = grid.send_and_receive

    def send_and_keep_refs(messages, *, timeout=None):
        replies = list(send(messages, timeout=timeout))
        seen.append([weakref.ref(r) for r in replies])
        return replies

    grid.send_and_receive = send_and_keep_refs
    alive_at_round_end = []

    def after_round(row) -> None:
        gc.collect()
        alive_at_round_end.append([sum(ref() is not None for ref in refs) for refs in seen])

    run_federated(grid, cfg, on_round=after_round)
    # after round r, the replies of rounds before r are gone (round r's may still be referenced
    # by the loop's locals until the next round replaces them)
    for r, alive in enumerate(alive_at_round_end, start=1):
        assert len(alive) == r and all(n == 0 for n in alive[:-2]), alive
    gc.collect()
    assert all(ref() is None for refs in seen for ref in refs)


@pytest.mark.parametrize("in_memory", [True, False])
@pytest.mark.slow
def test_scaffold_state_in_the_server_process_only_with_client_state_memory(tmp_path, tiny_data,
                                                                            in_memory) -> None:
    cfg = _cfg(tmp_path, tiny_data, algorithm="scaffold", fraction_train=0.1, local_steps=2,
               client_state_memory=in_memory)
    grid = InProcessGrid(NODES, cfg.to_flower())
    rows = metric_rows(run_federated(grid, cfg))
    took_part = {pid for r in rows for pid in r["clients"]}
    assert len(took_part) > 6  # 6 a round, 3 rounds, some clients twice
    # c_i's versions; the broadcast records a node keeps (codec/versions.py) are counted apart
    held = {node: sum(not k.startswith("adaptfl-held-") for k in c.state.array_records)
            for node, c in grid.contexts.items()}
    if in_memory:  # the clients that took part hold their last one or two versions of c_i
        assert sorted(n - 1 for n, k in held.items() if k) == sorted(map(int, took_part))
        assert max(held.values()) <= 2
    else:
        assert sum(held.values()) == 0
    # The disk copy either way: at most 2 versions per client that took part, each c_i the size
    # of the model (client_state.py keeps the last two).
    files = [f for f in (tmp_path / "state").rglob("*.pt") if not f.name.startswith("held-")]
    c_i = torch.load(files[0], weights_only=True)["tensors"]  # the file also names its owner
    model_bytes = sum(t.numel() * t.element_size() for t in c_i.values())
    assert {f.parent.name for f in files} == {f"partition-{p}" for p in took_part}
    assert len(files) <= 2 * len(took_part)
    assert model_bytes == 4 * 50_890  # the mlp's parameters in float32
    # a client sampled again finds its state where the setting says
    sources = {v["client-state"] for r in rows[1:] for v in r["clients"].values()}
    assert sources <= {0, 1 if in_memory else 2}


@pytest.mark.parametrize("algorithm", ["scaffold", "diloco"])  # c_i; AdamW's m and v
@pytest.mark.slow
def test_by_default_a_nodes_context_holds_nothing_model_sized(tmp_path, tiny_data, algorithm) -> None:
    """Flower's simulation keeps every node's context in the server's process and sends it to
    the actor and back with each message: model-sized durable state stays on disk by default
    (client-state-memory=false), and a node never sampled keeps nothing at all."""
    cfg = _cfg(tmp_path, tiny_data, algorithm=algorithm, local_steps=2)
    assert cfg.output.client_state_memory is False
    grid = InProcessGrid(NODES, cfg.to_flower())
    rows = metric_rows(run_federated(grid, cfg))
    took_part = {int(pid) + 1 for r in rows for pid in r["clients"]}
    sizes = {node: sum(context_bytes(c.state).values()) for node, c in grid.contexts.items()}
    model_bytes = 4 * 50_890  # the mlp's parameters in float32
    assert 0 < max(sizes[n] for n in took_part) < model_bytes / 20, sizes
    assert all(sizes[n] == 0 for n in grid.contexts if n not in took_part)
    assert list((tmp_path / "state").rglob("*.pt"))  # the durable state is on disk


def test_a_node_keeps_its_rows_and_recomputes_them_when_the_split_changes(monkeypatch) -> None:
    from flwr.app import Context, RecordDict

    from adaptfl.algorithms.settings import Data

    labels = torch.arange(200) % 10
    context = Context(run_id=1, node_id=5, node_config={"partition-id": 3, "num-partitions": 8},
                      state=RecordDict(), run_config={})
    calls = []
    real = client_app.partition_indices
    monkeypatch.setattr(client_app, "partition_indices", lambda *a, **k: calls.append(a) or real(*a, **k))
    data = Data(partitioning="dirichlet", dirichlet_alpha=0.5)
    first, pid = client_app._partition(context, data, 7, labels)
    again, _ = client_app._partition(context, data, 7, labels)
    assert pid == 3 and len(calls) == 1 and torch.equal(first, again)
    assert torch.equal(first, torch.as_tensor(real(labels, 8, 3, "dirichlet", 0.5, 7)))
    for changed in [(Data(partitioning="dirichlet", dirichlet_alpha=0.9), 7, labels), (data, 8, labels),
                    (data, 7, labels.flip(0))]:  # another α, seed, or data: computed again
        client_app._partition(context, *changed)
    assert len(calls) == 4


CHILD = """
import pickle, sys
from adaptfl.client_app import app
msg, context = pickle.load(open(sys.argv[1], "rb"))
reply = app.handle_train(msg, context)
assert not reply.has_error(), reply.error
print(sorted(m for m in ("torch._dynamo", "sympy", "triton", "datasets", "pyarrow") if m in sys.modules))
"""


@pytest.mark.slow
def test_a_fresh_clientapp_process_trains_without_dynamo_or_arrow(tmp_path, tiny_data, monkeypatch) -> None:
    """A deployed ClientApp is a fresh process per message, so what a round imports it pays on
    every message: torch.optim's dynamo wrapper (torch._dynamo, sympy, triton: ~80 MB and ~1 s
    of CPU) and flwr-datasets' Arrow tables for an iid split (~130 MB) stay out of a FedACT
    round with durable local state (docs/scale.md)."""
    cfg = _cfg(tmp_path, tiny_data, algorithm="fedact", local_state="persist", bias_correction="local",
               num_server_rounds=1, fraction_train=1.0, accept_small_rounds=True)
    captured = tmp_path / "message.pkl"
    real = client_app.handle_train

    def keep_first(msg, context):
        if not captured.exists():
            captured.write_bytes(pickle.dumps((msg, context)))
        return real(msg, context)

    monkeypatch.setattr(client_app, "handle_train", keep_first)
    run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    child = subprocess.run([sys.executable, "-c", CHILD, str(captured)], capture_output=True,
                           text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().splitlines()[-1] == "[]", child.stdout
