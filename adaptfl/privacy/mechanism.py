"""The Gaussian mechanism over a client's whole contribution, record by record.

What a client shares in a round is k records: Δ, the algorithm's uploads (v, Θ_i, Δc, ∇f_i(x))
and the reply metrics the server averages into its state (HaFedHo's f̂_i, as a 1-element record).
The clipping norm is split across them: record j is clipped on its own to C_j (Δ: dp-clip-norm,
every other record: dp-state-clip-norm, or each one's adaptive value), and record j's sum gets
noise of std z·√k·C_j. Rescaling record j by 1/(z·√k·C_j) makes the k records one vector whose
sum has L2 sensitivity √(Σ_j (C_j/(z√k·C_j))²) = 1/z under unit noise: one Gaussian mechanism with
noise multiplier z over everything the client shares, whatever the records' scales (v ~ 1e-6,
SOAP's statistics ~ 1e2), each record keeping the same signal-to-noise.

    central  the server clips each accepted reply's records (after decoding: what the client
             computed, never a norm it reports), takes their mean and adds N(0, (z√k·C_j·b)²)
             to record j's mean, b = 1/m for m uniform weights; with weighting='examples' the
             shares are capped at s = max-weight-share and b = max(1/m, s) (a client moves a
             capped mean by at most 2·s·C_j when replaced, as it moves a uniform one by 2·C_j/m)
    client   each client clips its records to C_j and adds N(0, (z√k·C_j)²/n) itself, n the
             sampled count (at least its own floor: privacy/client.py): the m ≤ n noises sum
             to variance (m/n)·(z√k·C_j)², accounted as noise multiplier z·√(m/n); the server
             averages uniformly and adds nothing

Adaptive clipping (central only): per record, C_j <- C_j·exp(-η(b̃_j - γ)), b̃_j the share of
replies within C_j, counted with noise N(0, σ_b²) on the centred bits; the records' noise
multiplier then is z_r = (z⁻² - k/(2σ_b)²)^(-1/2), so records and counts together spend z
(Andrew et al. 2021, Thm 1, for k records). After the noise, every mean goes back into its
record's domain (v ≥ 0, Θ's SOAP statistics symmetric PSD): post-processing, free of privacy cost.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from adaptfl.core import wire
from adaptfl.core.contract import Contract
from adaptfl.core.domain import FINITE, Domain
from adaptfl.core.privacy_settings import Privacy
from adaptfl.server_rules.aggregate import weighted_mean
from adaptfl.server_rules.aggregators import Combine, Items, Tensors, flat
from adaptfl.server_rules.aggregators.clip import clipped

NORMS = "dp-clip-norm"  # the combine's memory slot (server state "aggregator/dp-clip-norm")
ALIASES = {wire.THETA: wire.THETA_LOCAL}  # the record a stage combines under another name


def shared_records(contract: Contract) -> list[str]:
    """Every record a client shares: Δ, the uploads, the metrics the server averages."""
    return [wire.DELTA, *contract.up, *sorted(contract.up_metrics)]


def start_bound(privacy: Privacy, record: str) -> float:
    return privacy.dp_clip_norm if record == wire.DELTA else privacy.dp_state_clip_norm


def round_seed(dp_seed: int, *parts: object) -> int | None:
    """The noise seed of one release (a round, a client): None (the OS CSPRNG, no seed at all)
    unless dp-seed is set, which Privacy.check allows only with dp-testing-reproducible-noise."""
    if dp_seed < 0:
        return None
    digest = hashlib.sha256("/".join(map(str, (dp_seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little")


class OsGaussian:
    """N(mean, std²) from the OS CSPRNG (`os.urandom`, the kernel's ChaCha20/getrandom): every
    draw reads fresh kernel entropy-seeded bytes, so there is no seed to search (a 2^32 seed space
    was searchable; this one is the kernel CSPRNG's ≥ 256-bit state). 53-bit uniforms from 64
    random bits each, then Box-Muller. Mironov's low-bit attack on float Gaussians is not closed
    (docs/privacy.md)."""

    def normal(self, mean: float, std: float, size: int | tuple[int, ...] | None = None
               ) -> np.ndarray | float:
        shape = () if size is None else ((size,) if isinstance(size, int) else tuple(size))
        count = int(np.prod(shape, dtype=np.int64))
        half = (count + 1) // 2
        bits = np.frombuffer(secrets.token_bytes(16 * half), dtype=np.uint64) >> np.uint64(11)
        u = (bits.astype(np.float64) + 0.5) * 2.0 ** -53  # in (0, 1): log never sees 0
        radius = np.sqrt(-2.0 * np.log(u[:half]))
        angle = 2.0 * math.pi * u[half:]
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]
        out = mean + std * z.reshape(shape)
        return float(out) if size is None else out


Noise = np.random.RandomState | OsGaussian


def noise_source(seed: int | None) -> Noise:
    """The OS CSPRNG, or (seed given: tests only) NumPy's RandomState as Flower's DP draws it."""
    return OsGaussian() if seed is None else np.random.RandomState(seed)


def add_noise(tensors: Mapping[str, torch.Tensor], std: float, rng: Noise) -> Tensors:
    """t + N(0, std²) on every floating array, drawn in key order as Flower's
    `add_gaussian_noise_inplace` draws them (same seed, same noise); integer buffers unchanged."""
    out = {}
    for name, t in tensors.items():
        if t.is_floating_point() and std > 0.0:
            noise = torch.from_numpy(rng.normal(0.0, std, tuple(t.shape)))
            out[name] = (t.to(torch.float64) + noise).to(t.dtype)
        else:
            out[name] = t
    return out


def records_noise_multiplier(privacy: Privacy, k: int, count_stddev: float) -> float:
    """z_r: what each record's noise gets when the clipped counts take their share of z."""
    if not privacy.adaptive:
        return privacy.dp_noise_multiplier
    rest = privacy.dp_noise_multiplier ** -2 - k / (2.0 * count_stddev) ** 2
    if rest <= 0.0:
        raise ValueError(f"dp-count-stddev={count_stddev:g}: the clipped counts of {k} records "
                         f"alone spend more than dp-noise-multiplier={privacy.dp_noise_multiplier:g}; "
                         f"use dp-count-stddev > {math.sqrt(k) * privacy.dp_noise_multiplier / 2:g}")
    return float(rest ** -0.5)


@dataclass
class GaussianMean:
    """The combine of every shared record under dp (in place of the aggregator; only the mean
    composes with DP: see algorithms/privacy_checks.py)."""

    privacy: Privacy
    k: int  # records a client shares
    share_bound: float  # b: the largest share one reply may have in a mean
    seed: int | None  # this round's noise seed; None: the OS CSPRNG
    count_stddev: float = 1.0  # σ_b of the adaptive clipped counts
    combined: list[str] = field(default_factory=list)  # records combined this round

    def __post_init__(self) -> None:
        self.rng = noise_source(self.seed)

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        name = ALIASES.get(record, record)
        if name in self.combined:  # a second release of one record would spend z twice
            raise RuntimeError(f"record {name!r} combined twice in one round under dp")
        self.combined.append(name)
        if self.privacy.dp == "client":  # noised by the clients: the mean, back into the domain
            return ctx.project(record, weighted_mean(items, weights))
        bound = self._bound(name, ctx)
        norms = [float(flat(item).norm()) for item in items]
        out = weighted_mean([clipped(dict(item), n, bound) for item, n in zip(items, norms, strict=True)],
                            weights)
        z = records_noise_multiplier(self.privacy, self.k, self.count_stddev)
        std = z * math.sqrt(self.k) * bound * self.share_bound
        out = ctx.project(record, add_noise(out, std, self.rng))  # post-processing
        if self.privacy.adaptive:
            self._adapt(name, bound, norms, self.count_stddev, ctx)
        if name == wire.DELTA:
            ctx.stats.update({"dp-clip-norm": bound, "dp-noise-std": std})
        return out

    def _bound(self, name: str, ctx: Combine) -> float:
        kept = ctx.memory.get(NORMS, {}).get(name)
        return float(kept) if kept is not None else start_bound(self.privacy, name)

    def _adapt(self, name: str, bound: float, norms: list[float], count_stddev: float,
               ctx: Combine) -> None:
        """C <- C·exp(-η(b̃ - γ)), b̃ the noised share of the replies within C."""
        centred = sum((n <= bound) - 0.5 for n in norms) + float(self.rng.normal(0.0, count_stddev))
        within = centred / len(norms) + 0.5
        new = bound * math.exp(-self.privacy.dp_clip_lr * (within - self.privacy.dp_clip_quantile))
        ctx.new_memory.setdefault(NORMS, {})[name] = torch.tensor([new], dtype=torch.float64)
        if name == wire.DELTA:
            ctx.stats["dp-unclipped-share"] = within  # noised: a release, not a raw count


def privatize(records: Mapping[str, Tensors], metrics: Mapping[str, float | int],
              names: Sequence[str], privacy: Privacy, reply_z: float, seed: int | None,
              noised: bool = True) -> tuple[dict[str, Tensors], dict[str, float | int]]:
    """dp='client': clip each shared record to its C and add this client's share of the noise,
    N(0, (reply_z·√k·C)²), reply_z = z/√n for n sampled, or the node's floor when that is more
    (privacy/client.py `check_floor`). Records are given by name; metrics in `names` are
    1-element records. `noised=False`: clip only (under SecAgg+ the noise is discrete, added to
    the integers)."""
    rng = noise_source(seed)
    k = len(names)
    std_of = {n: reply_z * math.sqrt(k) * start_bound(privacy, n) if noised else 0.0 for n in names}
    out_records, out_metrics = dict(records), dict(metrics)
    for name in names:
        bound = start_bound(privacy, name)
        if name in records:
            item = dict(records[name])
            out_records[name] = add_noise(clipped(item, float(flat(item).norm()), bound), std_of[name], rng)
        elif name in metrics:
            value = float(metrics[name])
            value = max(-bound, min(bound, value)) + float(rng.normal(0.0, std_of[name]))
            out_metrics[name] = value
        else:
            raise ValueError(f"dp='client': the reply lacks the shared record {name!r}")
    return out_records, out_metrics


def reply_domains(contract: Contract, privacy: Privacy) -> dict[str, dict[str, Domain]]:
    """What replies are checked against: under dp='client' a noised v or Θ_i may leave its domain
    (the server's mean goes back into it), so only finiteness (and Δ's squarability) is asked."""
    domains = contract.reply_domains()
    if privacy.dp != "client":
        return domains
    return {record: (arrays if record == wire.DELTA else dict.fromkeys(arrays, FINITE))
            for record, arrays in domains.items()}


def metric_domains(contract: Contract, privacy: Privacy) -> dict[str, Domain]:
    if privacy.dp != "client":
        return dict(contract.metric_domains)
    return dict.fromkeys(contract.metric_domains, FINITE)
