"""Durable client state is bound to its owner (issue 32 §6): a file names the run, the partition
and the round it belongs to, and one that names another (partition 2's copied over partition
1's, a folder linked to another partition's, another job's, an older round renamed) or none is
refused as a damaged file is: lost state, client-state=0, one warning naming the file and what
does not match. An honest resume (new Flower run id, same run key) still loads."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from flwr.app import Context, RecordDict

from adaptfl.client_app.app import train_or_refuse
from adaptfl.client_app.client_state import ClientStateStore, StateSource
from adaptfl.core import wire
from tests.client_app.test_client_state import after_round_1

LOG = "adaptfl.client_app.client_state"


def _store(tmp_path, partition: int, server_round: int, run_key: str = "job", run_id: int = 1):
    context = Context(run_id=run_id, node_id=partition + 1,
                      node_config={"partition-id": partition, "num-partitions": 4},
                      state=RecordDict(), run_config={})  # empty memory: a restarted SuperNode
    return ClientStateStore(context, str(tmp_path), server_round, run_key=run_key)


def _save_both(tmp_path, run_key: str = "job") -> None:
    for partition in (1, 2):
        _store(tmp_path, partition, 1, run_key).save("c", {"w": torch.full((2,), float(partition))})


def _refused(store: ClientStateStore, caplog, *words: str) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert store.load("c", {"w": (2,)}) == (None, StateSource.NONE)
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOG]
    assert str(store.dir) in line and all(w in line for w in words), line


def test_another_partitions_file_copied_over_is_refused(tmp_path, caplog) -> None:
    _save_both(tmp_path)
    mine = tmp_path / "run-job" / "partition-1" / "c.r1.pt"
    shutil.copyfile(tmp_path / "run-job" / "partition-2" / "c.r1.pt", mine)
    _refused(_store(tmp_path, 1, 2), caplog, "c.r1.pt", "client 'partition-2', not 'partition-1'")


def test_a_folder_linked_to_another_partitions_is_refused(tmp_path, caplog) -> None:
    _save_both(tmp_path)
    mine = tmp_path / "run-job" / "partition-1"
    shutil.rmtree(mine)
    mine.symlink_to(tmp_path / "run-job" / "partition-2")
    _refused(_store(tmp_path, 1, 2), caplog, "client 'partition-2', not 'partition-1'")


def test_a_file_from_another_run_is_refused(tmp_path, caplog) -> None:
    _save_both(tmp_path, run_key="other")
    (tmp_path / "run-job" / "partition-1").mkdir(parents=True)
    shutil.copyfile(tmp_path / "run-other" / "partition-1" / "c.r1.pt",
                    tmp_path / "run-job" / "partition-1" / "c.r1.pt")
    _refused(_store(tmp_path, 1, 2), caplog, "run 'other', not 'job'")


def test_an_older_round_renamed_as_newer_is_refused(tmp_path, caplog) -> None:
    _save_both(tmp_path)
    folder = tmp_path / "run-job" / "partition-1"
    (folder / "c.r1.pt").rename(folder / "c.r2.pt")
    _refused(_store(tmp_path, 1, 3), caplog, "c.r2.pt", "round 1, not 2")


def test_a_file_without_an_owner_is_refused_as_not_bound(tmp_path, caplog) -> None:
    _save_both(tmp_path)
    path = tmp_path / "run-job" / "partition-1" / "c.r1.pt"
    torch.save({"w": torch.ones(2)}, path)  # the format before the binding: tensors only
    _refused(_store(tmp_path, 1, 2), caplog, "not bound")


def test_an_honest_resume_still_loads(tmp_path) -> None:
    _save_both(tmp_path)
    # the server resumed: a new Flower run id, the same run key; the SuperNode restarted
    tensors, source = _store(tmp_path, 1, 2, run_id=99).load("c", {"w": (2,)})
    assert source is StateSource.DISK and torch.equal(tensors["w"], torch.full((2,), 1.0))


@pytest.mark.parametrize("algorithm", ["scaffold", "hafedho"])
def test_a_client_given_another_partitions_state_reports_state_0(algorithm, tiny_data, tmp_path,
                                                                 caplog) -> None:
    """Round 1 on both nodes; node restarts before round 2 and finds the other partition's file
    in its folder: it trains on as a client that did not take part before, and says so."""
    grid, msg = after_round_1(algorithm, tiny_data, tmp_path)
    node = msg.metadata.dst_node_id
    mine, other = f"partition-{node - 1}", f"partition-{2 - node}"
    (path,) = (tmp_path / "state").glob(f"run-*/{mine}/{algorithm}.r1.pt")

    def restarted_reply():
        context = Context(run_id=1, node_id=node, node_config=grid.contexts[node].node_config,
                          state=RecordDict(), run_config={})
        reply = train_or_refuse(msg, context)
        assert not reply.has_error(), reply.error.reason
        return reply.content["metrics"][wire.CLIENT_STATE]

    assert restarted_reply() == StateSource.DISK  # its own file: read from disk
    shutil.copyfile(path.parent.parent / other / path.name, path)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert restarted_reply() == StateSource.NONE
    assert any(str(path) in r.getMessage() and f"client {other!r}, not {mine!r}" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
