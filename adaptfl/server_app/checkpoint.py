"""Checkpoint after every round, and resume from the last complete one.

A run's results directory is its checkpoint: `metrics.jsonl` gets the round's row first, then
`state.pt` (the whole `ServerState`: model, Δ_G, v̄, sampling RNG, round) is replaced
atomically. A crash between the two leaves a row newer than the state, which resume drops, so
the state file alone says which round is complete. Under dp `server-confidential.jsonl` gets the
whole row (metrics.jsonl its released part, privacy/release.py), and resume reads it there.
`config.json` tells whether the checkpoint belongs to the same job.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.lr_schedule import SCHEDULES
from adaptfl.core.durable import write_atomic
from adaptfl.privacy.release import CONFIDENTIAL_FILE
from adaptfl.strategies.state import ServerState

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"

# Keys that may differ between the interrupted run and its continuation: where and how it
# runs, not what it computes. Anything else (the lr schedule depends on num-server-rounds,
# sampling on fraction-train, ...) would silently make a different run.
ROUNDS_KEY = "num-server-rounds"  # may be raised on resume: the run continues (_more_rounds)
MAY_CHANGE_ON_RESUME = frozenset({
    "resume", "resume-from", "results-dir", "run-name", "data-dir", "device", "num-threads",
    "round-timeout", "min-replies", "max-reply-mb", "node-wait", "max-skipped-rounds", "skip-window",
    "overwrite", "mlflow",  # mlflow: turned on by a resume, its store gets the kept rows too
    "partition-map",  # how an operator resolves a quarantined partition id (strategies/ownership.py)
})


@dataclass
class Checkpoint:
    state: ServerState
    rows: list[dict[str, Any]]  # the metrics rows of rounds 1..state.server_round
    source: Path


def save_checkpoint(run_dir: Path, state: ServerState) -> None:
    """Atomic (write, fsync, rename, fsync the folder): a kill or a power cut at any moment
    leaves the previous round's state or this one. Mode 0600: the state names participation
    (each partition's owner and first round, the sampling RNG), the server's alone
    (docs/privacy.md, "What a dp run releases")."""
    write_atomic(run_dir / STATE_FILE, state.to_bytes(), mode=0o600)


def new_run_key() -> str:
    return uuid.uuid4().hex


def continues_same_job(source: Path | None, run_dir: Path) -> bool:
    """Whether a resumed run writes where its checkpoint came from (resume=true, or resume-from
    naming this very run's dir): only then does it keep the job's run key, and with it the
    clients' durable state. A job started elsewhere from a copy of a checkpoint is a fork: its
    clients start without state, so two continuations never share (and overwrite) one state."""
    return source is not None and source.resolve() == run_dir.resolve()


RUN_FILES = (STATE_FILE, METRICS_FILE, "model.pt")


def refuse_reuse(cfg: RunConfig, run_dir: Path, may_resume: bool = True, check_only: bool = False
                 ) -> None:
    """A run into a dir that holds another run (or this one, not resumed): refused, unless
    overwrite=true, or resume=true where nothing was checkpointed yet (start at round 1); then
    the old run's state and model go first, so nothing of it can pass for this run's.
    `may_resume` is False when the checkpoint comes from elsewhere (resume-from); `check_only`
    refuses but removes nothing (the check before Flower starts)."""
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if not held:
        return
    if not (cfg.output.overwrite or (may_resume and cfg.output.resume)):
        if held == [METRICS_FILE]:  # no checkpoint, no final model: nothing to resume
            raise ValueError(f"{run_dir} holds a run that completed no round ({', '.join(held)}): "
                             "set overwrite=true to replace it, or choose another run-name")
        raise ValueError(f"{run_dir} holds a run already ({', '.join(held)}): set resume=true to "
                         "continue it, overwrite=true to replace it, or choose another run-name")
    if check_only:
        return
    for name in (STATE_FILE, "model.pt"):
        (run_dir / name).unlink(missing_ok=True)


def resume_source(cfg: RunConfig, run_dir: Path | None) -> Path | None:
    """The results directory to continue from, or None for a fresh run."""
    if cfg.output.resume_from:
        source = Path(cfg.output.resume_from).expanduser()
        if not source.is_absolute():
            raise ValueError(f"resume-from={cfg.output.resume_from!r} must be an absolute path: the "
                             "ServerApp runs in the SuperLink's working directory")
        if not (source / STATE_FILE).is_file():
            raise ValueError(f"resume-from={cfg.output.resume_from!r} holds no {STATE_FILE} checkpoint")
        return source
    if not cfg.output.resume:
        return None
    if run_dir is None or not cfg.output.run_name:
        raise ValueError("resume=true needs run-name (the run to continue) or resume-from")
    if not run_dir.is_dir():  # a misspelt run-name must not start a fresh run
        import difflib

        root = run_dir.parent
        names = sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
        close = difflib.get_close_matches(run_dir.name, names, n=3)
        hint = f"did you mean {' or '.join(map(repr, close))}?" if close else "no run of a similar name there"
        raise ValueError(f"resume=true: run-name={cfg.output.run_name!r} has no run in {run_dir.parent} "
                         f"({hint}); resume needs the name of an earlier run")
    if not (run_dir / STATE_FILE).is_file():
        log.warning("resume=true but %s has no checkpoint yet: starting at round 1", run_dir)
        return None
    return run_dir


def check_same_job(cfg: RunConfig, source: Path) -> None:
    """A resume whose run config differs from the checkpoint's (beyond what may change) is
    another job: refused."""
    current = cfg.to_flower()
    # a key added to adaptfl after the checkpoint was written: its default then, as now
    defaults = RunConfig.of(algorithm=cfg.algorithm.name).to_flower()
    saved = {**defaults, **json.loads((source / CONFIG_FILE).read_text())}
    continued = _more_rounds(saved, current)
    differ = sorted(k for k in set(saved) | set(current) if k not in MAY_CHANGE_ON_RESUME
                    and saved.get(k) != current.get(k) and not (continued and k == ROUNDS_KEY))
    if differ:
        changes = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in differ)
        raise ValueError(f"cannot resume {source}: run config differs ({changes})")


def _more_rounds(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether this resume continues the run for more rounds than it planned (a finished one
    too): allowed, the lr schedule recomputed over the new total, said once."""
    before, after = saved.get(ROUNDS_KEY), current.get(ROUNDS_KEY)
    if not (isinstance(before, int) and isinstance(after, int) and after > before):
        return False
    if SCHEDULES[str(current.get("lr-schedule", "cosine"))].needs_rounds:
        log.warning("continuing for %d rounds instead of %d: lr-schedule=%r is recomputed over "
                    "%d rounds, so the next round's lr is that schedule's at its round, not "
                    "where the %d-round schedule ended (the schedules by round, such as 'constant' or "
                    "'step', keep theirs)",
                    after, before, current.get("lr-schedule"), after, before)
    return True


def _rows_up_to(path: Path, last_round: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by the kill
            continue
        if row.get("round", 0) <= last_round:
            rows.append(row)
    return rows


def load_checkpoint(cfg: RunConfig, source: Path) -> Checkpoint:
    """The state and metrics of the last complete round; refuses another job's checkpoint."""
    check_same_job(cfg, source)
    state = ServerState.load(source / STATE_FILE)
    if state.server_round >= cfg.federation.num_server_rounds:
        log.warning("checkpoint %s is already at round %d of %d: nothing left to run",
                    source, state.server_round, cfg.federation.num_server_rounds)
    # under dp metrics.jsonl holds only the released keys: the whole rows are the confidential
    # file's (a dp run from before it existed has them in metrics.jsonl)
    whole = source / CONFIDENTIAL_FILE
    rows = _rows_up_to(whole if cfg.privacy.on and whole.is_file() else source / METRICS_FILE,
                       state.server_round)
    log.info("resuming from %s after round %d", source, state.server_round)
    return Checkpoint(state=state, rows=rows, source=source)
