"""Safe defaults against one hostile reply under any aggregator (docs/threat-model.md, "Hostile
clients", step 4b): no claimed sample
count outweighs the round's median by more than a bounded factor, and each reply's records are
compared with the round's other replies.

    weights  w_i <- min(w_i, max-weight-ratio · median_j w_j)
    screen   a reply is dropped when, for some shared record t (Δ, every record of the
             contract's `up`: Δc, v, Θ_i, ∇f_i(x); `metrics` can add metrics, the strategy
             adds none: HaFedHo's f̂_i moves no gradient, honest losses of two non-IID clients
             came 8.8× apart, and its domain bound holds it), f_i·||t_i|| > screen-ratio ·
             median_{j≠i} f_j·||t_j||, naming the record;
             declared once: the records are the contract's, so a component's new upload is
             screened without a line here (one Δc of 1e30 made SCAFFOLD's c poison every
             later round). Squared statistics (v ≥ 0, SOAP's PSD G·Gᵀ) by sqrt of their
             norm. The median of the OTHER replies, so with two replies each is judged against
             the other; a reply alone in its round against the screen history: per record,
             the median size of the last WINDOW kept replies of earlier rounds, kept in the
             server state (`HISTORY`, checkpointed and resumed). Not a refusal: honest lone
             rounds (fraction-train × few nodes) are normal. A median over several replies, so
             that no single reply sets it: a history of fewer than MIN_SAMPLES is young, and a
             young history that screens a lone reply is restarted (the first sample may be the
             liar: a hostile lone reply of round 1 would otherwise screen every honest one after
             it); a lone reply of round 1 has no history and is held by the domain bounds alone;
             f_i = 1, or for a reply whose claim was capped the cap over the median: its pull
             on the mean is its weight times its size, so Δ = -x of a modest norm claiming
             2**62 examples is screened as surely as a Δ × -20 of an honest weight)

Both are sized so that honest runs never trigger them (docs/robustness.md: the largest ratios
of the results page's grids, and the partition sizes of Dirichlet α = 0.1), so an honest round
is bit-identical with or without them: with no claim capped every f_i is 1 and the screen
compares plain norms (partition sizes of honest clients differ too much, in small samples of a
skewed split, to screen honest replies by weight). The round's metrics record the largest ratio
seen (`screen-ratio-max`), the replies screened and the weights capped. With two replies the
median of the claims is their mean, which no claim exceeds twice: a liar's weight cannot be told
from an honest one's there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence

import torch

from adaptfl.core import wire
from adaptfl.server_rules.aggregators import flat
from adaptfl.strategies.validation import DecodedReply

HISTORY = "screen/history"  # server-state extras: record -> the sizes of the last WINDOW kept replies
WINDOW = 32  # replies: a few rounds of ten, or 32 lone rounds
MIN_SAMPLES = 3  # below it a history is young: one hostile sample of three cannot be its median
CLAIMS = "claims"  # the history's pseudo-record of the kept replies' capped weights (contribution.py)


def shared(reply: DecodedReply, only: Collection[str] | None = None,
           metrics: Collection[str] = ()) -> dict[str, dict[str, torch.Tensor]]:
    """What a reply shares that reaches the server state, by record: its ArrayRecords (Δ and
    every record of the contract's `up`; `only`: these alone) and the required metrics the
    state averages (HaFedHo's f̂_i), each as a one-value record "metrics[<key>]"."""
    out = {r: t for r, t in reply.arrays.items() if only is None or r in only}
    for key in sorted(metrics):
        if key in reply.metrics:
            out[f"{wire.METRICS}[{key}]"] = {key: torch.tensor([float(reply.metrics[key])],
                                                               dtype=torch.float64)}
    return out


def record_sizes(records: Sequence[Mapping[str, Mapping[str, torch.Tensor]]], squared: Collection[str] = ()
                 ) -> dict[str, list[float]]:
    """record -> ||t_i|| per reply (sqrt of it for records in `squared`: second moments, SOAP's
    G·Gᵀ (v ≥ 0 or PSD) are compared on the scale of the gradients they square: a client with
    3× the others' gradients is 9× in them)."""
    if not records:
        return {}
    return {r: [_size(rec[r], r in squared) for rec in records] for r in sorted(records[0])}


def pull_ratios(records: Sequence[Mapping[str, Mapping[str, torch.Tensor]]], factors: Sequence[float],
                squared: Collection[str] = (), reference: Mapping[str, Sequence[float]] | None = None
                ) -> list[tuple[float, str, float, float]]:
    """Per reply: its largest ratio f_i·||t_i|| / median_{j≠i} f_j·||t_j|| over the records,
    which record, f_i·||t_i|| and that median (0 where the median is 0). A reply alone in its
    round is compared with the median of `reference` instead (record -> the sizes of earlier
    kept replies; not screened for a record without any)."""
    sizes = record_sizes(records, squared)
    pulls = {r: [f * s for s, f in zip(values, factors, strict=True)] for r, values in sizes.items()}
    out = []
    for i in range(len(records)):
        worst = (0.0, "", 0.0, 0.0)
        for record, values in pulls.items():
            if len(values) >= 2:
                others = statistics.median(values[:i] + values[i + 1:])
            else:
                others = history_median((reference or {}).get(record, ()))
            ratio = values[i] / others if others > 0.0 else 0.0
            worst = max(worst, (ratio if math.isfinite(ratio) else math.inf, record, values[i], others))
        out.append(worst)
    return out


def _size(tensors: Mapping[str, torch.Tensor], squared: bool) -> float:
    norm = float(flat(tensors).norm())
    return math.sqrt(norm) if squared else norm


def screened(replies: Sequence[DecodedReply], factors: Sequence[float], limit: float,
             squared: Collection[str] = (), only: Collection[str] | None = None,
             metrics: Collection[str] = (),
             reference: Mapping[str, Sequence[float]] | None = None
             ) -> tuple[list[int], dict[int, str], float]:
    """(indices kept, index -> why screened, the largest ratio among the kept); limit 0: off;
    `only`: the records compared (None: all shared ones), `metrics`: the required metrics
    compared too (`shared`), `reference`: what a reply alone in its round is compared with."""
    records = [shared(r, only, metrics) for r in replies]
    ratios = pull_ratios(records, factors, squared, reference)
    against = "the median of the round's other replies" if len(replies) >= 2 else \
        "the screen reference (the median of earlier rounds' kept replies)"
    dropped = {i: f"screened: {record} {'norm' if factors[i] == 1.0 else 'capped weight × norm'} "
                  f"{ratio:.3g}× {against}: {size:.3g} > screen-ratio={limit:g} × {median:.3g}"
               for i, (ratio, record, size, median) in enumerate(ratios)
               if limit > 0.0 and ratio > limit}
    kept = [i for i in range(len(replies)) if i not in dropped]
    return kept, dropped, max((ratios[i][0] for i in kept), default=0.0)


def history_median(sizes: Sequence[float]) -> float:
    """The median of a history of sizes; 0 (nothing to compare with) when empty."""
    return float(statistics.median(sizes)) if sizes else 0.0


def is_young(history: Mapping[str, Sequence[float]]) -> bool:
    """Fewer than MIN_SAMPLES kept replies behind the history: its median may be one reply's."""
    return min((len(v) for v in history.values()), default=0) < MIN_SAMPLES


def round_sizes(replies: Sequence[DecodedReply], squared: Collection[str] = (),
                only: Collection[str] | None = None, metrics: Collection[str] = ()
                ) -> dict[str, list[float]]:
    """record -> the finite sizes of a round's kept replies, for the history."""
    sizes = record_sizes([shared(r, only, metrics) for r in replies], squared)
    return {r: [v for v in values if math.isfinite(v)] for r, values in sizes.items()}


def next_history(old: Mapping[str, Sequence[float]], new: Mapping[str, Sequence[float]]
                 ) -> dict[str, list[float]]:
    """The history after a round: its kept replies' sizes appended, the last WINDOW kept per
    record (a young history that screened a lone reply is dropped instead: intake.py, since its
    median may be a liar's and only kept replies join it)."""
    out = {r: list(v) for r, v in old.items()}
    for record, sizes in new.items():
        out[record] = (out.get(record, []) + list(sizes))[-WINDOW:]
    return {r: v for r, v in out.items() if v}


def reference_of(extras: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, list[float]]:
    """The screen history kept in the server state: record -> sizes, oldest first."""
    return {r: [float(v) for v in t.tolist()] for r, t in extras.get(HISTORY, {}).items()}


def reference_record(history: Mapping[str, Sequence[float]]) -> dict[str, torch.Tensor]:
    return {r: torch.tensor(list(v), dtype=torch.float64) for r, v in history.items()}


def capped_factors(claimed: Sequence[float], capped: Sequence[float]) -> list[float]:
    """f_i: 1, or for a capped claim its capped weight over the claims' median."""
    if len(claimed) < 2:
        return [1.0] * len(claimed)
    median = statistics.median(claimed)
    return [c / median if c < w else 1.0 for w, c in zip(claimed, capped, strict=True)]


def cap_to_median(weights: Sequence[float], ratio: float) -> list[float]:
    """w_i <- min(w_i, ratio · median w); unchanged (the same floats) when nobody exceeds it;
    ratio 0: off."""
    if ratio <= 0.0 or len(weights) < 2:
        return list(weights)
    bound = ratio * statistics.median(weights)
    return [min(w, bound) for w in weights]
