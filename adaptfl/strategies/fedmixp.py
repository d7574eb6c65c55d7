"""FedMIX-P (seed 002): at every local step the applied preconditioner is
(1-λ_r)·P^r + λ_r·P_i, the shared reference mixed with the client's own; the server averages
the terminal P_i into the next reference (algorithms/components/sharing.py, `mix`)."""

from __future__ import annotations

from adaptfl.strategies.fedpac import FedPAC


class FedMIXP(FedPAC):
    """`FedMIXP(optimizer="soap", mix_lambda=0.5, lambda_schedule="constant", ...)`."""

    algorithm = "fedmixp-soap"
    family = "fedmixp"
