"""`python benchmarks/hostile_table.py`: the table in docs/robustness.md. One hostile client among
five, tests/test_hostile_e2e.py's setup (8 rounds of 10 local steps, MLP, the first 600/200
Fashion-MNIST images, seed 1), final test accuracy per algorithm family and aggregator.
About 40 s on 2 idle cores."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.workloads.idx import read_idx_file  # noqa: E402

from tests.conftest import FASHION_MNIST_DIR, TINY_FASHION_MNIST, _write_idx  # noqa: E402
from tests.test_hostile_e2e import (  # noqa: E402
    FAMILIES,
    UNSCREENED,
    _accuracy,
    _config,
    flip,
    hostile,
    inflate,
)


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
    args = parser.parse_args()
    columns = [c for c in COLUMNS if c[0] in args.columns]
    logging.disable(logging.WARNING)
    work = pathlib.Path(tempfile.mkdtemp(prefix="hostile-table-"))
    data = {"fashion-mnist": tiny_fashion_mnist(work / "fashion-mnist")}
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
