"""Where a message's time goes under `flwr run`, from flwr_probe/sitecustomize.py's events.

`events(folder)` reads the probe's per-process lines; `breakdown(events, sampled)` joins each
training message's time in Flower's simulation process (`RayBackend.process_message`) with its
ClientApp call in the Ray actor, and returns medians in milliseconds:

- `message-ms`: the simulation's submit to holding the reply and context;
- `app-ms`: the ClientApp's own call (`ClientApp.__call__` in the actor);
- `dispatch-ms`: submit to the call's start (Ray: task, message and context to the actor);
- `return-ms`: the call's end to the reply and context back in the simulation process;
- `context-get-ms`, `context-put-ms`: the node's context out of and back into Flower's store;
- `message-kb`, `context-kb`: pickled sizes (the first messages);
- `round-s`: a round on the probe's clock, a round's first submit to the next one's, the same for
  both apps; `clients-s`: a round's first submit to its last reply; `server-s`: the rest of it
  (the ServerApp alone: aggregation, evaluation, bookkeeping, Flower's polls);
- `configure-s`, `aggregate-s`, `evaluate-s`: the ServerApp's steps within a round (the same
  rounds as `round-s`): each app's own strategy, and the central evaluation both call;
  `other-s`: `server-s` less the three (the round's row, checkpoint and logs; Flower's polls);
  `eval-threads`: the torch threads the central evaluation ran on.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

TRAIN = "train"


def events(folder: Path) -> list[dict[str, Any]]:
    """Every event the probe wrote under `folder` (one JSON object a line, a file per process)."""
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def _median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values) if values else float("nan")


def rounds_of(sim: list[dict[str, Any]], sampled: int) -> list[list[dict[str, Any]]]:
    """The training messages in rounds of `sampled`, by submit time (Flower's FedAvg sets no
    group id, so the count is what tells the rounds apart)."""
    ordered = sorted(sim, key=lambda e: e["t0"])
    return [ordered[i:i + sampled] for i in range(0, len(ordered) - sampled + 1, sampled)]


def breakdown(found: list[dict[str, Any]], sampled: int) -> dict[str, float]:
    """Medians over the training messages of rounds 2.. (round 1 pays Ray's and the actors'
    start); see the module's docstring for each key."""
    sim = [e for e in found if e["at"] == "sim" and e["type"] == TRAIN]
    apps = [e for e in found if e["at"] == "app" and e["type"] == TRAIN]
    rounds = rounds_of(sim, sampled)
    if len(rounds) < 3:
        raise ValueError(f"the probe saw {len(sim)} training messages: fewer than 3 rounds of {sampled}")
    later = [m for r in rounds[1:] for m in r]
    by_node: dict[int, list[dict[str, Any]]] = {}
    for app in sorted(apps, key=lambda e: e["t0"]):
        by_node.setdefault(app["node"], []).append(app)
    joined = [(m, _call_of(m, by_node)) for m in later]
    joined = [(m, a) for m, a in joined if a is not None]
    starts = [r[0]["t0"] for r in rounds]
    clients = [max(m["t1"] for m in r) - r[0]["t0"] for r in rounds[1:-1]]
    lengths = [b - a for a, b in zip(starts[1:-1], starts[2:], strict=True)]
    context = {name: [e["t1"] - e["t0"] for e in found if e["at"] == name]
               for name in ("context-get", "context-put")}
    sized = [e for e in sim if "message-bytes" in e]
    # each step's time within each measured round (its first submit to the next round's)
    steps = {name: [sum(e["t1"] - e["t0"] for e in found if e["at"] == name and a <= e["t0"] < b)
                    for a, b in zip(starts[1:-1], starts[2:], strict=True)]
             for name in ("configure", "aggregate", "evaluate")}
    step_s = {f"{name}-s": statistics.median(d) if any(d) else float("nan") for name, d in steps.items()}
    threads = [e["threads"] for e in found if e["at"] == "evaluate" and "threads" in e]
    server = statistics.median(n - c for n, c in zip(lengths, clients, strict=True)) if lengths \
        else float("nan")
    return {
        "message-ms": _median_ms([m["t1"] - m["t0"] for m in later]),
        "app-ms": _median_ms([a["t1"] - a["t0"] for _, a in joined]),
        "dispatch-ms": _median_ms([a["t0"] - m["t0"] for m, a in joined]),
        "return-ms": _median_ms([m["t1"] - a["t1"] for m, a in joined]),
        "context-get-ms": _median_ms(context["context-get"]),
        "context-put-ms": _median_ms(context["context-put"]),
        "message-kb": statistics.median(e["message-bytes"] for e in sized) / 1000 if sized else float("nan"),
        "context-kb": statistics.median(e["context-bytes"] for e in sized) / 1000 if sized else float("nan"),
        "round-s": statistics.median(lengths) if lengths else float("nan"),
        "clients-s": statistics.median(clients) if clients else float("nan"),
        "server-s": server,
        **step_s,
        "other-s": server - sum(step_s.values()),
        "eval-threads": statistics.median(threads) if threads else float("nan"),
    }


def _call_of(message: dict[str, Any], by_node: dict[int, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The actor's call of this message: the same node's call that began within its submit-reply."""
    for app in by_node.get(message["node"], []):
        if message["t0"] <= app["t0"] and app["t1"] <= message["t1"]:
            return app
    return None
