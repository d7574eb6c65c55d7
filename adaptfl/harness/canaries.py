"""The one-run audit's canaries of dp='central' (harness/privacy_audit.py's docstring): m
random unit directions over Δ's floating arrays, each included with probability ½, as slots of
the server's DP mean; and their scores and guesses, which node_canaries.py's canary nodes of
dp='client' share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from adaptfl.core import wire
from adaptfl.server_rules.aggregators import Tensors


@dataclass
class Canaries:
    """The audit's randomness (seeded: it is the auditor's, not the mechanism's) and its scores."""

    count: int
    seed: int = 0
    included: np.ndarray = field(init=False)  # S_i, bool [m]
    directions: torch.Tensor | None = None  # float32 [m, d], unit rows: drawn at the first Δ
    layout: list[tuple[str, torch.Size]] = field(default_factory=list)  # Δ's floating arrays
    scores: np.ndarray = field(init=False)  # Y_i, float64 [m]
    rounds: int = 0  # Δ releases scored

    def __post_init__(self) -> None:
        if self.count < 2:
            raise ValueError(f"--canaries {self.count}: need at least 2")
        self.rng = np.random.default_rng(self.seed)
        self.included = self.rng.random(self.count) < 0.5
        self.scores = np.zeros(self.count)

    def _draw(self, like: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """u_i: normalised Gaussian vectors over Δ's floating arrays (in `like`'s key order)."""
        self.layout = [(n, t.shape) for n, t in like.items() if t.is_floating_point()]
        dim = sum(int(np.prod(shape)) for _, shape in self.layout)
        # float32 throughout: m·d·4 bytes (1000 canaries on the 185k-parameter cnn: 0.74 GB)
        raw = self.rng.standard_normal((self.count, dim), dtype=np.float32)
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        self.directions = torch.from_numpy(raw)
        return self.directions

    def items(self, like: Mapping[str, torch.Tensor], bound: float) -> list[Tensors]:
        """The m slots of Δ's mean: C·u_i where included, zeros where not (integer arrays: 0)."""
        directions = self.directions if self.directions is not None else self._draw(like)
        zero = {n: torch.zeros_like(t) for n, t in like.items()}
        out = []
        for i in range(self.count):
            if not self.included[i]:
                out.append(zero)
                continue
            parts = torch.split(directions[i] * bound, [int(np.prod(s)) for _, s in self.layout])
            item = dict(zero)
            item.update({n: p.view(s).to(like[n].dtype)
                         for (n, s), p in zip(self.layout, parts, strict=True)})
            out.append(item)
        return out

    def slots(self, like: Mapping[str, torch.Tensor], record: str, bound: float, share: float,
              server_round: int) -> tuple[list[Tensors], list[float]]:
        """The m slots of one record's DP mean and their weights: Δ's canaries (`items`), zero
        items elsewhere (a canary shares nothing else: every mean keeps n + m items)."""
        if record == wire.DELTA:
            return self.items(like, bound), [share] * self.count
        return [{n: torch.zeros_like(t) for n, t in like.items()}] * self.count, [share] * self.count

    def score(self, released: Mapping[str, torch.Tensor]) -> None:
        """Y_i += ⟨Δ̃_t, u_i⟩ for this round's released Δ̃_t."""
        assert self.directions is not None
        flat = torch.cat([released[n].reshape(-1).float() for n, _ in self.layout])
        self.scores += (self.directions @ flat).double().numpy()
        self.rounds += 1

    def correct(self, k_in: int, k_out: int) -> int:
        """W: "included" right among the k_in highest scores plus "excluded" among the k_out lowest."""
        if k_in < 0 or k_out < 0 or k_in + k_out > self.count:
            raise ValueError(f"guesses {k_in}+{k_out} must be >= 0 and at most the {self.count} canaries")
        order = np.argsort(self.scores, kind="stable")
        high = order[self.count - k_in:] if k_in else order[:0]
        return int(self.included[high].sum() + (~self.included[order[:k_out]]).sum())
