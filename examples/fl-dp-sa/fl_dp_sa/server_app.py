"""The ServerApp: Flower's FedAvg, wrapped in DifferentialPrivacyClientSideFixedClipping and run
by SecAggPlusWorkflow, as adaptfl's run config. Flower's five keys keep their names and values
(pyproject.toml); `adaptfl_keys` says each in adaptfl's terms, and adaptfl's server loop runs it
(README: the side by side).
"""

from __future__ import annotations

from dataclasses import replace

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from adaptfl.server_app.app import main as adaptfl_main

app = ServerApp()

FLOWER_KEYS = ("noise-multiplier", "clipping-norm", "num-sampled-clients", "num-shares",
               "reconstruction-threshold")
Value = bool | float | int | str


def adaptfl_keys(run_config: dict[str, Value]) -> dict[str, Value]:
    """The run config with Flower's DP and SecAgg+ keys as adaptfl's."""
    keys = {k: v for k, v in run_config.items() if k not in FLOWER_KEYS}
    shares = int(run_config["num-shares"])
    keys.update({
        # DifferentialPrivacyClientSideFixedClipping: each node clips its update to C; the noise
        # of std z·C on the sum is here the nodes' own (each adds a 1/√n share before masking)
        "dp": "client",
        "dp-noise-multiplier": float(run_config["noise-multiplier"]),
        "dp-clip-norm": float(run_config["clipping-norm"]),
        # num_sampled_clients, the count Flower's noise is calibrated to: a round is released
        # only when that many noise shares are in the sum (and booked at them)
        "min-replies": int(run_config["num-sampled-clients"]),
        "weighting": "uniform",  # FedAvg's weights by num-examples: equal on IID partitions
        # SecAggPlusWorkflow(num_shares, reconstruction_threshold)
        "secagg": "secagg+",
        "secagg-shares": shares,
        "secagg-threshold": int(run_config["reconstruction-threshold"]) / shares,
    })
    return keys


@app.main()
def main(grid: Grid, context: Context) -> None:
    adaptfl_main(grid, replace(context, run_config=adaptfl_keys(context.run_config)))
