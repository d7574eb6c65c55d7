"""Timestamps of every message's path through Flower's simulation (benchmarks/bench_scale.py --probe).

With this folder first on PYTHONPATH and ADAPTFL_PROBE_DIR set, Python imports this module at the
start of every process `flwr run` starts (Python's `sitecustomize` hook). It changes nothing a run
computes; it only writes one line per event, as JSON, to ADAPTFL_PROBE_DIR/<pid>.jsonl:

- in `flwr-simulation` (the ServerApp and Flower's simulation engine): each message's
  `RayBackend.process_message` (submit to Ray, the actor's work, the reply and context back),
  with the message's and the node's context's pickled sizes for the first messages, and the
  node context's retrieval and update around it;
- in `flwr-simulation` too, the ServerApp's own steps of a round, the same in both apps: the
  strategy's `configure_train` and `aggregate_train` (adaptfl's, and Flower's `FedAvg`) and the
  central evaluation (`adaptfl.server_app.evaluate.evaluate_all`, which both apps call);
- in a Ray actor (`default_worker.py`): each `ClientApp.__call__`, i.e. the app's own work. With
  ADAPTFL_PROBE_CPROFILE=1 the actor also keeps a cProfile of its calls (actor-<pid>.prof).

Both clocks are `time.time()` of the same machine, so a message's dispatch (simulation's submit to
the actor's call) and return (the call's end to the simulation holding the reply) are differences.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

OUT = os.environ.get("ADAPTFL_PROBE_DIR", "")
SIZED = 20  # messages whose pickled sizes are taken (outside the timed window), per process
_lock = threading.Lock()


def _write(event: dict[str, Any]) -> None:
    line = json.dumps(event) + "\n"
    with _lock, open(os.path.join(OUT, f"{os.getpid()}.jsonl"), "a") as out:
        out.write(line)


def _key(message: Any) -> dict[str, Any]:
    meta = message.metadata
    return {"node": int(meta.dst_node_id), "group": str(meta.group_id), "type": str(meta.message_type)}


def _probe_simulation() -> None:
    import pickle

    from flwr.compat.client.run_info_store import DeprecatedRunInfoStore
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    process, sized = RayBackend.process_message, [0]

    def process_message(self: Any, message: Any, context: Any) -> Any:
        sizes = {}
        if sized[0] < SIZED:
            sized[0] += 1
            sizes = {"message-bytes": len(pickle.dumps(message)), "context-bytes": len(pickle.dumps(context))}
        started = time.time()
        reply = process(self, message, context)
        _write({"at": "sim", **_key(message), "t0": started, "t1": time.time(), **sizes})
        return reply

    def timed(name: str, method: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.time()
            out = method(self, *args, **kwargs)
            _write({"at": name, "t0": started, "t1": time.time()})
            return out
        return call

    RayBackend.process_message = process_message  # type: ignore[method-assign]
    _probe_server_steps(timed)
    DeprecatedRunInfoStore.retrieve_context = timed(  # type: ignore[method-assign]
        "context-get", DeprecatedRunInfoStore.retrieve_context)
    DeprecatedRunInfoStore.update_context = timed(  # type: ignore[method-assign]
        "context-put", DeprecatedRunInfoStore.update_context)


def _probe_server_steps(timed: Any) -> None:
    """configure, aggregate and evaluate, wrapped before either app imports them by name."""
    import torch
    from flwr.serverapp.strategy import FedAvg

    from adaptfl.server_app import evaluate
    from adaptfl.strategies.aggregation import RoundAggregation
    from adaptfl.strategies.broadcast import RoundBroadcast

    for cls in (FedAvg, RoundAggregation):
        cls.aggregate_train = timed("aggregate", cls.aggregate_train)  # type: ignore[method-assign]
    for cls in (FedAvg, RoundBroadcast):
        configure = cls.configure_train
        cls.configure_train = timed(  # type: ignore[method-assign]
            "configure", lambda self, *a, _c=configure, **k: list(_c(self, *a, **k)))
    scores = evaluate.evaluate_all

    def evaluate_all(*args: Any, **kwargs: Any) -> Any:  # with the torch threads it ran on
        started = time.time()
        out = scores(*args, **kwargs)
        _write({"at": "evaluate", "t0": started, "t1": time.time(), "threads": torch.get_num_threads()})
        return out

    evaluate.evaluate_all = evaluate_all


def _probe_actor() -> None:
    from flwr.clientapp.client_app import ClientApp

    call = ClientApp.__call__
    profile = None
    if os.environ.get("ADAPTFL_PROBE_CPROFILE") == "1":
        import cProfile
        profile = cProfile.Profile()

    def timed_call(self: Any, message: Any, context: Any) -> Any:
        started = time.time()
        if profile is not None:
            profile.enable()
        try:
            return call(self, message, context)
        finally:
            ended = time.time()
            if profile is not None:
                profile.disable()
                profile.dump_stats(os.path.join(OUT, f"actor-{os.getpid()}.prof"))
            _write({"at": "app", **_key(message), "t0": started, "t1": ended})

    ClientApp.__call__ = timed_call  # type: ignore[method-assign]


if OUT:
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    if program == "flwr-simulation":
        _probe_simulation()
    elif program == "default_worker.py":
        _probe_actor()
