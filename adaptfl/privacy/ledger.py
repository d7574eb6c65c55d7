"""`dp-ledger`: one JSON-lines file of privacy events that every run naming it appends to, so ε
covers all the runs on one data set, not each run alone (docs/privacy.md, "A ledger across runs").

    one line per released round   {"z", "n", "N", "delta", "accounting", "run", "run-key", "round"}
    appended                      under an exclusive flock, as one O_APPEND write: runs in
                                  parallel (harness --jobs 2) share the file
    a resumed run                 keyed by (run-key, round): a round already there is not
                                  appended again (run-key is the job's, kept by resume)
    refused (ValueError)          a line that does not parse (file and line named), and lines
                                  of another δ than this run's (one total, at one δ)
    mixed modes                   lines of either dp-accounting compose: each event's RDP curve
                                  under its own bound, summed at the same orders

Where: `dp-ledger` when set (an absolute path: the operator pointing elsewhere on purpose),
else one per-user place keyed by the data a run spends: <ledger dir>/<task>-<fingerprint>.jsonl,
the fingerprint a SHA-256 of the task and its training labels (`data_key`), the ledger dir
$ADAPTFL_LEDGER_DIR, else $XDG_DATA_HOME/adaptfl/ledgers, else ~/.local/share/adaptfl/ledgers.
So every dp run on the same data composes, whatever its results dir. dp-target-epsilon applies
to the run's own ε, not the ledger's. Runs inside `apart(AUDITS)` (the one-run audit's) book
in <ledger dir>/audits/ instead: their own ledgers, which the data's never reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import torch

from adaptfl.core.privacy_settings import ACCOUNTING, Privacy
from adaptfl.privacy.accountant import Event, epsilon_mixed

KEYS = ("z", "n", "N", "delta", "accounting", "run", "run-key", "round")


LEDGER_DIR_ENV = "ADAPTFL_LEDGER_DIR"
# The one-run audit's runs book here (privacy.md, "A ledger across runs"): they test the
# mechanism, at noise chosen to be caught, and release nothing to the data's readers, so they
# must neither spend nor jam the budget every later run on the data is checked against.
AUDITS = "audits"
_apart: list[str] = []  # the sub-folder every default ledger is in while `apart` holds


def ledger_dir() -> Path:
    """The per-user place of the data-keyed ledgers (the server's and each node's)."""
    if os.environ.get(LEDGER_DIR_ENV):
        base = Path(os.environ[LEDGER_DIR_ENV]).expanduser()
    else:
        data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        base = Path(data_home) / "adaptfl" / "ledgers"
    return base.joinpath(*_apart[-1:])


@contextlib.contextmanager
def apart(folder: str) -> Iterator[Path]:
    """Inside, every default ledger (the data's; each in-process node's, privacy/node_ledger.py)
    is in <ledger dir>/<folder>/: runs there compose with each other, never with the data's.
    A ledger named on purpose (dp-ledger, dp-node-ledger) stays where it is named."""
    _apart.append(folder)
    try:
        yield ledger_dir()
    finally:
        _apart.pop()


def data_key(task: str, labels: torch.Tensor) -> str:
    """<task>-<16 hex digits>: what identifies the data a run spends, the task and its training
    rows' labels (their count and values), not where it lives. The partitioning is left out on
    purpose: runs that split the same rows otherwise still spend the same people's data, so they
    share one ledger (over-counting, never under-counting)."""
    digest = hashlib.sha256(task.encode())
    digest.update(labels.detach().cpu().contiguous().numpy().tobytes())
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in task.split(":")[-1])[:40]
    return f"{name}-{digest.hexdigest()[:16]}"


def path_of(privacy: Privacy, key: str = "") -> Path | None:
    """The run's ledger: dp-ledger when set, else the per-user ledger of its data (`key`); None
    without dp, or with no data key known (a strategy outside adaptfl's loop)."""
    if not privacy.on:
        return None
    if privacy.dp_ledger:
        return Path(privacy.dp_ledger).expanduser()
    return ledger_dir() / f"{key}.jsonl" if key else None


def read(path: Path) -> list[dict[str, Any]]:
    """Every entry of the ledger ([] when it does not exist yet), under a shared lock."""
    try:
        with path.open() as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)
            return _entries(path, fh.read())
    except FileNotFoundError:
        return []


