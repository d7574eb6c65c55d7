"""The Flower ServerApp: the run config becomes typed components here, once."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from adaptfl.algorithms.config import RunConfig
from adaptfl.server_app.abort import RunAborted
from adaptfl.server_app.loop import run_federated

app = ServerApp()
log = logging.getLogger("adaptfl")


def _log_to_stderr() -> None:
    """adaptfl's own lines, once: a handler on the `adaptfl` logger only (a root handler would
    repeat every one of Flower's lines, tracebacks included)."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise


def completed_line(run_dir: Path) -> str:
    """The run's last line when it completed: the final round's central test accuracy against the
    initial model's, and the results folder (its metrics.jsonl: under dp the released rows)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    last, first = rows[-1] if rows else {}, rows[0] if rows else {}
    accuracy = f"test-accuracy {last['test-accuracy']:.4f}" if "test-accuracy" in last else "no accuracy"
    start = f" (initial model {first['test-accuracy']:.4f})" \
        if first.get("round") == 0 and "test-accuracy" in first else ""
    return f"run completed: round {last.get('round', 0)}, {accuracy}{start}; results: {run_dir}"


def failed_line(err: BaseException) -> str:
    """The run's last line when it did not complete: what kind of end, and why, in one line
    (adaptfl.flwr_run turns the kind into its exit code: core/exit_codes.py)."""
    kind = "refused" if isinstance(err, ValueError) else "aborted" if isinstance(err, RunAborted) \
        else "interrupted" if isinstance(err, KeyboardInterrupt) else f"error {type(err).__name__}"
    why = " ".join(str(err).split()) or type(err).__name__
    return f"run FAILED ({kind}): {why}"


@app.main()
def main(grid: Grid, context: Context) -> None:
    """adaptfl's ServerApp; its last line says how the run ended (`flwr run` exits 0 either way)."""
    _log_to_stderr()
    try:
        cfg = RunConfig.from_flower(context.run_config)  # a bad key or value stops the run here
        run_dir = run_federated(grid, cfg)
    except BaseException as err:  # one line, then Flower marks the run failed with the reason
        log.error("%s", failed_line(err))
        raise
    log.info("%s", completed_line(run_dir))
