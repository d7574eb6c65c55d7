"""Fixed point: a reply's shared records as one vector of integers mod 2^m, and back.

The layout is the contract's: the shared records in `shared_records` order (Δ, the uploads, the
averaged metrics as one value each), each record's arrays by name. A value x of a record with
range c is clipped into [-c, c] and becomes q = floor(x·B/c + U), U uniform in [0, 1): unbiased
stochastic rounding onto the integers of [-B, B] (integer arrays are sent as they are, clipped
into [-B, B]). The server picks B each round so that n such vectors, plus dp's noise to ten of
its standard deviations, sum inside (-2^(m-1-g), 2^(m-1-g)), g = GUARD_BITS: the signed sum
never wraps, its value over n is the mean to within c/B per value (the rounding's largest
error), and the ring keeps room outside what honest inputs reach, so that a sum beyond `reach`
is seen (a lying node's vector), not wrapped back into range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from adaptfl.core.contract import Contract, ModelSpec
from adaptfl.privacy.mechanism import shared_records

METRIC = "value"  # the one array of an averaged metric's record
MIN_BOUND = 2 ** 8  # fewer steps per value and the mean would be mostly rounding: refused
NOISE_SIGMAS = 10.0  # headroom for dp's summed noise: P(|N(0,1)| > 10) ≈ 1.5e-23 per value
# The ring is 2^g times what honest inputs reach: a garbage or shifted vector lands outside that
# reach on a coordinate with probability 1 - 2^-g, and the server refuses the sum (`reach`);
# each guard bit doubles c/B, the mean's step (1.9e-8 -> 7.6e-8 at 2^32, 5 nodes, c = 8).
GUARD_BITS = 2


@dataclass(frozen=True)
class Slot:
    """One array of the vector: its record, name, shape, dtype and range c."""

    record: str
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    clip: float

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def layout(contract: Contract, spec: ModelSpec, clip_of: Callable[[str], float]) -> list[Slot]:
    reply = contract.reply_spec(spec)
    out = []
    for record in shared_records(contract):
        if record in reply:
            out += [Slot(record, name, tuple(shape), dtype, clip_of(record))
                    for name, (shape, dtype) in sorted(reply[record].items())]
        else:  # a metric the server averages into its state (HaFedHo's f̂_i)
            out.append(Slot(record, METRIC, (1,), torch.float64, clip_of(record)))
    return out


def length(slots: list[Slot]) -> int:
    return sum(s.size for s in slots)


def budget(bits: int, sampled: int, noise_std: float = 0.0, rounding: float = 0.0) -> int:
    """B: the largest |q| one node may send, so that `sampled` vectors and their summed noise to
    NOISE_SIGMAS standard deviations stay inside (-2^(m-1-g), 2^(m-1-g)), g = GUARD_BITS.
    `noise_std` is the summed noise's std in units of B + `rounding` (dp: z√k, `rounding` the
    largest √d of a record, as `sensitivity` bounds it):
    n·B + NOISE_SIGMAS·noise_std·(B + rounding) <= 2^(m-1-g) - 1."""
    room = 2 ** (bits - 1 - GUARD_BITS) - 1 - NOISE_SIGMAS * noise_std * rounding
    return int(room // (sampled + NOISE_SIGMAS * noise_std))


def reach(bound: int, count: int, node_noise_std: float) -> float:
    """The largest |Σq| of one coordinate that `count` honest inputs reach: each |q| <= B, and
    their summed noise (each node's std `node_noise_std`) to NOISE_SIGMAS standard deviations.
    Within `budget`'s room whenever count <= sampled."""
    return count * bound + NOISE_SIGMAS * node_noise_std * math.sqrt(count)


def beyond_reach(total: np.ndarray, slots: list[Slot], bound: int, count: int, node_noise_std: float
                 ) -> str:
    """Why a decoded sum (int64) cannot be `count` honest inputs' ("" when it can): the first
    record with a coordinate beyond `reach`, and how many of its coordinates are."""
    limit = reach(bound, count, node_noise_std)
    start = 0
    for record in dict.fromkeys(s.record for s in slots):
        size = sum(s.size for s in slots if s.record == record)
        out = int(np.count_nonzero(np.abs(total[start:start + size]) > limit))
        start += size
        if out:
            return (f"secagg+: the unmasked sum of {count} inputs is beyond their reach (|Σq| <= "
                    f"{count}·B + noise margin = {limit:.6g}) on {out} of {size} coordinates of "
                    f"{record!r}: a node sent a vector outside its range; refused, never applied")
    return ""


def record_widths(slots: list[Slot]) -> dict[str, float]:
    """√d of each record: d its values, the arrays of the record together."""
    sizes: dict[str, int] = {}
    for slot in slots:
        sizes[slot.record] = sizes.get(slot.record, 0) + slot.size
    return {record: math.sqrt(d) for record, d in sizes.items()}


def sensitivity(bound: int, slots: list[Slot]) -> float:
    """One node's L2 reach on the integer vector under dp (each record clipped to its range):
    record j scales to norm at most B, and stochastic rounding adds less than 1 to each of its
    d_j values, so ‖q_j‖ < B + √d_j, and ‖q‖ < √(Σ_j (B + √d_j)²)."""
    return math.sqrt(sum((bound + width) ** 2 for width in record_widths(slots).values()))


def rounding_width(slots: list[Slot]) -> float:
    """The largest √d_j: what `budget` reserves beside B for the rounding."""
    return max(record_widths(slots).values(), default=0.0)


def refusal(bits: int, sampled: int, noise_std: float, slots: list[Slot]) -> str:
    """Why a round cannot be summed at this modulus ("" when it can): fewer than MIN_BOUND steps
    per value, or (under dp) a rounding reach √d_j above B, where the nodes' noise would be
    calibrated mostly to the rounding (docs/secagg.md, "Distributed DP")."""
    width = rounding_width(slots)
    bound = budget(bits, sampled, noise_std, width)
    if bound < MIN_BOUND:
        return (f"secagg-modulus-bits={bits}: {sampled} nodes leave {bound} integer steps per value "
                f"(fewer than {MIN_BOUND}); raise secagg-modulus-bits")
    if noise_std > 0.0 and width > bound:
        return (f"secagg-modulus-bits={bits}: the rounding's reach √d = {width:.0f} exceeds B = "
                f"{bound} steps, so dp's noise would be mostly for the rounding; raise "
                "secagg-modulus-bits")
    return ""


def encode(records: Mapping[str, Mapping[str, torch.Tensor]], metrics: Mapping[str, float | int],
           slots: list[Slot], bound: int, generator: torch.Generator | None) -> np.ndarray:
    """The integers (int64) of one reply; ValueError for a missing array or a wrong shape."""
    parts = []
    for slot in slots:
        if slot.name == METRIC and slot.record not in records:
            if slot.record not in metrics:
                raise ValueError(f"secagg: the reply lacks the metric {slot.record!r}")
            value = torch.tensor([float(metrics[slot.record])], dtype=torch.float64)
        else:
            found = records.get(slot.record, {}).get(slot.name)
            if found is None or tuple(found.shape) != slot.shape:
                raise ValueError(f"secagg: {slot.record}/{slot.name} is missing or not of shape {slot.shape}")
            value = found
        x = value.detach().to("cpu", torch.float64).reshape(-1)
        if not torch.isfinite(x).all():
            raise ValueError(f"secagg: {slot.record}/{slot.name} holds non-finite values")
        if slot.dtype.is_floating_point:
            scaled = x.clamp(-slot.clip, slot.clip) * (bound / slot.clip)
            q = torch.floor(scaled + torch.rand(x.numel(), generator=generator, dtype=torch.float64))
        else:
            q = torch.round(x)
        parts.append(q.clamp(-bound, bound).to(torch.int64).numpy())
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def to_ring(q: np.ndarray, bits: int) -> np.ndarray:
    """Signed integers as their residues mod 2^bits (uint64; two's complement)."""
    out = q.astype(np.int64).view(np.uint64)
    return out & np.uint64((1 << bits) - 1) if bits < 64 else out


def from_ring(s: np.ndarray, bits: int) -> np.ndarray:
    """Residues mod 2^bits back to the signed integers of (-2^(bits-1), 2^(bits-1)) (int64)."""
    s = s.astype(np.uint64)
    if bits == 64:
        return s.view(np.int64)
    signed = s.astype(np.int64)
    return np.where(signed >= (1 << (bits - 1)), signed - (1 << bits), signed)


def wire_dtype(bits: int) -> type[np.unsignedinteger]:
    return np.uint32 if bits <= 32 else np.uint64


def decode_mean(total: np.ndarray, slots: list[Slot], bound: int, count: int
                ) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, float]]:
    """(records, metrics): the mean of `count` replies from their summed integers (int64)."""
    records: dict[str, dict[str, torch.Tensor]] = {}
    metrics: dict[str, float] = {}
    start = 0
    for slot in slots:
        q = torch.from_numpy(total[start:start + slot.size].astype(np.float64))
        start += slot.size
        value = q * (slot.clip / bound) / count if slot.dtype.is_floating_point else q / count
        if slot.name == METRIC:
            metrics[slot.record] = float(value[0])
        else:
            records.setdefault(slot.record, {})[slot.name] = value.reshape(slot.shape).to(slot.dtype)
    return records, metrics
