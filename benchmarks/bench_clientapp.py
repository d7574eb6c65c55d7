"""One ClientApp call: adaptfl's (FedAvg, plain SGD) against Flower's FedAvg app's
(benchmarks/flower_fedavg), in one process, one torch thread, each message to a node the process
has not met yet (as in a round of 100 of 1,000 in Flower's simulation), the two apps in turn.

    python benchmarks/bench_clientapp.py [--nodes 1000] [--messages 40] [--steps 2] [--profile]

What Flower's simulation adds around a call (Ray, the context's round trip) is the same for both
apps and is measured by bench_scale.py --probe; this is the ClientApp's own share. --profile
prints cProfile's top functions of adaptfl's calls.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks" / "flower_fedavg")]
from fedavg_baseline.client_app import app as flower_app  # noqa: E402

from adaptfl.algorithms.config import RunConfig  # noqa: E402
from adaptfl.client_app.app import app as adaptfl_app  # noqa: E402
from adaptfl.core import wire  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.server_app.loop import build_run  # noqa: E402


def context(node: int, nodes: int, run_config: dict) -> Context:
    return Context(run_id=1, node_id=node, state=RecordDict(), run_config=run_config,
                   node_config={wire.NODE_PARTITION_ID: node - 1, wire.NODE_NUM_PARTITIONS: nodes})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-clientapp-"))
    cfg = RunConfig.of(algorithm="fedavg", model="cnn", local_steps=args.steps, batch_size=32, lr=0.1,
                       lr_schedule="constant", num_threads=1, diagnostics_every=0, dirichlet_alpha=0.3,
                       fraction_train=min(1.0, (args.messages + 3) / args.nodes), results_dir=str(work),
                       run_name="b", client_state_dir=str(work / "state"), max_contribution_ratio=0.0,
                       screen_ratio=0.0, accept_small_rounds=True)
    grid = InProcessGrid(args.nodes, cfg.to_flower())
    strategy = build_run(cfg)[0]
    ours = list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid))
    theirs_config = {"task": "fashion-mnist", "data-dir": "", "model": "cnn", "lr": 0.1,
                     "local-steps": args.steps, "batch-size": 32, "dirichlet-alpha": 0.3, "seed": 42}
    seconds: dict[str, list[float]] = {"adaptfl": [], "flower": []}
    profile = cProfile.Profile() if args.profile else None
    for i, msg in enumerate(ours):
        node = msg.metadata.dst_node_id
        theirs = Message(RecordDict({"arrays": ArrayRecord(strategy.state.model),
                                     "config": ConfigRecord({"server-round": 1})}),
                         dst_node_id=node, message_type="train")
        calls = [("adaptfl", adaptfl_app, msg, cfg.to_flower()),
                 ("flower", flower_app, theirs, theirs_config)]
        for name, app, message, run_config in calls if i % 2 else calls[::-1]:
            started = time.perf_counter()
            if profile is not None and name == "adaptfl" and i >= 3:
                profile.enable()
            reply = app(message, context(node, args.nodes, run_config))
            if profile is not None:
                profile.disable()
            if i >= 3:  # the first calls load the data and the split
                seconds[name].append(time.perf_counter() - started)
            assert not reply.has_error(), reply.error.reason
    a, f = statistics.median(seconds["adaptfl"]), statistics.median(seconds["flower"])
    print(f"ClientApp call, {len(seconds['adaptfl'])} messages each to new nodes of {args.nodes}, "
          f"K={args.steps}, cnn, 1 thread: adaptfl {1000 * a:.1f} ms, Flower's app {1000 * f:.1f} ms "
          f"(median), ratio {a / f:.2f}")
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(35)


if __name__ == "__main__":
    main()
