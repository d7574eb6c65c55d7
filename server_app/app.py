"""The Flower ServerApp: the run config becomes a typed RunConfig here, once."""

from __future__ import annotations

import logging

from adaptfl.algorithms.config import RunConfig
from adaptfl.server_app.loop import run_federated
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    cfg = RunConfig.from_flower(context.run_config)  # a bad key or value stops the run here
    run_federated(grid, cfg)
