"""An in-process `Grid`: messages go straight to the ClientApp's handler, one node at a time.

The server loop (`server_app/loop.py`) and the client handler (`client_app/app.py`) are the
very code Flower runs; only the transport differs. Fast for sweeps, and an oracle for tests.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import answer
from adaptfl.core import wire
from adaptfl.engine.contain import ClientExited, ClientTimedOut, contained
from adaptfl.privacy.release import detail_level
from adaptfl.server_app.loop import run_federated

log = logging.getLogger(__name__)
ClientHandler = Callable[[Message, Context], Message]
_SERVER_NODE_ID = 0


class InProcessGrid(Grid):
    """Nodes 1..N with partition-id 0..N-1; each keeps its own `context.state`. Each client
    call is contained (engine/contain.py): a call past the round's timeout is interrupted and
    its node recorded as missing; a `sys.exit` becomes that node's error reply."""

    static_nodes = True  # the nodes exist before round 1: the loop checks settings against them

    def __init__(self, num_nodes: int, run_config: dict[str, Any],
                 handler: ClientHandler = answer, run_id: int = 1) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes={num_nodes} must be >= 1")
        self.handler = handler
        # under dp which node failed or was late is the server's alone (privacy/release.py)
        self.detail = detail_level(str(run_config.get("dp", "none")) != "none")
        self.contexts = {
            node: Context(run_id=run_id, node_id=node,
                          node_config={wire.NODE_PARTITION_ID: node - 1,
                                       wire.NODE_NUM_PARTITIONS: num_nodes},
                          state=RecordDict(), run_config=dict(run_config))
            for node in range(1, num_nodes + 1)
        }
        # Flower stamps instruction messages with the running task's identity.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, _SERVER_NODE_ID, 0
        self._pending: list[Message] = []

    def set_run(self, run: Any) -> None:  # the in-process engine has a single run
        return None

    @property
    def run(self) -> Any:
        raise NotImplementedError("the in-process engine has no Flower Run object")

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def node_configs(self) -> list[dict[str, Any]]:
        """Every node's node config (for the checks before round 1)."""
        return [dict(c.node_config) for c in self.contexts.values()]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self._pending.extend(messages)
        return [str(i) for i in range(len(self._pending))]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        pending, self._pending = self._pending, []
        return [reply for reply in map(self._deliver, pending) if reply is not None]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Nodes run one after another here, but in parallel in Flower: each node gets the whole
        `timeout`; a node past it gets no reply, as Flower drops a late one."""
        replies = []
        for msg in messages:
            started = time.perf_counter()
            msg.metadata.created_at = time.time()  # sent now: nodes run one after another here
            try:
                reply = self._deliver(msg, timeout)
            except ClientTimedOut:
                log.log(self.detail, "node %d interrupted after %.1f s > timeout %.1f s: no reply",
                            msg.metadata.dst_node_id, time.perf_counter() - started, timeout)
                continue
            took = time.perf_counter() - started
            if reply is None:  # sent in another node's name: Flower's SuperLink refuses it
                continue
            if timeout is not None and took > timeout:  # not interruptible here (not the main thread)
                log.log(self.detail, "node %d replied after %.1f s > timeout %.1f s: dropped",
                            msg.metadata.dst_node_id, took, timeout)
                continue
            replies.append(reply)
        return replies

    def _deliver(self, msg: Message, timeout: float | None = None) -> Message | None:
        """The node's reply; None for one that claims another sender: Flower's SuperLink takes a
        reply only from the node it authenticated, so a forged one never reaches the server
        there, and must not here either (a forged reply once cost the victim its own;
        docs/threat-model.md, "Hostile clients")."""
        node = msg.metadata.dst_node_id
        try:
            reply = contained(lambda: self.handler(msg, self.contexts[node]), timeout)
            if reply.metadata.src_node_id != node:
                log.warning("node %d sent a reply as node %d: dropped, as Flower's SuperLink "
                            "refuses it", node, reply.metadata.src_node_id)
                return None
            return reply
        except ClientExited as exited:  # Flower reports a ClientApp process that exits so, too
            log.log(self.detail, "client on node %d exited: %s", node, exited)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(exited)),
                           reply_to=msg)
        except Exception as err:  # noqa: BLE001 - Flower turns a raising ClientApp into this
            log.log(self.detail, "client on node %d raised: %s", node, err)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                 reason=traceback.format_exc()), reply_to=msg)


def run_inprocess(cfg: RunConfig, num_nodes: int, on_round: Callable[[dict[str, Any]], None] | None = None
                  ) -> Path:
    """One federated run with `num_nodes` clients in this process; returns its results dir."""
    return run_federated(InProcessGrid(num_nodes, cfg.to_flower()), cfg, on_round=on_round)
