"""Which values an array on the wire, or in the server state, may hold beyond "finite".

A record's arrays are checked twice: every reply on arrival (a hostile client's value is
dropped with that one reply) and the new server state after aggregation (a round whose result
leaves the domain is refused and the state kept). The component that owns a record declares its
domain next to it (`Record(domain=...)` in contract.py), so the math that needs `v ≥ 0` is the
place that says so:

    FINITE      every value finite (what validation always demanded)
    SQUARABLE   finite after squaring at float32, |x| < 1.8e19: Δ under the server rules that
                square it (FedAdam, FedYogi, FedAdagrad, FedAdamom), and every uploaded record
                and metric besides Δ (`bounded`: Δc, v, Θ_i, f̂_i)
    NONNEG      ≥ 0: Sophia's h, the server rules' own v
    MOMENT      ≥ 0 and squarable: FedACT's v and v̄ (seed 000, Algorithm 1: sqrt(v̂))
    PSD         symmetric positive semi-definite matrices: SOAP's Kronecker statistics

Only floating-point arrays are checked (integer buffers such as BatchNorm's counter are exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

# |x| below this squares to a finite float32 (x² ≤ 3.4e38)
SQUARE_BOUND = math.sqrt(torch.finfo(torch.float32).max)
# Relative slack of the symmetry and PSD checks: float32 sums of outer products are symmetric
# PSD in exact arithmetic and off by rounding in practice. Measured on SOAP's statistics of the
# CNN and the MLP after 20 steps: asymmetry ≤ 2e-7 of the largest entry, eigenvalues ≥ -4e-9 of
# the trace; the slacks leave 500x and 2500x of room for longer contractions.
SYMMETRY_SLACK = 1e-4
PSD_SLACK = 1e-5
NON_FINITE = "non-finite values (NaN or Inf)"


@dataclass(frozen=True)
class Domain:
    name: str
    nonneg: bool = False
    squarable: bool = False
    psd: bool = False

    def why_outside(self, t: torch.Tensor) -> str | None:
        """A one-line reason `t` is outside this domain, or None."""
        if not t.is_floating_point():
            return None
        if self.squarable:  # one pass: the largest |value| is NaN or inf where any value is
            peak = float(t.abs().max()) if t.numel() else 0.0
            if not math.isfinite(peak):
                return NON_FINITE
            if peak >= SQUARE_BOUND:
                return f"|value| {peak:.3g} overflows float32 when squared (bound {SQUARE_BOUND:.3g})"
        elif not bool(torch.isfinite(t).all()):
            return NON_FINITE
        if self.nonneg and t.numel() and float(t.min()) < 0.0:
            return f"negative values (min {float(t.min()):.3g}) where only >= 0 is meaningful"
        if self.psd:
            return _why_not_psd(t)
        return None

    def project(self, t: torch.Tensor) -> torch.Tensor:
        """The nearest point of the domain (Frobenius norm), for rules that combine coordinates
        one by one (median, trimmed mean): those keep v ≥ 0 by themselves but not PSD."""
        if self.psd and t.ndim == 2:
            sym = 0.5 * (t.double() + t.double().T)
            vals, vecs = torch.linalg.eigh(sym)
            return torch.matmul(vecs * vals.clamp(min=0.0), vecs.T).to(t.dtype)
        if self.nonneg:
            return t.clamp(min=0.0)
        return t


def _why_not_psd(t: torch.Tensor) -> str | None:
    if t.ndim != 2 or t.shape[0] != t.shape[1]:
        return f"shape {tuple(t.shape)} is not a square matrix"
    a = t.double()
    scale = float(a.abs().max())
    if scale == 0.0:
        return None
    if float((a - a.T).abs().max()) > SYMMETRY_SLACK * scale:
        return "not symmetric"
    # PSD iff A + δI is positive definite for every δ > 0; δ relative to the trace (≥ the top
    # eigenvalue) tolerates rounding and catches any eigenvalue below -δ. Cholesky is O(d³/3).
    delta = PSD_SLACK * max(float(a.diagonal().sum()), scale)
    _, info = torch.linalg.cholesky_ex(0.5 * (a + a.T) + delta * torch.eye(a.shape[0], dtype=a.dtype))
    return None if int(info) == 0 else "not positive semi-definite (a negative eigenvalue)"


def bounded(domain: Domain) -> Domain:
    """`domain` with |x| < SQUARE_BOUND: every record and metric a client uploads (Δc, v, Θ_i,
    ∇f_i(x), f̂_i) is held to it on arrival (a finite Δc of 1e30 once went into
    SCAFFOLD's c and every later honest reply overflowed); the screen's and the drift's norms
    square it, and no honest state comes within 1e15 of it. Δ keeps its server rule's domain."""
    return domain if domain.squarable else replace(domain, squarable=True)


FINITE = Domain("finite")
SQUARABLE = Domain("squarable", squarable=True)
NONNEG = Domain("non-negative", nonneg=True)
MOMENT = Domain("second moment", nonneg=True, squarable=True)
PSD = Domain("symmetric PSD", psd=True)
