"""Durable client state: named by the job's run key, which survives a server resume; a damaged
or mis-shaped copy counts as lost state (issue 13 §3); private folders and files."""

from __future__ import annotations

import io
import os
import stat

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.client_app.client_state import ClientStateStore, StateSource
from adaptfl.codec.versions import HELD
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run
from adaptfl.strategies.state import ServerState


def _context(run_id: int) -> Context:
    return Context(run_id=run_id, node_id=5, node_config={"partition-id": 3, "num-partitions": 4},
                   state=RecordDict(), run_config={})


def test_run_key_is_new_per_job_and_kept_by_a_checkpoint() -> None:
    a, b = ServerState(0, {"w": torch.zeros(1)}), ServerState(0, {"w": torch.zeros(1)})
    assert a.run_key != b.run_key
    assert ServerState.from_bytes(a.to_bytes()).run_key == a.run_key


def test_a_resumed_run_with_a_new_flower_run_id_finds_its_disk_state(tmp_path) -> None:
    saved = ClientStateStore(_context(run_id=11), str(tmp_path), server_round=2, run_key="job1")
    saved.save("c", {"w": torch.tensor([1.5])})
    # The server resumed: Flower gave the run a new id, the SuperNode restarted (empty memory).
    resumed = ClientStateStore(_context(run_id=99), str(tmp_path), server_round=3, run_key="job1")
    tensors, source = resumed.load("c")
    assert source is StateSource.DISK and torch.equal(tensors["w"], torch.tensor([1.5]))
    other_job = ClientStateStore(_context(run_id=11), str(tmp_path), server_round=3, run_key="job2")
    assert other_job.load("c") == (None, StateSource.NONE)


def test_a_run_key_that_is_not_a_plain_name_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="run key"):
        ClientStateStore(_context(1), str(tmp_path), 2, run_key="../../etc")


# --- corruption and permissions (issue 13 §3) -----------------------------------------------------
SHAPES = {"w": (2, 3)}


def _store(tmp_path, server_round: int, context: Context | None = None) -> ClientStateStore:
    return ClientStateStore(context or _context(1), str(tmp_path), server_round, run_key="job")


