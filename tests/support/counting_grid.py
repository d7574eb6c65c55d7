"""An in-process federation that counts the messages its nodes receive, for tests that a run is
refused before anything is sent."""

from __future__ import annotations

from flwr.app import Context, Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import handle
from adaptfl.engine.inprocess import InProcessGrid


def counting_grid(nodes: int, cfg: RunConfig, static: bool) -> tuple[InProcessGrid, list[int]]:
    """(the grid, the node ids of the messages delivered so far); `static`: the nodes are known
    before round 1 (the engine), else found at round 1 (as under Flower)."""
    calls: list[int] = []

    def counted(msg: Message, context: Context) -> Message:
        calls.append(context.node_id)
        return handle(msg, context)

    grid = InProcessGrid(nodes, cfg.to_flower(), handler=counted)
    grid.static_nodes = static
    return grid, calls
