"""SCAFFOLD's client side, option II (Karimireddy et al., ICML 2020, Alg. 1, lines 10-12):

    y <- y - lr·(∇f_i(y) - c_i + c)                    every local step
    c_i⁺ = c_i - c + (x - y) / (K·lr)                  option II, after the K steps
    upload Δy = y - x and Δc_i = c_i⁺ - c_i

c comes from the server (zero before it has one); c_i is durable client state (zero when the
client never took part or its state was lost, as the paper's initialisation).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from adaptfl.algorithms import wire
from adaptfl.client_app.terms import LocalTerm, RoundInputs, TermOutput, add_to_grads_

STATE = "scaffold"


class ScaffoldTerm(LocalTerm):
    def __init__(self, inputs: RoundInputs) -> None:
        self.inputs = inputs
        zeros = {n: torch.zeros_like(t) for n, t in inputs.start.items()}
        self.c = inputs.incoming(wire.SCAFFOLD_C) or zeros
        state, self.source = inputs.store.load(STATE)
        self.c_i = {n: state[n].to(t) for n, t in inputs.start.items()} if state else zeros
        self.correction = {n: self.c[n] - self.c_i[n] for n in inputs.start}  # c - c_i

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        add_to_grads_(params, self.correction)

    def finish(self, delta: Mapping[str, torch.Tensor], train_loss: float) -> TermOutput:
        recipe = self.inputs.recipe
        scale = 1.0 / (recipe.local_steps * recipe.lr)
        c_plus = {n: self.c_i[n] - self.c[n] - delta[n].to(self.c_i[n]) * scale
                  for n in self.c_i}  # (x - y)/(K·lr) = -Δy/(K·lr)
        self.inputs.store.save(STATE, c_plus)
        delta_c = {n: (c_plus[n] - self.c_i[n]).cpu() for n in c_plus}
        return TermOutput(records={wire.DELTA_C: delta_c},
                          metrics={wire.CLIENT_STATE: int(self.source)})
