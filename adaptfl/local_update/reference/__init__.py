"""The readable reference of every local step: pure, out-of-place functions over C clients at once.

Every tensor carries a leading client dimension C (one client is C = 1), so the same functions
are the oracle the fast paths are tested against and the batched step of the cohort engine
(`adaptfl/engine/cohort.py`). Nothing here writes into its inputs; each stage returns new
tensors and a new state dict, as `optax`'s transforms do, and the order of the stages is the
algorithm:

    d, c = direction(g)            the rule (elementwise.py: sgd, adam/adamw, sophia; Muon's
                                   and SOAP's per-matrix rules have no batched form here: the
                                   cohort runs each client's own step, rules/muon.py, soap.py)
    u = (1-ρ)·(c/L)·d + ρ·Δ_G      correction by the server's global direction
    φ = trust(u ⊙ g)               α on the top ⌊τD⌋ scores, γ elsewhere (act); or cautious
    x = (1-δ)·x - L·φ ⊙ u          decoupled weight decay, then the step

`LocalUpdate` (shell.py) runs the same arithmetic in place, on one client, through torch's
fused kernels or the native CPU loops; tests/local_update/test_reference.py holds each of those
paths to these functions.
"""

from adaptfl.local_update.reference.elementwise import (
    Chain,
    State,
    direction,
    elementwise_step,
    modulate,
    move,
    refresh_hessian,
    supports,
)
from adaptfl.local_update.reference.selection import top_k_mask

__all__ = ["Chain", "State", "direction", "elementwise_step", "modulate", "move", "refresh_hessian",
           "supports", "top_k_mask"]
