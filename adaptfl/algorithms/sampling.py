"""Which nodes a round samples, once enough of them are connected (fraction-train, min-replies,
node-wait); under dp from the OS CSPRNG (`secret_sample`), else from the seeded RNG of the state."""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable

from flwr.serverapp import Grid

from adaptfl.algorithms.settings import Federation

log = logging.getLogger(__name__)


def sample_size(fed: Federation, num_nodes: int) -> int:
    return max(1, round(fed.fraction_train * num_nodes))


def secret_sample(nodes: list[int], count: int) -> list[int]:
    """`count` of `nodes` uniformly without replacement, from the OS CSPRNG: under dp the
    accountant credits amplification by sampling, which holds only while the sample is secret;
    one drawn from the run's `seed` (in config.json) anyone could recompute."""
    return secrets.SystemRandom().sample(nodes, count)


def hostile_count(fraction: float, replies: int) -> int:
    """The hostile replies a round of `replies` must tolerate: ceil(fraction × replies) (a
    fraction of 0.2 of 7 is 2, not 1); the float slack keeps 0.2 × 5 at 1."""
    return math.ceil(fraction * replies - 1e-9) if fraction > 0 else 0


def fewest_replies(check: Callable[[int, int], None], fraction: float, most: int = 1000) -> int | None:
    """The smallest min-replies m that an aggregator's `check_federation(m, hostile)` accepts with
    hostile = hostile_count(fraction, m), the count it is checked with; None if none up to
    `most` (a fraction the rule cannot hold at any size). What a refusal suggests is this m,
    so the suggested setting is accepted as written."""
    for replies in range(1, most + 1):
        try:
            check(replies, hostile_count(fraction, replies))
        except ValueError:
            continue
        return replies
    return None


def nodes_needed(fed: Federation) -> int:
    """The fewest connected nodes whose sample can reach min-replies."""
    n = fed.min_replies
    while sample_size(fed, n) < fed.min_replies:
        n += 1
    return n


def wait_for_nodes(grid: Grid, fed: Federation) -> list[int]:
    """The connected nodes, once there are enough for min-replies (after fraction-train);
    raises NotEnoughNodes after node-wait seconds, naming what is missing."""
    needed = nodes_needed(fed)
    deadline = time.monotonic() + fed.node_wait
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < needed:
        if time.monotonic() >= deadline:
            raise NotEnoughNodes(
                f"{len(nodes)} nodes connected after node-wait={fed.node_wait:g} s; "
                f"min-replies={fed.min_replies} with fraction-train={fed.fraction_train:g} needs "
                f"{needed}: start more SuperNodes, or lower min-replies")
        log.info("waiting for nodes: %d connected, %d needed", len(nodes), needed)
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        nodes = sorted(grid.get_node_ids())
    return nodes


class NotEnoughNodes(RuntimeError):
    """Fewer nodes than min-replies needs stayed connected for node-wait seconds."""
