"""Durable client state is named by the job's run key, which survives a server resume."""

from __future__ import annotations

import pytest
import torch
from adaptfl.client_app.client_state import ClientStateStore, StateSource
from adaptfl.strategies.state import ServerState
from flwr.app import Context, RecordDict


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
