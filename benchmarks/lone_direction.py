"""`python benchmarks/lone_direction.py`: what else could hold a lone reply's flip (one reply a
round), measured before deciding against it (docs/robustness.md, "Rounds of one and two
replies"). A lone reply's direction cannot be checked against other replies; these variants
check it against the server's own recent steps, or damp it, on top of the defaults:

- "project": m = the EMA (decay 0.5) of the applied mean Δ; a lone Δ with cos(Δ, m) below the
  threshold loses its component opposed to m (Δ <- Δ - <Δ, m> m / ||m||²);
- "drop": such a lone Δ is zeroed (the round moves nothing);
- "damp": every lone Δ once the history holds 3 replies × the factor;
- "young": the history bound from its first kept reply on (MIN_SAMPLES 1 instead of 3).

benchmarks/small_rounds.py's setup (MLP, 600/200 Fashion-MNIST, 5 nodes, fraction-train 0.2,
8 rounds of 10 local steps, the defaults); per seed, the final test accuracy of an honest
Dirichlet α = 0.3 run, of node 1 sending flip × 9 (its own claim, Δ × -9) whenever sampled
(iid), and of the clean iid run. The variants are patched in here, not in the package: none
held the flip at an honest cost of 0.01 or less. About 5 s a run on 2 cores."""

from __future__ import annotations

import argparse
import logging
import math
import pathlib
import sys
import tempfile
from collections.abc import Callable

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.core import wire  # noqa: E402
from adaptfl.strategies import contribution  # noqa: E402
from adaptfl.strategies.base import AdaptiveStrategy  # noqa: E402
from adaptfl.strategies.validation import DecodedReply  # noqa: E402
from benchmarks.contribution_bound import run  # noqa: E402
from benchmarks.hostile_table import tiny_fashion_mnist  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from benchmarks.small_rounds import _config  # noqa: E402
from tests.e2e.test_contribution_bound import BOUND_RIDING  # noqa: E402
from tests.e2e.test_hostile_e2e import hostile  # noqa: E402

DECAY = 0.5
Tensors = dict[str, torch.Tensor]


def _dot(a: Tensors, b: Tensors) -> float:
    return sum(float((a[n].double() * b[n].double()).sum()) for n in b if n in a)


def lone_rule(mode: str, value: float) -> Callable[[DecodedReply, Tensors | None, bool], None]:
    """The variant applied to a lone reply's Δ (in place): (reply, direction m, history grown)."""
    def apply(reply: DecodedReply, m: Tensors | None, grown: bool) -> None:
        delta = reply.arrays[wire.DELTA]
        if mode == "damp":
            if grown:
                reply.arrays[wire.DELTA] = {n: t * value if t.is_floating_point() else t
                                            for n, t in delta.items()}
            return
        if not m:
            return
        dot, mm, dd = _dot(delta, m), _dot(m, m), _dot(delta, delta)
        if mm <= 0.0 or dd <= 0.0 or not math.isfinite(dot) or dot / math.sqrt(mm * dd) >= value:
            return
        scale = 0.0 if mode == "drop" else 1.0
        reply.arrays[wire.DELTA] = {n: (t - dot / mm * m[n].to(t.dtype) if mode == "project" else t * scale)
                                    if n in m else t for n, t in delta.items()}
    return apply


def patch(mode: str, value: float) -> Callable[[], None]:
    """Install the variant on AdaptiveStrategy; returns the undo."""
    clip, next_state = AdaptiveStrategy._clip, AdaptiveStrategy._next_state
    min_samples = contribution.MIN_SAMPLES
    rule = lone_rule(mode, value)

    def _clip(self: AdaptiveStrategy, replies: list[DecodedReply]) -> None:
        clip(self, replies)
        if len(replies) == 1 and mode in ("project", "drop", "damp"):
            grown = len(self.state.extras.get("screen/history", {}).get(wire.DELTA, [])) >= 3  # type: ignore[union-attr]
            rule(replies[0], getattr(self, "_direction", None), grown)

    def _next_state(self: AdaptiveStrategy, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        new, agg = next_state(self, *args, **kwargs)
        old = getattr(self, "_direction", None)
        self._direction = {n: DECAY * old[n] + t if old else t.clone()  # type: ignore[attr-defined]
                           for n, t in agg.mean_delta.items() if t.is_floating_point()}
        return new, agg

    AdaptiveStrategy._clip = _clip  # type: ignore[method-assign]
    AdaptiveStrategy._next_state = _next_state  # type: ignore[method-assign]
    if mode == "young":
        contribution.MIN_SAMPLES = int(value)

    def undo() -> None:
        AdaptiveStrategy._clip, AdaptiveStrategy._next_state = clip, next_state  # type: ignore[method-assign]
        contribution.MIN_SAMPLES = min_samples
    return undo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--variants", nargs="+", default=["off:0", "project:0", "project:-0.3", "drop:-0.3",
                                                          "damp:0.5", "young:1"],
                        help="mode:value (cos threshold, damping factor, or MIN_SAMPLES)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"machine: {describe('cpu')}; {args.algorithm}, one reply a round\n")
    work = pathlib.Path(tempfile.mkdtemp(prefix="lone-direction-"))
    data = {"fashion-mnist": tiny_fashion_mnist(work / "fashion-mnist")}
    print("| variant | " + " | ".join(f"seed {s}: Dirichlet, flip × 9, clean" for s in args.seeds) + " |")
    print("|---|" + "---|" * len(args.seeds))
    algorithm = args.algorithm
    for variant in args.variants:
        mode, value = variant.split(":")
        undo = patch(mode, float(value))
        try:
            cells = []
            for seed in args.seeds:
                honest = run(_config(data, work, algorithm, seed, 0.2, partitioning="dirichlet"),
                             train_or_refuse)[0]
                flip = run(_config(data, work, algorithm, seed, 0.2), hostile(BOUND_RIDING))[0]
                clean = run(_config(data, work, algorithm, seed, 0.2), train_or_refuse)[0]
                cells.append(f"{honest:.3f}, {flip:.3f}, {clean:.3f}")
        finally:
            undo()
        print(f"| {variant} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
