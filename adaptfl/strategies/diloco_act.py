"""DiLoCo with FedACT's coordinate trust modulation (seed 000) on its inner AdamW steps: φ = α on
the top ⌊τD⌋ of u ⊙ g, γ elsewhere, x -= lr·φ⊙u, the AdamW state kept per worker, outer
Nesterov. A new combination: no published system has it (local_update/modulation.py,
algorithms/components/local_state.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class DiLoCoACT(AdaptiveStrategy):
    """`DiLoCoACT(fraction_train=..., <hyperparameters>)` with the paper's defaults (README key table)."""

    algorithm = "diloco-act"
