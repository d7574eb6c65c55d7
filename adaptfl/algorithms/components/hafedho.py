"""HaFedHo's objective rectification (seed 003, Algorithm 1: the surrogate φ_i and its h, f̂).

The server sends g^{t-1} (mean of the clients' summed local gradients), f̂^{t-1} (mean local
loss) and |D|. Client i, with data share p_i = |D_i| / |D|:

    took part in round t-1:  h = g^{t-1} - p_i·g_i^{t-1};   f = f̂^{t-1} - p_i·f̂_i^{t-1}
    otherwise:               h = g^{t-1};                   f = f̂^{t-1}
    φ_i(w) = f_i(w) + μ·(f + hᵀ(w - w_t))                   (w_t = the round's global model)

`rectify="objective"` adds μ(f + hᵀ(w - w_t)) to the loss before backward (the paper's method);
`"gradient"` adds μ·h to ∇f_i after backward instead (the seed's ablation, Fig. 3). With plain
SGD both give the same steps, since ∇φ_i = ∇f_i + μh; they differ in the loss backpropagated.

After the K steps: f̂_i = mean f_i over the steps and g_i = Σ_k ∇φ_i(w_k) = -Δ_i / lr (exact for
plain SGD). The client keeps g_i, f̂_i, its reported |D_i| (num-examples) and the round as
durable state; lost state means "did not take part". Server: x <- x + mean Δ_i,
g^t = -mean Δ_i / lr, f̂^t = mean f̂_i, and |D| (below), or the
public constant `total-examples` (what dp requires: |D| would be broadcast un-noised).
Where the server knows the partitioning (the in-process engine: partition ids 0..N-1 of the
run's own partitioning), |D| is the partitions' examples summed: the paper's federation size,
whichever clients a round samples.

Only the server can know |D|: a node training on its own data-dir, or a user's ClientSession,
sees its own rows alone (p_i would be 1). In a deployment without `total-examples` the server
asks every connected node its num-examples before round 1 (and each new node when it appears:
strategies/census.py), counts each partition id's first claim once over the run, each capped at
max-weight-ratio × the median claim (strategies/examples.py): the federation's size from round
1, whichever clients a round samples and whoever claims first. A node that does not answer the
census is counted at the median claim until its first reply; a reply without a partition id
adds nothing, and a round with nothing counted at all is refused naming `total-examples`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adaptfl.algorithms.components.scaffold import add_to_grads_
from adaptfl.core import wire
from adaptfl.core.contract import Metric, ModelSpec, Record, scalar_shape
from adaptfl.core.domain import FINITE, NONNEG
from adaptfl.core.params import component, param
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, PartOutput, Stage
from adaptfl.server_rules.aggregators import AggregationRefused

if TYPE_CHECKING:
    from adaptfl.algorithms.algorithm import Algorithm
    from adaptfl.local_update import LocalUpdate

STATE = "hafedho"
RECTIFIED_LOSS = "rectified-loss"  # reply metric: mean φ_i(w_k) = f_i + μ(f + hᵀ(w - w_t))


def _size_shape(spec: ModelSpec, algorithm: Algorithm) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {"n-total": ((1,), torch.float64)}  # float64: counts above 2^24 stay exact


def rectification(g_prev: Mapping[str, torch.Tensor] | None, f_prev: float,
                  own: Mapping[str, torch.Tensor] | None, own_f: float, p_i: float,
                  took_part: bool) -> tuple[dict[str, torch.Tensor], float]:
    """(h, f) of the participation rule; zeros when the server has no g yet."""
    if g_prev is None:
        return {}, 0.0
    if took_part and own is not None:
        return {n: g - p_i * own[n] for n, g in g_prev.items()}, f_prev - p_i * own_f
    return {n: g.clone() for n, g in g_prev.items()}, f_prev


@component("term", "hafedho")
@dataclass(frozen=True)
class HaFedHo(Stage):
    """Taylor-rectified local objective; stateful clients."""

    mu: float = param(0.01, "HaFedHo's μ: weight of the rectification", within=(0.0, None),
                      sane=(0.0, 1e4))
    rectify: str = param("objective", "objective (the term in the loss) or gradient (μh on ∇)",
                         choices=("objective", "gradient"))
    total_examples: float = param(0.0, "the federation's examples (p_i's denominator) as a "
                                  "public constant the operator declares; 0: the partitions' "
                                  "examples where the server holds the partitioning (the "
                                  "in-process engine), else each node's capped num-examples, "
                                  "asked of every node before round 1 (strategies/census.py), "
                                  "which dp refuses (broadcast un-noised)",
                                  within=(0.0, None))

    up_metrics = (Metric(wire.F_HAT, FINITE, "f̂_i, the mean local loss (finite at float32)"),)

    def check(self) -> None:
        if self.total_examples and (self.total_examples < 1 or not float(self.total_examples).is_integer()):
            raise ValueError(f"invalid total-examples={self.total_examples!r}: a count of examples, a "
                             "whole number >= 1 (or 0: summed from the replies)")

    def records_down(self) -> tuple[Record, ...]:
        g = Record(wire.HAFEDHO_G, doc="g^{t-1}, mean of the clients' summed local gradients")
        n = Record(wire.HAFEDHO_N_TOTAL, _size_shape, "|D| (p_i = |D_i| / |D|): total-examples, or the "
                   "partitions' examples where the server holds the partitioning, else each "
                   "client's capped num-examples counted once over the run", NONNEG)
        if self.rectify == "gradient":  # μh on ∇: the constant f enters nothing the client computes
            return (g, n)
        return (g, Record(wire.HAFEDHO_F_HAT, scalar_shape("f-hat"), "f̂^{t-1}, the mean local loss"), n)

    def records_down_repeated(self) -> tuple[str, ...]:
        return (wire.HAFEDHO_N_TOTAL,)  # |D| is the same every round once every node is counted

    def start(self, ctx: ClientRound) -> ClientPart:
        return _HaFedHo(ctx, self)

    def aggregate(self, agg: Aggregation) -> None:
        lr = agg.info.lr
        agg.new_extras[wire.HAFEDHO_G] = {n: -agg.mean_delta[n] / lr for n in agg.spec.parameters}
        # through the aggregator like every averaged state: a robust rule bounds a liar's f̂_i too
        f_hats = [{"f-hat": torch.tensor([float(r.metrics[wire.F_HAT])], dtype=torch.float64)}
                  for r in agg.replies]
        f_hat = agg.mean(f_hats, wire.HAFEDHO_F_HAT)["f-hat"]
        agg.new_extras[wire.HAFEDHO_F_HAT] = {"f-hat": f_hat.to(torch.float32)}
        known = self.total_examples or agg.federation_examples  # the paper's |D|
        if known <= 0:  # replies without a partition id: no client can be counted once
            raise AggregationRefused("HaFedHo's |D|: a reply names no partition-id, so the server "
                                     "cannot count each client's examples once; declare "
                                     "total-examples=|D| (the federation's examples)")
        agg.new_extras[wire.HAFEDHO_N_TOTAL] = {"n-total": torch.tensor([known], dtype=torch.float64)}

    def counts_examples(self) -> bool:
        return self.total_examples <= 0

    def released_bare(self) -> str:
        return "" if self.total_examples > 0 else \
            "HaFedHo's |D| (the clients' num-examples counted; declare total-examples=|D| instead)"


class _HaFedHo(ClientPart):
    def __init__(self, ctx: ClientRound, term: HaFedHo) -> None:
        self.ctx, self.mu, self.mode = ctx, term.mu, term.rectify
        expect = {f"g.{n}": tuple(t.shape) for n, t in ctx.start.items()} | \
            {"f-hat": (1,), "round": (1,), "n": (1,)}
        state, self.source = ctx.store.load(STATE, expect)
        round_ = ctx.info.server_round
        self.took_part = state is not None and int(state["round"]) == round_ - 1
        self.p_i = self._share(state) if self.took_part and wire.HAFEDHO_G in ctx.records else 0.0
        own = {n[2:]: t.to(ctx.start[n[2:]]) for n, t in state.items() if n.startswith("g.")} \
            if state is not None else None
        own_f = float(state["f-hat"]) if state is not None else 0.0
        f_record = ctx.records.get(wire.HAFEDHO_F_HAT)
        f_prev = float(f_record["f-hat"]) if f_record is not None else 0.0
        self.h, self.f = rectification(ctx.records.get(wire.HAFEDHO_G), f_prev, own, own_f,
                                       self.p_i, self.took_part)
        self.params = ctx.params
        self.terms: list[torch.Tensor] = []  # μ(f + hᵀ(w - w_t)) at each step

    def _share(self, state: Mapping[str, torch.Tensor]) -> float:
        """p_i = |D_i| / |D|: this client's num-examples of last round over the server's |D|."""
        record = self.ctx.records.get(wire.HAFEDHO_N_TOTAL)
        if record is None:
            raise ValueError(f"HaFedHo: the message carries g but not {wire.HAFEDHO_N_TOTAL!r} "
                             "(|D|), so this client's share p_i = |D_i|/|D| is unknown")
        own, total = float(state["n"]), float(record["n-total"])
        if not 0 < own <= total:
            raise ValueError(f"HaFedHo: this client's last num-examples {own:g} is not within "
                             f"the server's |D|={total:g}")
        return own / total

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        if self.mode != "objective" or not self.h:
            return None
        linear = torch.stack([(self.h[n] * (p - self.ctx.start[n])).sum()
                              for n, p in self.params.items()]).sum()
        term = self.mu * (self.f + linear)
        self.terms.append(term.detach())
        return term

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        if self.mode == "gradient" and self.h:
            add_to_grads_(params, self.h, scale=self.mu)

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        lr = self.ctx.info.lr
        g_i = {f"g.{n}": -delta[n] / lr for n in self.params}  # Σ_k ∇φ_i(w_k) for plain SGD
        round_ = torch.tensor([self.ctx.info.server_round], dtype=torch.int64)
        if self.ctx.num_examples is None:
            raise RuntimeError("HaFedHo keeps the num-examples of the reply: set ClientRound.num_examples")
        n = torch.tensor([float(self.ctx.num_examples)], dtype=torch.float64)
        self.ctx.store.save(STATE, {**g_i, "f-hat": torch.tensor([train_loss]), "round": round_, "n": n})
        metrics = {wire.F_HAT: train_loss, wire.CLIENT_STATE: int(self.source),
                   wire.TOOK_PART: int(self.took_part)}
        if self.terms:  # the surrogate φ_i the client minimised, mean over the steps
            metrics[RECTIFIED_LOSS] = train_loss + float(torch.stack(self.terms).mean())
        return PartOutput(metrics=metrics)
