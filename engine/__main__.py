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
    parser.add_argument("overrides", nargs="*", help="run-config key=value pairs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = RunConfig.from_flower(parse_overrides(args.overrides))
    except ValueError as err:  # one line naming the key, no traceback
        raise SystemExit(f"config error: {err}") from None
    try:
        out: Path = run_inprocess(cfg, args.num_nodes)
    except RunAborted as err:  # too many skipped rounds, a non-finite model: one line, exit 3
        print(err, file=sys.stderr)
        raise SystemExit(ABORT_EXIT_CODE) from None
    print(f"results: {out}")


if __name__ == "__main__":
    main()
