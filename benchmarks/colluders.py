"""`python benchmarks/colluders.py`: the colluders table of docs/robustness.md ("Colluders at
the bound"). tests/e2e/test_hostile_e2e.py's setup (MLP, the first 600/200 Fashion-MNIST images
iid, 8 rounds of 10 local steps, seed 1, one torch thread), 7 nodes with 2 hostile and 10 with 3.

The class-suppression attack: each colluder trains honestly, then adds to its Δ the same
direction e (bias of class 0 down by 1, that class's row of the last layer down by 0.1 each:
the MLP's hidden units are ReLU outputs, so both lower the class's logit), scaled to twice its
own Δ's norm: each reply stays near the contribution bound (2 × the median deviation) while all
of them pull one class down together, so the coordinate-wise median moves too.

Final test accuracy, clean and attacked, per aggregator: `mean` (the defaults), `median`,
`trimmed-mean` and `krum` sized by `hostile-fraction` (`--fraction`, default 0.3: cuts / f of
ceil(0.3 × n) = 3 at both sizes, min-replies = n; Krum with krum-select 0). About 10 min on 2
shared cores for fedact."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import tempfile

import torch
from flwr.app import ArrayRecord

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.core import wire  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.server_app.abort import RunAborted  # noqa: E402
from adaptfl.server_app.loop import run_federated  # noqa: E402
from benchmarks.hostile_table import tiny_fashion_mnist  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from tests.e2e.test_hostile_e2e import _config as _hostile_config  # noqa: E402
from tests.support.run_outputs import metric_rows  # noqa: E402

SIZES = {7: 2, 10: 3}  # nodes: colluders
CLASS = 0


def suppress_class(arrays: dict, metrics: dict) -> None:
    """Δ + 2‖Δ‖·e/‖e‖, e lowering class CLASS's logit (the MLP's last layer, "3.")."""
    delta = arrays[wire.DELTA]
    e = {n: torch.zeros_like(t) for n, t in delta.items() if t.is_floating_point()}
    e["3.bias"][CLASS] = -1.0
    e["3.weight"][CLASS] = -0.1
    size = torch.sqrt(sum((t.double() ** 2).sum() for t in e.values()))
    norm = torch.sqrt(sum((t.double() ** 2).sum() for n, t in delta.items() if n in e))
    arrays[wire.DELTA] = {n: t + (2 * norm / size).to(t.dtype) * e[n] if n in e else t
                          for n, t in delta.items()}


def colluders(count: int):  # noqa: ANN201 - a ClientApp handler
    def handler(msg, context):  # noqa: ANN001, ANN202
        reply = train_or_refuse(msg, context)
        if context.node_config["partition-id"] >= count or reply.has_error():
            return reply
        arrays = {name: dict(rec.to_torch_state_dict()) for name, rec in reply.content.array_records.items()}
        suppress_class(arrays, {})
        reply.content[wire.DELTA] = ArrayRecord(arrays[wire.DELTA])
        return reply
    return handler


def accuracy(cfg, nodes: int, handler) -> float:  # noqa: ANN001
    try:
        return metric_rows(run_federated(InProcessGrid(nodes, cfg.to_flower(), handler=handler), cfg))[-1][
            "test-accuracy"]
    except RunAborted:
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithm", default="fedact")
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--rules", nargs="+", default=["mean", "median", "trimmed-mean", "krum"],
                        help="the aggregators to measure (a row's first word)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"machine: {describe('cpu')}\n")
    work = pathlib.Path(tempfile.mkdtemp(prefix="colluders-"))
    data = {"fashion-mnist": tiny_fashion_mnist(work / "fashion-mnist")}
    rules = {"mean (defaults)": {},
             "median": {"aggregator": "median"},
             f"trimmed-mean, hostile-fraction {args.fraction:g}": {"aggregator": "trimmed-mean",
                                                                  "hostile_fraction": args.fraction},
             f"krum, hostile-fraction {args.fraction:g}": {"aggregator": "krum", "krum_select": 0,
                                                          "hostile_fraction": args.fraction}}
    heads = [f"{c} of {n}: clean → attacked" for n, c in SIZES.items()]
    print(f"| {args.algorithm} | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(SIZES))
    for name, extra in rules.items():
        if name.split(" ")[0].rstrip(",") not in args.rules:
            continue
        cells = []
        for nodes, count in SIZES.items():
            kw = {**extra, **({"min_replies": nodes} if "hostile_fraction" in extra else {})}
            cfg = _hostile_config(data, work, args.algorithm, rounds=8, num_threads=1, **kw)
            clean = accuracy(cfg, nodes, train_or_refuse)
            hit = accuracy(cfg, nodes, colluders(count))
            cells.append(f"{clean:.3f} → {hit:.3f} ({hit - clean:+.3f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
