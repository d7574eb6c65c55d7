"""HaFedHo's objective rectification (seed 003, Algorithm 1; spec §5).

The server sends g^{t-1} (mean of the clients' summed local gradients) and f̂^{t-1} (mean local
loss). Client i, with data share p_i = |D_i| / |D|:

    took part in round t-1:  h = g^{t-1} - p_i·g_i^{t-1};   f = f̂^{t-1} - p_i·f̂_i^{t-1}
    otherwise:               h = g^{t-1};                   f = f̂^{t-1}
    φ_i(w) = f_i(w) + μ·(f + hᵀ(w - w_t))                   (w_t = the round's global model)

`rectify="objective"` adds μ(f + hᵀ(w - w_t)) to the loss before backward (the paper's method);
`"gradient"` adds μ·h to ∇f_i after backward instead (the seed's ablation, Fig. 3). With the
preset's plain SGD both give the same steps, since ∇φ_i = ∇f_i + μh; they differ in the loss
that is backpropagated, which is what anything acting on the loss (clipping by loss, loss
scaling) sees.

After the λ = K steps: f̂_i = mean f_i over the steps and g_i = Σ_k ∇φ_i(w_k) = -Δ_i / lr (exact
for plain SGD; with decoupled weight decay it is the gradient of φ_i + (wd/2)||w||²). The client
keeps g_i, f̂_i and the round in its durable state; lost state means "did not take part".
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from adaptfl.algorithms import wire
from adaptfl.client_app.terms import LocalTerm, RoundInputs, TermOutput, add_to_grads_

STATE = "hafedho"
RECTIFY_MODES = ("objective", "gradient")


def rectification(g_prev: Mapping[str, torch.Tensor] | None, f_prev: float,
                  own: Mapping[str, torch.Tensor] | None, own_f: float, p_i: float,
                  took_part: bool) -> tuple[dict[str, torch.Tensor], float]:
    """(h, f) of the participation rule; zeros when the server has no g yet."""
    if g_prev is None:
        return {}, 0.0
    if took_part and own is not None:
        return {n: g - p_i * own[n] for n, g in g_prev.items()}, f_prev - p_i * own_f
    return {n: g.clone() for n, g in g_prev.items()}, f_prev


class HaFedHoTerm(LocalTerm):
    def __init__(self, inputs: RoundInputs) -> None:
        recipe = inputs.recipe
        if recipe.rectify not in RECTIFY_MODES:
            raise ValueError(f"invalid rectify={recipe.rectify!r}: choose one of {RECTIFY_MODES}")
        if recipe.mu < 0.0:
            raise ValueError(f"invalid mu={recipe.mu}: HaFedHo needs μ >= 0")
        self.inputs, self.mu, self.mode = inputs, recipe.mu, recipe.rectify
        self.p_i = len(inputs.indices) / inputs.dataset_size
        state, self.source = inputs.store.load(STATE)
        self.took_part = state is not None and int(state["round"]) == recipe.server_round - 1
        own = {n[2:]: t.to(inputs.start[n[2:]]) for n, t in state.items() if n.startswith("g.")} \
            if state is not None else None
        own_f = float(state["f-hat"]) if state is not None else 0.0
        f_record = inputs.incoming(wire.HAFEDHO_F_HAT)
        f_prev = float(f_record["f-hat"]) if f_record is not None else 0.0
        self.h, self.f = rectification(inputs.incoming(wire.HAFEDHO_G), f_prev, own, own_f,
                                       self.p_i, self.took_part)
        self.params = inputs.params

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        if self.mode != "objective" or not self.h:
            return None
        linear = torch.stack([(self.h[n] * (p - self.inputs.start[n])).sum()
                              for n, p in self.params.items()]).sum()
        return self.mu * (self.f + linear)

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        if self.mode == "gradient" and self.h:
            add_to_grads_(params, self.h, scale=self.mu)

    def finish(self, delta: Mapping[str, torch.Tensor], train_loss: float) -> TermOutput:
        lr = self.inputs.recipe.lr
        g_i = {f"g.{n}": -delta[n] / lr for n in self.params}  # Σ_k ∇φ_i(w_k) for plain SGD
        round_ = torch.tensor([self.inputs.recipe.server_round], dtype=torch.int64)
        self.inputs.store.save(STATE, {**g_i, "f-hat": torch.tensor([train_loss]), "round": round_})
        return TermOutput(metrics={wire.F_HAT: train_loss, wire.CLIENT_STATE: int(self.source),
                                   wire.TOOK_PART: int(self.took_part)})
