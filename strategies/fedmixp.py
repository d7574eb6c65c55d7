"""FedMIX-P's server (seed 002; spec §4): the next round's shared reference is the average of
the clients' terminal preconditioner states, P^{r+1} = mean P_i, and x <- x + mean Δ_i
(γ_s = K·lr: plain averaging).

The server rule is FedPAC's alignment; what differs is on the client (the recipe's λ_r mixes
P^r with the client's own P_i at every step, local_update/second_order.py). P travels in the
same records as Θ (`theta` down, `theta-i` up). The correction g_G is sent only when a run
turns it on (ρ > 0), e.g. to combine FedMIX-P with FedPAC's correction.
"""

from __future__ import annotations

from adaptfl.strategies.fedpac import FedPACStrategy


class FedMIXPStrategy(FedPACStrategy):
    """P^r down, P_i up; averaging, drift and light uploads as FedPAC."""
