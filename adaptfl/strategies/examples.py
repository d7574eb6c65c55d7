"""The federation's examples |D| where the server does not hold the partitioning (a deployment:
each node trains on data of its own), for a component that needs the paper's |D| = Σ_i |D_i|
over every client, not the cohort's (HaFedHo: p_i = |D_i| / |D|, seed 003's Algorithm 1).

Each client's |D_i| is counted once over the run: the num-examples it claims the first time its
partition id is seen, by the census every node answers before round 1 (census.py) or else by
its first training reply, kept in the server state (`LEDGER`: checkpointed and resumed,
committed with the round). A later claim of the same id changes nothing, so a client cannot
grow its share round by round. Each recorded claim is capped, as the intake caps weights, at
max-weight-ratio × the median of the recorded claims (the raw claims are kept, so a liar's
2**62, recorded before the others, is capped once they are), and the clients not seen yet are
counted at that median:

    |D| = Σ_{i seen} min(n_i, r · median n) + max(0, N - seen) · median n

N the nodes connected at sampling. Once every client has answered the census (or been
sampled) it is the paper's |D| with each claim capped; before, the unseen ones' share is
estimated, not the cohort's sum taken for the federation's. A reply without a partition id
adds nothing; where nothing names one, 0 is returned and the caller says so (`total-examples`
declares |D| instead).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import torch

from adaptfl.core import wire

LEDGER = "federation/examples"  # server-state extras: {"ids": int64, "claims": float64}, first seen


def ledger_of(extras: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[int, float]:
    """partition id -> the num-examples it claimed when first seen, from the server state."""
    record = extras.get(LEDGER)
    if not record:
        return {}
    return dict(zip((int(i) for i in record["ids"].tolist()),
                    (float(c) for c in record["claims"].tolist()), strict=True))


def ledger_record(ledger: Mapping[int, float]) -> dict[str, torch.Tensor]:
    ids = sorted(ledger)
    return {"ids": torch.tensor(ids, dtype=torch.int64),
            "claims": torch.tensor([ledger[i] for i in ids], dtype=torch.float64)}


def counted_once(ledger: Mapping[int, float], replies: Sequence[Mapping[str, float | int]]
                 ) -> dict[int, float] | None:
    """The ledger with the replies' first claims added (metrics with partition-id and
    num-examples). A reply without a partition id adds nothing (it cannot be counted once; its
    node is counted by the census, census.py, or as not seen); None only where nothing at all
    can be counted (an empty ledger and no reply naming a partition id)."""
    out = dict(ledger)
    for metrics in replies:
        if wire.PARTITION_ID in metrics:
            out.setdefault(int(metrics[wire.PARTITION_ID]), float(metrics[wire.NUM_EXAMPLES]))
    return out or None


def federation_examples(ledger: Mapping[int, float], nodes: int, ratio: float) -> float:
    """|D| from the ledger (module docstring); `ratio` max-weight-ratio (0: claims uncapped);
    0.0 for an empty ledger."""
    if not ledger:
        return 0.0
    typical = statistics.median(ledger.values())
    cap = ratio * typical if ratio > 0.0 else float("inf")
    seen = sum(min(claim, cap) for claim in ledger.values())
    return seen + max(0, nodes - len(ledger)) * typical


def round_examples(extras: Mapping[str, Mapping[str, torch.Tensor]],
                   replies: Sequence[Mapping[str, float | int]], partition_sizes: Sequence[int] | None,
                   counts: bool, nodes: int, ratio: float) -> tuple[float, dict[int, float] | None]:
    """(|D| for a round, the ledger to keep after it or None): the partitions' examples where the
    server holds the partitioning; else, where a stage `counts` them, the ledger with the
    round's accepted replies (`replies`: their metrics) added; 0.0 where neither holds."""
    if partition_sizes is not None:
        return float(sum(partition_sizes)), None
    if not counts:
        return 0.0, None
    ledger = counted_once(ledger_of(extras), replies)
    return (federation_examples(ledger, nodes, ratio), ledger) if ledger is not None else (0.0, None)