def test_unreadable_or_misshaped_state_is_lost_state(tmp_path) -> None:
    _store(tmp_path, 1).save("c", {"w": torch.ones(2, 3)})
    path = next(tmp_path.glob("run-job/partition-3/c.r1.pt"))
    good = path.read_bytes()
    owner = torch.load(path, weights_only=True)["owner"]  # bound: so the tensors are what is checked
    cases = {
        "truncated": good[: len(good) // 2],
        "garbage": os.urandom(200),
        "wrong shape": _bound(owner, {"w": torch.ones(3, 2)}),
        "other keys": _bound(owner, {"v": torch.ones(2, 3)}),
        "not tensors": _bound(owner, {"w": "a string"}),
        "non-finite": _bound(owner, {"w": torch.full((2, 3), float("nan"))}),
    }
    for case, blob in cases.items():
        path.write_bytes(blob)
        assert _store(tmp_path, 2).load("c", SHAPES) == (None, StateSource.NONE), case
    path.write_bytes(good)
    tensors, source = _store(tmp_path, 2).load("c", SHAPES)
    assert source is StateSource.DISK and torch.equal(tensors["w"], torch.ones(2, 3))


def _bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _bound(owner: dict, tensors: dict) -> bytes:
    return _bytes({"owner": owner, "tensors": tensors})


def test_a_misshaped_copy_in_memory_falls_back_to_the_disk(tmp_path) -> None:
    context = _context(1)
    _store(tmp_path, 1, context).save("c", {"w": torch.ones(2, 3)})
    context.state["adaptfl-c.r1"] = ArrayRecord({"w": torch.ones(5)})
    tensors, source = _store(tmp_path, 2, context).load("c", SHAPES)
    assert source is StateSource.DISK and tensors["w"].shape == (2, 3)


def test_state_folders_are_0700_files_0600_and_foreign_folders_refused(tmp_path) -> None:
    _store(tmp_path, 1).save("c", {"w": torch.ones(2, 3)})
    run_dir, client_dir = tmp_path / "run-job", tmp_path / "run-job" / "partition-3"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(client_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(next(client_dir.glob("*.pt")).stat().st_mode) == 0o600
    # a client folder planted as a link elsewhere is not used
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run-other").mkdir(mode=0o700)
    (tmp_path / "run-other" / "partition-3").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="is a link or belongs to another user"):
        ClientStateStore(_context(1), str(tmp_path), 1, run_key="other").save("c", {"w": torch.ones(1)})
    if os.getuid() == 0:  # root can plant a folder owned by someone else
        (tmp_path / "run-foreign").mkdir(mode=0o700)
        os.chown(tmp_path / "run-foreign", 4242, 4242)
        with pytest.raises(ValueError, match="belongs to another user"):
            ClientStateStore(_context(1), str(tmp_path), 1, run_key="foreign").save("c", {"w": torch.ones(1)})


@pytest.mark.parametrize("algorithm,name,corrupt", [
    ("scaffold", "scaffold", "truncate"), ("moon", "moon", "garbage"),
    ("scaffold", "scaffold", "reshape"), ("hafedho", "hafedho", "reshape"),
])
def test_a_client_with_corrupt_state_reports_state_0_and_trains_on(algorithm, name, corrupt,
                                                                  tiny_data, tmp_path) -> None:
    """After round 1 the node restarts (empty memory) and finds its file damaged: it replies
    normally, as a client that did not take part before, and says so (client-state=0)."""
    grid, msg = after_round_1(algorithm, tiny_data, tmp_path)
    node = msg.metadata.dst_node_id
    context = grid.contexts[node]
    (path,) = (tmp_path / "state").glob(f"run-*/partition-{node - 1}/{name}.r1.pt")

    restarted = Context(run_id=1, node_id=node, node_config=context.node_config,
                        state=RecordDict(), run_config={})
    reply = train_or_refuse(msg, restarted)  # intact file: read from disk
    assert not reply.has_error() and reply.content["metrics"][wire.CLIENT_STATE] == StateSource.DISK
    if corrupt == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    elif corrupt == "garbage":
        path.write_bytes(os.urandom(4096))
    else:  # the same keys, one tensor of another shape
        bound = torch.load(path, weights_only=True)
        state = bound["tensors"]
        key = next(k for k, t in state.items() if t.ndim == 2)
        state[key] = torch.zeros(state[key].shape[0] + 1, state[key].shape[1])
        path.write_bytes(_bytes(bound))
    restarted = Context(run_id=1, node_id=node, node_config=context.node_config,
                        state=RecordDict(), run_config={})
    reply = train_or_refuse(msg, restarted)
    assert not reply.has_error(), reply.error.reason
    assert reply.content["metrics"][wire.CLIENT_STATE] == StateSource.NONE


def after_round_1(algorithm: str, tiny_data, tmp_path) -> tuple[InProcessGrid, Message]:  # noqa: ANN001
    """A 2-node run of `algorithm` through round 1 (client state on disk under tmp_path/state);
    round 2's first instruction, not yet delivered."""
    cfg = RunConfig.of(algorithm=algorithm, model="mlp", num_server_rounds=2, local_steps=2,
                       batch_size=8, data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path),
                       run_name="t", client_state_dir=str(tmp_path / "state"), accept_small_rounds=True)
    grid = InProcessGrid(2, cfg.to_flower())
    strategy = build_run(cfg)[0]
    first = list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid))
    strategy.aggregate_train(1, list(grid.send_and_receive(first)))
    (msg, *_) = strategy.configure_train(2, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    return grid, msg


def test_durable_state_is_fsynced_and_a_held_broadcast_copy_is_not(tmp_path, monkeypatch) -> None:
    """A held copy's digest catches a torn one (codec/versions.py): its two fsyncs (~10 ms of
    every message) buy nothing; SCAFFOLD's c_i and the like are synced as before."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    _store(tmp_path, 1).save("c", {"w": torch.ones(2, 3)})
    assert len(synced) == 2  # the file, then the folder's rename
    synced.clear()
    _store(tmp_path, 1).save(HELD + wire.ARRAYS, {"w": torch.ones(2, 3)})
    assert synced == []
    tensors, source = _store(tmp_path, 2).load(HELD + wire.ARRAYS)
    assert source is StateSource.DISK and torch.equal(tensors["w"], torch.ones(2, 3))
