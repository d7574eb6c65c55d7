"""Thérien et al. 2025 (MuLoCo): DiLoCo with Muon as the kept inner optimizer (Muon on the hidden
matrices, AdamW on the rest, both states kept per worker), outer Nesterov momentum on p = -mean
Δ (server_rules/server_opt/nesterov.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class MuLoCo(AdaptiveStrategy):
    """`MuLoCo(fraction_train=..., <hyperparameters>)` with the paper's defaults (README key table)."""

    algorithm = "muloco"
