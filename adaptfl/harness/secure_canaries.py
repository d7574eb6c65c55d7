"""The audit's canary nodes inside SecAgg+ (dp='client', secagg='secagg+'): each canary node
makes its integers as a SecAgg+ node does (secagg/client.py): its dp floor and every server-sent
parameter checked and its own discrete noise std derived (`own_noise`), its Δ clipped
(`privatize(noised=False)`), encoded by stochastic rounding onto B steps of its range
(`fixedpoint.encode`) and given its share of discrete Gaussian noise (`noise.discrete_gaussian`).

    cohort   the round is sized for n + m nodes: B (`fixedpoint.budget`), the refusal check and
             the server's noise request (`node_noise_std`) count the canary nodes, as the recipe
             does (node_canaries.py), so every node re-derives the same B and noise
    the sum  the canary nodes' integers join the unmasked sum of the n live nodes before it is
             decoded (count n + m); their masks are left out, which is exact: pairwise and self
             masks cancel in the sum mod 2^bits, and B keeps the sum from wrapping
    canary   C·e_(j_i) encodes to B·e_(j_i) (range c = C under dp), zero to zero: its integers
             are needed on the m canary coordinates only

Cost: m² discrete Gaussian draws a round, about 5× a float Gaussian's (m = 2,000: 4·10⁶, a
second or two; m = 15,000: about 30 s of CPU).
"""

from __future__ import annotations

import contextlib
import hashlib
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import ConfigRecord

from adaptfl.algorithms.recipe import privacy_from_recipe
from adaptfl.core import wire
from adaptfl.core.privacy_settings import Privacy
from adaptfl.harness.node_canaries import CANARY, NodeCanaries
from adaptfl.privacy.mechanism import privatize
from adaptfl.secagg import aggregate, fixedpoint, noise
from adaptfl.secagg import protocol as p
from adaptfl.secagg.client import own_noise
from adaptfl.server_rules.aggregators import Tensors


@dataclass
class Round:
    """What a SecAgg+ round tells its nodes: the layout, B, the modulus, the noise request."""

    slots: list[fixedpoint.Slot]
    bound: int
    bits: int
    noise_std: float
    server_round: int


@dataclass
class SecureCanaries(NodeCanaries):
    """Canary nodes whose integers join SecAgg+'s sum (module docstring)."""

    bits: int = 32
    noise_std: float = 0.0  # the server's request of this round (for n + m nodes)
    positions: np.ndarray | None = field(default=None, repr=False)  # Δ's float values in the sum

    def slots(self, like: Mapping[str, torch.Tensor], record: str, bound: float, share: float,
              server_round: int) -> tuple[list[Tensors], list[float]]:
        return [], []  # their integers are in the decoded sum already

    def _place(self, slots: list[fixedpoint.Slot]) -> np.ndarray:
        """j_i as indices of the summed vector (Δ's floating slots, in the layout's order)."""
        spans, start = [], 0
        for slot in slots:
            if slot.record == wire.DELTA and slot.dtype.is_floating_point:
                spans.append(np.arange(start, start + slot.size))
            start += slot.size
        self.layout = [(s.name, torch.Size(s.shape)) for s in slots
                       if s.record == wire.DELTA and s.dtype.is_floating_point]
        flat = np.concatenate(spans)
        if len(flat) < self.count:
            raise ValueError(f"--canaries {self.count}: Δ has only {len(flat)} values, one per canary node")
        self.coords = self.rng.choice(len(flat), self.count, replace=False)
        self.positions = flat[self.coords]
        return self.positions

    def integers(self, i: int, rnd: Round, privacy: Privacy) -> np.ndarray:
        """Canary node i's integers on the m canary coordinates, as its SecAgg+ node code makes them."""
        assert self.recipe is not None
        recipe = ConfigRecord(dict(self.recipe))
        std = own_noise(recipe, ConfigRecord({p.NOISE_STD: rnd.noise_std}), rnd.slots, rnd.bits,
                        rnd.bound, self.node_config)  # refuses as a node would
        delta = torch.zeros(self.count, dtype=torch.float32)
        if self.included[i]:
            delta[i] = privacy.dp_clip_norm
        others = {name: 0.0 for name in self.shared if name != wire.DELTA}
        records, _ = privatize({wire.DELTA: {CANARY: delta}}, others, self.shared, privacy, 0.0, None,
                               noised=False)
        clip = next(s.clip for s in rnd.slots if s.record == wire.DELTA)
        slot = fixedpoint.Slot(wire.DELTA, CANARY, (self.count,), torch.float32, clip)
        digest = hashlib.sha256(f"canary/{rnd.server_round}/{i}".encode()).digest()
        rounding = torch.Generator().manual_seed(int.from_bytes(digest[:7], "little"))
        q = fixedpoint.encode(records, {}, [slot], rnd.bound, rounding)
        noised: np.ndarray = q + noise.discrete_gaussian(std, len(q))
        return noised

    def add_to(self, total: np.ndarray, rnd: Round) -> np.ndarray:
        """The unmasked sum with the m canary nodes' integers added."""
        assert self.recipe is not None and wire.DELTA in self.shared  # set with the recipe
        positions = self.positions if self.positions is not None else self._place(rnd.slots)
        privacy, _ = privacy_from_recipe(self.recipe)
        canary_sum = np.zeros(self.count, dtype=np.int64)
        for i in range(self.count):
            canary_sum += self.integers(i, rnd, privacy)
        out = total.astype(np.int64).copy()
        out[positions] += canary_sum
        return out


@contextlib.contextmanager
def secure_cohort(canaries: SecureCanaries) -> Iterator[None]:
    """For the run inside: secure_round (secagg/aggregate.py) sizes B, its refusal check and its
    noise request for n + m nodes, and decodes the sum with the canary nodes' integers in it."""
    m, original = canaries.count, aggregate.node_noise_std
    sized = types.SimpleNamespace(**vars(fixedpoint))
    sized.budget = lambda bits, sampled, *rest: fixedpoint.budget(bits, sampled + m, *rest)
    sized.refusal = lambda bits, sampled, *rest: fixedpoint.refusal(bits, sampled + m, *rest)

    def request(privacy: Privacy, bound: int, slots: list[fixedpoint.Slot], sampled: int) -> float:
        canaries.noise_std = original(privacy, bound, slots, sampled + m)
        return canaries.noise_std

    def decode(total: np.ndarray, slots: list[fixedpoint.Slot], bound: int, count: int
               ) -> tuple[dict[str, Tensors], dict[str, float]]:
        rnd = Round(slots, bound, canaries.bits, canaries.noise_std, canaries.server_round)
        return fixedpoint.decode_mean(canaries.add_to(total, rnd), slots, bound, count + m)

    sized.decode_mean = decode
    setattr(aggregate, "fixedpoint", sized)  # noqa: B010 - restored below
    setattr(aggregate, "node_noise_std", request)  # noqa: B010
    try:
        yield
    finally:
        setattr(aggregate, "fixedpoint", fixedpoint)  # noqa: B010
        setattr(aggregate, "node_noise_std", original)  # noqa: B010
