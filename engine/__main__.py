"""`python -m adaptfl.engine --num-nodes 10 algorithm=fedadamw local-steps=20`: a run without Flower."""

from __future__ import annotations

import argparse
import logging
import sys
import tomllib
from pathlib import Path

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import run_inprocess
from adaptfl.server_app.abort import EXIT_CODE as ABORT_EXIT_CODE
from adaptfl.server_app.abort import RunAborted
from tqdm import tqdm


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """`key=value` pairs, values parsed as TOML (`lr=0.01`, `algorithm=fedact` both work)."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"override {pair!r} is not key=value")
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-nodes", type=int, default=10)
    parser.add_argument("--quiet", action="store_true", help="a progress bar only, no log lines")
    parser.add_argument("overrides", nargs="*", help="run-config key=value pairs")
    args = parser.parse_args()
    level = logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = RunConfig.from_flower(parse_overrides(args.overrides))
    except ValueError as err:  # one line naming the key, no traceback
        raise SystemExit(f"config error: {err}") from None
    bar = tqdm(total=cfg.federation.num_server_rounds, unit="round", desc=cfg.algorithm.name,
               disable=None)  # disable=None: no bar when stderr is not a terminal

    def on_round(row: dict) -> None:
        bar.n = int(row["round"])
        bar.set_postfix(accuracy=f"{row['test-accuracy']:.4f}", refresh=True)

    try:
        out: Path = run_inprocess(cfg, args.num_nodes, on_round=on_round)
    except ValueError as err:  # refused before round 1 (task, model, a client's check): one line
        raise SystemExit(f"error: {err}") from None
    except RunAborted as err:  # too many skipped rounds, a non-finite model: one line, exit 3
        bar.close()
        print(err, file=sys.stderr)
        raise SystemExit(ABORT_EXIT_CODE) from None
    finally:
        bar.close()
    print(f"results: {out}")


if __name__ == "__main__":
    main()
