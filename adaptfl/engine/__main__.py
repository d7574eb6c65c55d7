"""`python -m adaptfl.engine --num-nodes 10 algorithm=fedadamw local-steps=20`: a run without Flower.

Exit codes (core/exit_codes.py): 0 done, 2 refused before round 1 (`config error: …`),
3 aborted after it started, 1 anything else. torch and Flower are imported only after the
arguments are parsed, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptfl.core.exit_codes import ABORTED_EXIT_CODE, REFUSED_EXIT_CODE
from adaptfl.core.wire import COHORT_FORMS

if TYPE_CHECKING:  # heavy: torch, Flower (imported where a run needs them)
    from adaptfl.algorithms.config import RunConfig

PROG = "python -m adaptfl.engine"


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


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=int, default=10)
    parser.add_argument("--quiet", action="store_true", help="a progress bar only, no log lines")
    parser.add_argument("--cohort", default="1", metavar="C",
                        help="train the round's sampled clients C at a time as one vectorised "
                             "computation (docs/scale.md); auto: as many as fit in half the free "
                             "memory; 1 (the default): one after another")
    parser.add_argument("--cohort-form", default="auto", choices=COHORT_FORMS,
                        help="the cohort's gradients: grouped (the clients' models as one: batched "
                             "matmuls, grouped convolutions), vmap over the clients, or client by "
                             "client (auto: the first that applies; the loop where the model has "
                             "buffers or the algorithm adds loss terms or Sophia's Hessian refresh)")
    parser.add_argument("--print-config", action="store_true",
                        help="print every key the run reads, presets filled in, and where each "
                             "value came from (yours, the default, the algorithm's preset); run nothing")
    parser.add_argument("overrides", nargs="*", help="run-config key=value pairs (docs/algorithms.md)")
    return parser


def resolved_config(cfg: RunConfig, given: dict[str, object]) -> str:
    """`key = value  # source` per key the run reads (TOML values, so a line can be copied into
    a --run-config file); keys this algorithm does not read are left out."""
    from adaptfl.algorithms.config import declared_keys
    from adaptfl.core.params import PRESET

    declared = declared_keys()
    lines = [f"# algorithm {cfg.algorithm.name!r}: {cfg.algorithm.describe()}"]
    for key, value in sorted(cfg.to_flower().items()):
        if value == PRESET:
            continue
        if key in given and given[key] != PRESET:
            source = "yours"
        elif any(info.default == value for _, info in declared.get(key, [])):
            source = "default"
        else:
            source = f"{cfg.algorithm.name}'s preset"
        shown = json.dumps(value) if not isinstance(value, bool) else str(value).lower()
        lines.append(f"{key} = {shown}  # {source}")
    return "\n".join(lines)


def cohort_size(given: str) -> int | None:
    """--cohort as given: a positive count, or None for auto."""
    if given == "auto":
        return None
    if not given.isdigit() or int(given) < 1:
        raise refuse(ValueError(f"--cohort {given}: give a count >= 1 or auto"))
    return int(given)


def refuse(err: BaseException) -> SystemExit:
    print(f"config error: {' '.join(str(err).split())}", file=sys.stderr)  # one line, always
    return SystemExit(REFUSED_EXIT_CODE)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.num_nodes < 1:  # named as typed, before the heavy imports
        raise refuse(ValueError(f"--num-nodes {args.num_nodes}: must be >= 1"))
    cohort = cohort_size(args.cohort)
    level = logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    from adaptfl.algorithms.config import RunConfig  # heavy: torch, Flower

    try:
        cfg = RunConfig.from_flower(parse_overrides(args.overrides))
    except ValueError as err:  # one line naming the key, no traceback
        raise refuse(err) from None
    if args.print_config:
        print(resolved_config(cfg, parse_overrides(args.overrides)))
        return
    import torch
    from tqdm import tqdm

    from adaptfl.client_app.threads import engine_threads
    from adaptfl.engine.cohort import run_cohort
    from adaptfl.engine.inprocess import run_inprocess
    from adaptfl.privacy.release import CONFIDENTIAL_FILE
    from adaptfl.server_app.abort import RunAborted, fell_below_start

    # The nodes share this process's CPUs (client_app/threads.py); num-threads > 0 is applied
    # by each client call as well.
    torch.set_num_threads(engine_threads(cfg.runtime.num_threads, args.num_nodes))

    bar = tqdm(total=cfg.federation.num_server_rounds, unit="round", desc=cfg.algorithm.name,
               disable=None)  # disable=None: no bar when stderr is not a terminal

    def on_round(row: dict[str, Any]) -> None:
        bar.n = int(row["round"])
        bar.set_postfix(accuracy=f"{row['test-accuracy']:.4f}", refresh=True)

    try:
        out: Path = run_inprocess(cfg, args.num_nodes, on_round=on_round) if cohort == 1 else \
            run_cohort(cfg, args.num_nodes, cohort, args.cohort_form, on_round=on_round)
    except (ValueError, OSError, ImportError) as err:  # refused: task, model, a client's check
        bar.close()
        raise refuse(err) from None
    except RunAborted as err:  # too many skipped rounds, a non-finite model: one line, exit 3
        bar.close()
        print(err, file=sys.stderr)
        raise SystemExit(ABORTED_EXIT_CODE) from None
    finally:
        bar.close()
    print(f"results: {out}")
    metrics = out / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line] \
        if metrics.exists() else []
    worse = fell_below_start(rows, CONFIDENTIAL_FILE if cfg.privacy.on else "metrics.jsonl")
    if worse:  # the last line, so a run that left a model worse than its start is not missed
        print(f"warning: {worse}", file=sys.stderr)


if __name__ == "__main__":
    main()
