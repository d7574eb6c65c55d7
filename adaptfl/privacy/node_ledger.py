"""A node's own ledger under dp='client': every training reply it releases, booked before it
trains, and refused when it was booked already or would pass the node's budget.

The server's ledger (privacy/ledger.py) counts what the server says it asked; this one counts
what the node gave, whatever the server says. Each release is one Gaussian mechanism of the
node's own noise multiplier (z/√n of the recipe, at least its floor: privacy/client.py) under
replace-one neighbours, with no credit for sampling (the node knows it was asked): the event
(z, 1, 1) at `no-amplification`, composed by the same RDP accountant (privacy/accountant.py).
That is the guarantee against a server that does not follow the protocol (docs/privacy.md, "A
node's own ledger").

    one line per release     {"run", "round", "stage", "z"}
    (run, round, stage) once a second request for a booked round is refused, whether it is a
                             replay, a second SecAgg+ round for it, or a resumed server re-running
                             it: the line is on disk before the node trains, so a restart keeps it
    budget                   a release that would take ε (at dp-node-delta) over the whole file
                             past dp-node-max-epsilon is refused, with both numbers
    where                    node config dp-node-ledger (a path), else the per-user ledger dir
                             (privacy/ledger.py `ledger_dir`) / node-<fingerprint of the node's
                             rows, `rows_key`>.jsonl: every run on the same rows shares it
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adaptfl.privacy.accountant import epsilon
from adaptfl.privacy.ledger import data_key, ledger_dir

KEYS = ("run", "round", "stage", "z")
ACCOUNTING = "no-amplification"  # the node knows it was sampled: no amplification to claim
MAX_EPSILON = "dp-node-max-epsilon"
DELTA = "dp-node-delta"
LEDGER = "dp-node-ledger"


@dataclass(frozen=True)
class Release:
    """One reply a node gives: which run, round and stage, at which noise multiplier."""

    run: str
    round: int
    stage: str
    z: float

    @property
    def key(self) -> tuple[str, int, str]:
        return self.run, self.round, self.stage


@dataclass(frozen=True)
class Budget:
    """The node owner's bound on its ledger (node config; defaults: privacy/client.py NODE_KEYS)."""

    max_epsilon: float
    delta: float


def rows_key(task: str, labels: torch.Tensor, rows: torch.Tensor) -> str:
    """The node's ledger name: its task and its rows (their numbers and labels), so two nodes
    on one machine (a simulation) never share a ledger, even where their labels coincide."""
    both = torch.cat([rows.to(torch.int64).flatten(), labels[rows].to(torch.int64).flatten()])
    return data_key(task, both)


def config_key(node_config: Mapping[str, Any]) -> str:
    """The ledger name of a node known by its node config alone (a ClientApp of one's own, whose
    rows adaptfl does not see): its keys but the dp-* ones, which set the budget, not the data."""
    named = json.dumps({k: str(v) for k, v in sorted(node_config.items()) if not k.startswith("dp-")})
    return "config-" + hashlib.sha256(named.encode()).hexdigest()[:16]


def ledger_path(node_config: Mapping[str, Any], data_key: str) -> Path:
    """dp-node-ledger when the node's owner sets it, else the per-user place keyed by its rows."""
    named = str(node_config.get(LEDGER, "") or "")
    if named:
        return Path(named).expanduser()
    return ledger_dir() / f"node-{data_key}.jsonl"


def _parse(path: Path, number: int, line: str) -> Release:
    try:
        entry = json.loads(line)
        release = Release(str(entry["run"]), int(entry["round"]), str(entry["stage"]), float(entry["z"]))
        ok = set(entry) == set(KEYS) and release.z > 0.0 and release.round >= 1
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise ValueError(f"refused by this node: its ledger {path} line {number} is not a release "
                         f"(a JSON object of {', '.join(KEYS)}); repair or remove that line")
    return release


def read(path: Path) -> list[Release]:
    """Every release booked in `path` ([] before the first)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [_parse(path, i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]


def spent(releases: list[Release], delta: float) -> float:
    """ε at δ of the releases composed (RDP: replays of one z add up in the curve)."""
    return epsilon([(r.z, 1, 1) for r in releases], delta, ACCOUNTING)


def refusal(booked: list[Release], release: Release, budget: Budget, path: Path) -> str | None:
    """Why `release` may not be given, or None."""
    if any(r.key == release.key for r in booked):
        return (f"round {release.round} of run {release.run!r} ({release.stage}) was answered "
                f"already; a node answers each round once (its ledger {path})")
    after = spent([*booked, release], budget.delta)
    if after > budget.max_epsilon:
        return (f"this reply would take its ledger to ε={after:.4g} at δ={budget.delta:g}, past its "
                f"{MAX_EPSILON}={budget.max_epsilon:g} ({len(booked)} releases booked in {path}); "
                f"ask for more noise, or the node's owner raises {MAX_EPSILON} (node config, or "
                "$ADAPTFL_NODE_CONFIG where none reaches the node) to accept more")
    return None


def book(path: Path, release: Release, budget: Budget) -> float:
    """Append `release` (ValueError, one line, when it is refused); ε of the ledger with it.
    Read and append run under one exclusive lock: two requests for one round at once book one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        booked = read(path)
        why = refusal(booked, release, budget, path)
        if why:
            raise ValueError(f"refused by this node: {why}")
        entry = {"run": release.run, "round": release.round, "stage": release.stage, "z": release.z}
        os.write(fd, (json.dumps(entry) + "\n").encode())
        os.fsync(fd)  # booked before the node trains: a crash after it cannot un-book it
    finally:
        os.close(fd)
    return spent([*booked, release], budget.delta)