def _entries(path: Path, text: str) -> list[dict[str, Any]]:
    return [_parse(path, number, line) for number, line in enumerate(text.splitlines(), 1)
            if line.strip()]


def _parse(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        entry = json.loads(line)
        ok = isinstance(entry, dict) and all(k in entry for k in KEYS) and \
            float(entry["z"]) > 0 and 1 <= int(entry["n"]) <= int(entry["N"]) and \
            0 < float(entry["delta"]) < 1 and entry["accounting"] in ACCOUNTING and int(entry["round"]) >= 1
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"dp-ledger {path} line {number}: not a privacy event (a JSON object with "
                         f"{', '.join(KEYS)}); repair or remove that line")
    return cast("dict[str, Any]", entry)


def check(path: Path, entries: Iterable[dict[str, Any]], delta: float, accounting: str) -> None:
    """Refuse entries of another δ: one total is reported at one δ. Entries of another
    accounting mode compose (each event's RDP curve under its own bound, `epsilon_mixed`), so
    a run in either mode (the one-run audit's are no-amplification) jams no later run."""
    for entry in entries:
        if float(entry["delta"]) != delta:
            raise ValueError(f"dp-ledger {path}: run {entry['run']!r} was accounted at dp-delta="
                             f"{float(entry['delta']):g}, this run at dp-delta={delta:g}; one ledger "
                             f"reports one δ: run at dp-delta={float(entry['delta']):g}, or name "
                             "another dp-ledger (it counts only the runs that name it, not these); "
                             "a one-run audit's lines, booked here before audits booked apart, "
                             f"belong in {path.parent / AUDITS / path.name}: move them there")


def events(entries: Iterable[dict[str, Any]]) -> list[tuple[Event, str]]:
    """Each entry's event with the bound it was accounted under."""
    return [((float(e["z"]), int(e["n"]), int(e["N"])), str(e["accounting"])) for e in entries]


def check_privacy_ledger(privacy: Privacy, key: str = "") -> None:
    """What a round refuses before anything is sent: a bad line, another δ or mode."""
    path = path_of(privacy, key)
    if path is not None:
        check(path, read(path), privacy.dp_delta, privacy.dp_accounting)


def record(privacy: Privacy, event: Event, run: str, run_key: str, server_round: int, key: str = "") -> float:
    """Append the round's event (unless this run's round is there already: a resume); ε over
    the whole ledger with it."""
    path = path_of(privacy, key)
    assert path is not None
    entry = {"z": event[0], "n": event[1], "N": event[2], "delta": privacy.dp_delta,
             "accounting": privacy.dp_accounting, "run": run, "run-key": run_key,
             "round": server_round}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # read and append as one step
        # flock is per open file: a second descriptor's shared lock would wait on this one
        entries = _entries(path, path.read_text())
        check(path, entries, privacy.dp_delta, privacy.dp_accounting)
        others = [e for e in entries if (e["run-key"], int(e["round"])) != (run_key, server_round)]
        if len(others) == len(entries):
            os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)  # releases the lock
    return epsilon_mixed([*events(others), (event, privacy.dp_accounting)], privacy.dp_delta)


def total_epsilon(path: Path) -> tuple[float, int, int] | None:
    """(ε over every event, runs, events) of a ledger, None when it has none (the harness)."""
    entries = read(path)
    if not entries:
        return None
    delta, accounting = float(entries[0]["delta"]), entries[0]["accounting"]
    check(path, entries, delta, accounting)
    runs = len({e["run-key"] for e in entries})
    return epsilon_mixed(events(entries), delta), runs, len(entries)
