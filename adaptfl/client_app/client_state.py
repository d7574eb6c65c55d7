"""Durable per-client state: Flower's `context.state` first, a file on disk second.

`context.state` lives as long as the SuperNode process; a restarted SuperNode starts with an
empty one. So every save also goes to `<client-state-dir>/run-<run key>/<client>/<name>.r<round>.pt`
(written atomically, fsynced, folders 0700 and files 0600: MOON's file is a whole model; a held
broadcast record, which its digest checks, is written atomically without the fsync). The
partition id names the client on disk (a SuperNode without a registered key comes back from a
restart with a new node id but the same `--node-config "partition-id=…"`); a node on its own
data is named by its node id.

State is versioned by the round that wrote it, and round r loads the newest version written
before round r: a round that is re-run after a crash (the server resumed from its checkpoint)
starts from the same client state as the first time. The last two versions are kept.

Each file names its owner: the run key, the client (its folder's name) and the round
(state_owner.py); a file whose owner is not this store's (another partition's copied or linked
in, another job's) or that names none is refused as a damaged one is.

If no copy exists, or a file is unreadable, not this client's or holds the wrong keys or
shapes, the caller gets None and behaves as a client that did not take part before (HaFedHo:
"did not take part last round"; SCAFFOLD, FedDyn: zero variates), and reports where its state came from in the
`client-state` metric (0 none, 1 memory, 2 disk). The run key comes from the server's state
(new per job, kept across a resume, when Flower's run id changes); without one, Flower's run id
is used. In round 1 stored state is ignored.

With `client-state-memory=false` nothing goes to `context.state` (and versions left there are
removed): in simulation every node's context lives in the server's process, so the memory copy
grows with the clients that ever took part (docs/scale.md), while the disk copy does not.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import tempfile
from collections.abc import Mapping
from enum import IntEnum
from pathlib import Path
from typing import cast

import torch
from flwr.app import ArrayRecord, Context, RecordDict

from adaptfl.client_app.state_owner import Owner, bind, unbind
from adaptfl.codec.versions import HELD
from adaptfl.core import wire

log = logging.getLogger(__name__)
Tensors = dict[str, torch.Tensor]
KEEP = 2  # versions kept per name


class StateSource(IntEnum):
    NONE = 0  # first participation, or the state was lost
    MEMORY = 1  # Flower's context.state
    DISK = 2  # restored from the file after a SuperNode restart


def default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / "adaptfl-client-state"


def _why_unusable(tensors: object, expect: Mapping[str, tuple[int, ...]] | None) -> str | None:
    """Why a loaded state cannot be used, or None: not a dict of tensors, other keys or shapes
    than this model's, or non-finite values (which would make every reply of this client NaN)."""
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        return "not a dict of tensors"
    if expect is not None:
        if set(tensors) != set(expect):
            return f"keys {sorted(tensors)[:3]}…, expected {sorted(expect)[:3]}…"
        wrong = [k for k, s in expect.items() if tuple(tensors[k].shape) != tuple(s)]
        if wrong:
            first = wrong[0]
            return f"{first} has shape {tuple(tensors[first].shape)}, expected {tuple(expect[first])}"
    if any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors.values()):
        return "non-finite values"
    return None


def make_private_dirs(folder: Path, levels: int) -> None:
    """Create `folder` and its parents; the last `levels` folders (ours alone) are made or set
    0700, and each must belong to this user: a folder someone else planted (the default root is
    in the shared temp dir) could swap our state files for crafted ones."""
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    for path in [folder.parents[i] for i in range(levels - 2, -1, -1)] + [folder]:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
        if path.is_symlink() or info.st_uid != os.getuid():
            raise ValueError(f"client state folder {path} is a link or belongs to another user; "
                             "refusing to keep state there (set client-state-dir)")
        os.chmod(path, 0o700)


