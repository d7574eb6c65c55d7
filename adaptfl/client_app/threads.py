"""How many torch threads a client uses: `num-threads`, or with 0 the CPUs the client has.

More threads than CPUs is slow on CPU, not merely useless: torch's workers wait for each other
at every kernel, and a descheduled one stalls the rest (on a loaded 2-core machine a round of
the in-process engine took 4-9 s with torch's default of 2 threads, 0.3-0.5 s with 1; docs/speed.md).
So the default (0) takes the CPUs the client was given:

    Flower's simulation     the CPUs Ray assigned to this ClientApp (client-resources-num-cpus)
    the in-process engine   this process's CPUs shared by its nodes: max(1, CPUs // num-nodes),
                            set once by `python -m adaptfl.engine` (engine/__main__.py)
    a deployed SuperNode    its process's CPUs (torch's own default)
"""

from __future__ import annotations

import math
import os
import sys


def process_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def ray_assigned_cpus() -> float | None:
    """The CPUs Ray assigned to this worker (a ClientApp in Flower's simulation), else None."""
    ray = sys.modules.get("ray")  # imported by the actor; never imported here for nothing
    if ray is None or not ray.is_initialized():
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        return None if cpus is None else float(cpus)
    except Exception:  # noqa: BLE001 - the driver process has no assigned resources
        return None


def client_threads(requested: int) -> int | None:
    """The thread count for this client: `requested` when set; with 0 Ray's assignment in a
    simulation; None (keep the process's setting) elsewhere."""
    if requested > 0:
        return requested
    assigned = ray_assigned_cpus()
    return None if assigned is None else max(1, math.floor(assigned))


def engine_threads(requested: int, num_nodes: int, cpus: int | None = None) -> int:
    """The in-process engine's thread count: `requested`, or its CPUs shared by its nodes."""
    if requested > 0:
        return requested
    return max(1, (cpus or process_cpus()) // max(1, num_nodes))
