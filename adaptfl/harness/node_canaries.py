"""The audit's canaries for dp='client' (harness/privacy_audit.py): m canary **nodes**, each
clipping and noising its own reply with the node's own code (`privacy.client.check_floor` for
the noise multiplier the recipe and its floor give, `privacy.mechanism.privatize` for the clip
and the noise), so what is audited is the noise the nodes add, not a server-side stand-in.

    cohort     the canary nodes are in it: every instruction names n + m sampled nodes (the
               recipe's n), so every node, real or canary, adds N(0, (z√k·C)²/(n + m)) and the
               n + m shares sum to the noise of z√k·C the accountant books for a cohort
    canary i   a node whose Δ is C·e_(j_i) when included (S_i), zero when not: one coordinate
               j_i of Δ's floating arrays, m distinct ones drawn from `--audit-seed`, so the
               canaries are orthogonal (no cross-talk) and a node's reply needs only the m
               canary coordinates (its noise elsewhere reaches no score; the run is for the
               audit). Its other shared records are zero (its k still counts them)
    score      Y_i = Σ_t Δ̃_t[j_i], Δ̃_t the released mean of round t

Each canary node draws its noise as a node does: from the OS CSPRNG, or from its round seed
when the run is TESTING ONLY (dp-testing-reproducible-noise, accepted by the node's floor).
Cost: m² noise draws a round (m = 10,000: 10⁸, about 6 s on the mlp).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from adaptfl.algorithms.recipe import privacy_from_recipe
from adaptfl.core import wire
from adaptfl.core.privacy_settings import Privacy
from adaptfl.harness.canaries import Canaries
from adaptfl.privacy.client import check_floor
from adaptfl.privacy.mechanism import privatize, round_seed
from adaptfl.server_rules.aggregators import Tensors

CANARY = "canary"  # the one array of a canary node's Δ: its m canary coordinates


@dataclass
class NodeCanaries(Canaries):
    """m canary nodes of dp='client' (module docstring)."""

    recipe: Mapping[str, Any] | None = None  # the round's recipe as the nodes receive it
    node_config: Mapping[str, Any] = field(default_factory=dict)  # every node's floor
    shared: list[str] = field(default_factory=list)  # the records a node shares (k of them)
    coords: np.ndarray | None = None  # j_i: int64 [m], into Δ's floating arrays, flattened
    server_round: int = 0  # of the recipe

    def _draw_coords(self, like: Mapping[str, torch.Tensor]) -> np.ndarray:
        self.layout = [(n, t.shape) for n, t in like.items() if t.is_floating_point()]
        dim = sum(int(np.prod(shape)) for _, shape in self.layout)
        if dim < self.count:
            raise ValueError(f"--canaries {self.count}: Δ has only {dim} values, one per canary node")
        self.coords = self.rng.choice(dim, self.count, replace=False)
        return self.coords

    def reply(self, i: int, server_round: int, privacy: Privacy, sampled: int) -> torch.Tensor:
        """Canary node i's noised Δ over the m canary coordinates, as its node code makes it
        from the recipe's dp settings and n."""
        reply_z = check_floor(privacy, sampled, self.node_config)  # refuses as a node would
        delta = torch.zeros(self.count, dtype=torch.float32)
        if self.included[i]:
            delta[i] = privacy.dp_clip_norm
        # the other shared records (zero) as 1-value records: privatize's k counts them
        others = {name: 0.0 for name in self.shared if name != wire.DELTA}
        seed = round_seed(privacy.dp_seed, "client", server_round, f"{CANARY}-{i}")
        records, _ = privatize({wire.DELTA: {CANARY: delta}}, others, self.shared, privacy,
                               reply_z, seed)
        return records[wire.DELTA][CANARY]

    def mean_item(self, like: Mapping[str, torch.Tensor], server_round: int) -> Tensors:
        """The mean of the m canary nodes' replies, as one Δ item (zero off their coordinates)."""
        coords = self.coords if self.coords is not None else self._draw_coords(like)
        assert self.recipe is not None and wire.DELTA in self.shared  # set with the recipe
        privacy, sampled = privacy_from_recipe(self.recipe)  # what every node reads from it
        total = torch.zeros(self.count, dtype=torch.float64)
        for i in range(self.count):
            total += self.reply(i, server_round, privacy, sampled).double()
        flat = torch.zeros(sum(int(np.prod(s)) for _, s in self.layout), dtype=torch.float64)
        flat[torch.from_numpy(coords)] = total / self.count
        out = {n: torch.zeros_like(t) for n, t in like.items()}
        parts = torch.split(flat, [int(np.prod(s)) for _, s in self.layout])
        out.update({n: p.view(s).to(like[n].dtype) for (n, s), p in zip(self.layout, parts, strict=True)})
        return out

    def slots(self, like: Mapping[str, torch.Tensor], record: str, bound: float, share: float,
              server_round: int) -> tuple[list[Tensors], list[float]]:
        """One item standing for the m canary nodes' replies, weighing as m replies (dp='client'
        averages the replies uniformly, adding nothing: the nodes added the noise)."""
        if record == wire.DELTA:
            return [self.mean_item(like, server_round)], [share * self.count]
        return [{n: torch.zeros_like(t) for n, t in like.items()}], [share * self.count]

    def score(self, released: Mapping[str, torch.Tensor]) -> None:
        """Y_i += Δ̃_t[j_i]."""
        assert self.coords is not None
        flat = torch.cat([released[n].reshape(-1).double() for n, _ in self.layout])
        self.scores += flat[torch.from_numpy(self.coords)].numpy()
        self.rounds += 1