class ClientStateStore:
    """Load and save named tensor dicts for one client in one run."""

    durable = True  # a save is found by a later round's load (codec/versions.py relies on it)

    def __init__(self, context: Context, directory: str, server_round: int,
                 run_key: str = "", in_memory: bool = True) -> None:
        if run_key and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_key):
            raise ValueError(f"run key {run_key!r} is not a plain name; refusing it as a path")
        self.context = context
        self.server_round = server_round
        self.in_memory = in_memory
        partition = context.node_config.get(wire.NODE_PARTITION_ID)
        who = f"partition-{int(partition)}" if partition is not None else f"node-{context.node_id}"
        root = Path(directory) if directory else default_state_dir()
        self.run, self.who = str(run_key or context.run_id), who
        self.dir = root / f"run-{self.run}" / who

    def _owner(self, version: int) -> Owner:
        return Owner(self.run, self.who, version)

    # --- memory: one record per (name, round) ------------------------------------------------
    def _memory(self, name: str) -> dict[int, str]:
        """{round: context.state key} of the versions of `name` held in memory."""
        prefix = f"adaptfl-{name}.r"
        return {int(k[len(prefix):]): k for k in self.context.state.array_records
                if k.startswith(prefix) and k[len(prefix):].isdigit()}

    def _disk(self, name: str) -> dict[int, Path]:
        if not self.dir.is_dir():
            return {}
        found = {}
        for path in self.dir.glob(f"{name}.r*.pt"):
            version = path.name[len(name) + 2:-3]
            if version.isdigit():
                found[int(version)] = path
        return found

    def load(self, name: str, expect: Mapping[str, tuple[int, ...]] | None = None
             ) -> tuple[Tensors | None, StateSource]:
        """The newest version written before this round, checked against `expect` (keys and
        shapes); a missing, unreadable or mis-shaped one counts as lost."""
        if self.server_round <= 1:
            return None, StateSource.NONE
        memory = {r: k for r, k in self._memory(name).items() if r < self.server_round}
        why: str | None  # None: usable
        if memory:
            try:
                tensors = dict(self.context.state.array_records[memory[max(memory)]].to_torch_state_dict())
            except Exception as err:  # noqa: BLE001 - an undecodable record is lost state
                tensors, why = {}, f"undecodable ({err})"
            else:
                why = _why_unusable(tensors, expect)
            if why is None:
                return tensors, StateSource.MEMORY
            log.warning("client state %s in memory unusable (%s): trying the disk", name, why)
        disk = {r: p for r, p in self._disk(name).items() if r < self.server_round}
        if disk:
            path = disk[max(disk)]
            try:
                loaded = torch.load(path, weights_only=True)
            except Exception as err:  # noqa: BLE001 - a truncated or foreign file is lost state
                log.warning("client state %s unreadable (%s): starting without it", path, err)
                return None, StateSource.NONE
            owned, not_ours = unbind(loaded, self._owner(max(disk)))  # another client's is not ours
            problem = not_ours or _why_unusable(owned, expect)
            if problem is None:
                return cast(Tensors, owned), StateSource.DISK
            log.warning("client state %s unusable (%s): starting without it", path, problem)
        return None, StateSource.NONE

    def save(self, name: str, tensors: Tensors) -> None:
        cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        if self.in_memory:
            self.context.state[f"adaptfl-{name}.r{self.server_round}"] = ArrayRecord(cpu)
        held = self._memory(name)
        for old in sorted(held)[:-KEEP] if self.in_memory else sorted(held):
            del self.context.state[held[old]]
        make_private_dirs(self.dir, levels=2)  # run-<key>/<client>: this user's only
        path = self.dir / f"{name}.r{self.server_round}.pt"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # A held broadcast record is not synced to disk: a copy lost or torn by a power cut fails
        # its version's digest, the node says so and is sent the record whole (codec/versions.py);
        # two fsyncs cost ~10 ms of every message's ~100 (docs/scale.md).
        sync = not name.startswith(HELD)
        with os.fdopen(fd, "wb") as fh:
            torch.save(bind(cpu, self._owner(self.server_round)), fh)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)  # a crash mid-write leaves the previous versions intact
        if sync:
            dir_fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename itself survives a power cut
            finally:
                os.close(dir_fd)
        for old in sorted(self._disk(name))[:-KEEP]:
            self._disk(name)[old].unlink(missing_ok=True)


class MemoryStore:
    """No durable state: every load finds nothing (a preflight run, or a ClientApp without a
    Flower context). Saves are kept in memory only."""

    durable = False  # nothing saved here is found again: the node holds no broadcast record

    def __init__(self) -> None:
        self.saved: dict[str, Tensors] = {}

    def load(self, name: str, expect: Mapping[str, tuple[int, ...]] | None = None
             ) -> tuple[Tensors | None, StateSource]:
        return None, StateSource.NONE

    def save(self, name: str, tensors: Tensors) -> None:
        self.saved[name] = tensors


def context_bytes(state: RecordDict) -> dict[str, int]:
    """{key: bytes} of what a node keeps in Flower's `context.state`, pickled as Ray carries a
    context to the actor and back with every message in simulation, where every node's context
    also lives in the server's process (docs/scale.md: the figure per algorithm)."""
    return {key: len(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
            for key, record in state.items()}
