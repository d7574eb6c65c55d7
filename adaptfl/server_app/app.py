"""The Flower ServerApp: the run config becomes typed components here, once."""

from __future__ import annotations

import logging
import sys

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from adaptfl.algorithms.config import RunConfig
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


@app.main()
def main(grid: Grid, context: Context) -> None:
    _log_to_stderr()
    try:
        cfg = RunConfig.from_flower(context.run_config)  # a bad key or value stops the run here
        run_federated(grid, cfg)
    except ValueError as err:  # refused (before round 1, or a run that cannot go on): one line,
        log.error("run refused: %s", err)  # then Flower marks the run failed with the reason
        raise
