"""Durable per-client state: Flower's `context.state` first, a file on disk second.

`context.state` lives as long as the SuperNode process; a restarted SuperNode starts with an
empty one. So every save also goes to `<client-state-dir>/run-<run key>/partition-<id>/<name>.pt`
(written atomically). The partition id, not Flower's node id, names the client on disk: a
SuperNode without a registered key comes back from a restart with a new node id but is started
with the same `--node-config "partition-id=…"`.

If neither copy exists the caller gets None and behaves as a client that did not take part
before (HaFedHo: "did not take part last round"; SCAFFOLD, FedDyn: zero variates), and reports
where its state came from in the `client-state` metric (0 none, 1 memory, 2 disk).
The run key comes from the server's state (new per job, kept across a resume, when Flower's
run id changes); without one, Flower's run id is used. In round 1 stored state is ignored.
"""

from __future__ import annotations

import os
import re
import tempfile
from enum import IntEnum
from pathlib import Path

import torch
from adaptfl.algorithms import wire
from flwr.app import ArrayRecord, Context

Tensors = dict[str, torch.Tensor]


class StateSource(IntEnum):
    NONE = 0  # first participation, or the state was lost
    MEMORY = 1  # Flower's context.state
    DISK = 2  # restored from the file after a SuperNode restart


def default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / "adaptfl-client-state"


class ClientStateStore:
    """Load and save named tensor dicts for one client in one run."""

    def __init__(self, context: Context, directory: str, server_round: int,
                 run_key: str = "") -> None:
        if run_key and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_key):
            raise ValueError(f"run key {run_key!r} is not a plain name; refusing it as a path")
        self.context = context
        self.server_round = server_round
        partition = int(context.node_config[wire.NODE_PARTITION_ID])
        root = Path(directory) if directory else default_state_dir()
        self.dir = root / f"run-{run_key or context.run_id}" / f"partition-{partition}"

    def _key(self, name: str) -> str:
        return f"adaptfl-{name}"

    def load(self, name: str) -> tuple[Tensors | None, StateSource]:
        if self.server_round <= 1:
            return None, StateSource.NONE
        key = self._key(name)
        if key in self.context.state.array_records:
            return dict(self.context.state.array_records[key].to_torch_state_dict()), StateSource.MEMORY
        path = self.dir / f"{name}.pt"
        if path.exists():
            tensors = torch.load(path, weights_only=True)
            self.context.state[key] = ArrayRecord(tensors)
            return tensors, StateSource.DISK
        return None, StateSource.NONE

    def save(self, name: str, tensors: Tensors) -> None:
        cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        self.context.state[self._key(name)] = ArrayRecord(cpu)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{name}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(cpu, tmp)
        os.replace(tmp, path)  # a crash mid-write leaves the previous file intact
