"""`python benchmarks/hostile_table.py`: the table in docs/robustness.md. One hostile client among
five, tests/e2e/test_hostile_e2e.py's setup (8 rounds of 10 local steps, MLP, the first 600/200
Fashion-MNIST images, seed 1), final test accuracy per algorithm family and aggregator.
About 40 s on 2 idle cores. `--sizing`: the robust rules against several hostile clients (2 of 7
flipping, two identical colluders of 5), sized by their own defaults or by hostile-fraction."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flwr.app import ArrayRecord, Message  # noqa: E402

from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.core import wire  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.server_app.abort import RunAborted  # noqa: E402
from adaptfl.server_app.loop import run_federated  # noqa: E402
from adaptfl.workloads.idx import read_idx_file  # noqa: E402
from tests.conftest import FASHION_MNIST_DIR, TINY_FASHION_MNIST, _write_idx  # noqa: E402
from tests.e2e.test_hostile_e2e import (  # noqa: E402
    FAMILIES,
    UNSCREENED,
    _accuracy,
    _config,
    flip,
    hostile,
    inflate,
)
from tests.support.run_outputs import metric_rows  # noqa: E402


def flip_heavy(arrays: dict, metrics: dict) -> None:
    """The flip, claiming num-examples = 2**62."""
    flip(arrays, metrics)
    metrics["num-examples"] = 2**62


OFF = dict(UNSCREENED)
# (header, aggregator, attack, settings)
COLUMNS = [("mean, no screens, flip", "mean", flip, OFF), ("mean, flip", "mean", flip, {}),
           ("mean, inflate", "mean", inflate, {}), ("median alone, flip", "median", flip, OFF),
           ("trimmed-mean alone, flip", "trimmed-mean", flip, OFF), ("krum alone, flip", "krum", flip, OFF),
           ("clip alone, inflate", "clip", inflate, OFF), ("clip alone, flip", "clip", flip, OFF),
           ("clip alone, flip + 2**62", "clip", flip_heavy, OFF)]


def attackers(partitions: set[int], identical: bool = False):  # noqa: ANN201 - a ClientApp handler
    """The honest handler, then the flip on `partitions`' replies; `identical`: every attacker
    sends the Δ the first of them computed this round (colluders), each with its own metrics."""
    shared: dict[int, dict] = {}

    def handler(msg: Message, context) -> Message:  # noqa: ANN001
        reply = train_or_refuse(msg, context)
        if context.node_config["partition-id"] not in partitions or reply.has_error():
            return reply
        rnd = int(msg.content.config_records[wire.CONFIG]["server-round"])
        if not (identical and rnd in shared):
            arrays = {n: dict(r.to_torch_state_dict()) for n, r in reply.content.array_records.items()}
            flip(arrays, {})
            shared[rnd] = arrays
        for name, tensors in shared[rnd].items():
            reply.content[name] = ArrayRecord({k: t.clone() for k, t in tensors.items()})
        return reply
    return handler


def accuracy(cfg, nodes: int, handler) -> float | str:  # noqa: ANN001
    """Final test accuracy; 0 for an aborted run; the refusal of a run refused before round 1."""
    try:
        return metric_rows(run_federated(InProcessGrid(nodes, cfg.to_flower(), handler=handler), cfg))[-1][
            "test-accuracy"]
    except RunAborted:
        return 0.0
    except ValueError as err:  # e.g. Krum with f = 2 needs 7 replies
        return f"refused: {' '.join(str(err).split()[:7])} …"


# (label, nodes, attacking partitions, identical); (header, aggregator, settings)
SIZING = [("2 of 7", 7, {0, 1}, False), ("2 identical of 5", 5, {0, 1}, True)]
RULES = [("median alone", "median", OFF), ("trimmed-mean β = 0.2 alone", "trimmed-mean", OFF),
         ("trimmed-mean, hostile-fraction alone", "trimmed-mean", {**OFF, "hf": True}),
         ("krum f = 1 alone", "krum", OFF), ("krum, hostile-fraction alone", "krum", {**OFF, "hf": True}),
         ("trimmed-mean, hostile-fraction + screens", "trimmed-mean", {"hf": True}),
         ("krum, hostile-fraction + screens", "krum", {"hf": True})]


def sizing(data: dict, work: pathlib.Path, algorithms: list[str], rules: list[str],
           cases: list[str]) -> None:
    rows = [r for r in RULES if r[0] in rules]
    print("| algorithm | hostile | hostile-fraction | clean | " + " | ".join(r[0] for r in rows) + " |")
    print("|---|---|---|---|" + "---|" * len(rows))
    for algorithm in algorithms:
        for label, nodes, bad, identical in (c for c in SIZING if c[0] in cases):
            fraction = 0.4 if nodes == 5 else 0.2  # ceil(share × nodes) = 2 of 5, 2 of 7
            base = dict(min_replies=nodes)
            cells = [accuracy(_config(data, work / algorithm, algorithm, rounds=8, **base), nodes,
                              train_or_refuse)]
            for _, aggregator, settings in rows:
                extra = dict(settings)
                if extra.pop("hf", False):
                    extra["hostile_fraction"] = fraction
                if aggregator == "krum":
                    extra["krum_select"] = 0
                cfg = _config(data, work / algorithm, algorithm, rounds=8, aggregator=aggregator,
                              **base, **extra)
                cells.append(accuracy(cfg, nodes, attackers(bad, identical)))
            text = [c if isinstance(c, str) else (f"{c:.3f}" if c else "aborted") for c in cells]
            print(f"| {algorithm} | {label} | {fraction:.2f} | " + " | ".join(text) + " |", flush=True)


def tiny_fashion_mnist(root: pathlib.Path) -> str:
    """The first images of Fashion-MNIST, as the tests' `tiny_data` fixture writes them."""
    root.mkdir(parents=True, exist_ok=True)
    for split, count in {"train": TINY_FASHION_MNIST[0], "t10k": TINY_FASHION_MNIST[1]}.items():
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            name = f"{split}-{kind}"
            full = read_idx_file(pathlib.Path(FASHION_MNIST_DIR) / f"{name}.gz")
            _write_idx(root / f"{name}.gz", full[:count])
    return str(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithms", nargs="+", default=FAMILIES)
    parser.add_argument("--columns", nargs="+", default=[header for header, *_ in COLUMNS],
                        help="column headers to measure (all by default)")
    parser.add_argument("--sizing", nargs="*", default=None,
                        help="the several-attackers table instead, for these rules (all by default)")
    parser.add_argument("--cases", nargs="+", default=[c[0] for c in SIZING], help="with --sizing")
    args = parser.parse_args()
    columns = [c for c in COLUMNS if c[0] in args.columns]
    logging.disable(logging.WARNING)
    work = pathlib.Path(tempfile.mkdtemp(prefix="hostile-table-"))
    data = {"fashion-mnist": tiny_fashion_mnist(work / "fashion-mnist")}
    if args.sizing is not None:
        sizing(data, work, args.algorithms, args.sizing or [r[0] for r in RULES], args.cases)
        return
    print("| algorithm | clean | " + " | ".join(header for header, *_ in columns) + " |")
    print("|---|" + "---|" * (len(columns) + 1))
    for algorithm in args.algorithms:
        out = work / algorithm
        cells = [_accuracy(_config(data, out, algorithm, rounds=8), train_or_refuse)]
        for _, aggregator, attack, settings in columns:
            extra = {"min_replies": 5, "krum_select": 0} if aggregator == "krum" else {}
            cfg = _config(data, out, algorithm, rounds=8, aggregator=aggregator, **extra, **settings)
            cells.append(_accuracy(cfg, hostile(attack)))
        print(f"| {algorithm} | " + " | ".join(f"{a:.3f}" if a else "aborted" for a in cells) + " |",
              flush=True)


if __name__ == "__main__":
    main()
