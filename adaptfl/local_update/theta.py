"""Θ, the shareable preconditioner state, on the wire (FedPAC, seed 001: Θ averaged and
warm-starting clients; FedMIX-P, seed 002: the shared reference P^r).

Keys are `"<parameter name>/<slot>"` with torch's slot names, so the server averages Θ by
name, never by position: Sophia `hessian` (h), Muon `momentum_buffer` (M of the Muon-managed
matrices), SOAP `gg<i>` (the Kronecker statistic of mode i; SOAP's L is gg0 and R is gg1).

`light` (fedpac-light, seed 001's light variant) uploads a compressed Θ that the server expands
before averaging:
Muon a rank-r truncated SVD `.us` [m, r] and `.v` [n·…, r] with r = ⌊c·m·n/(m+n+1)⌋; SOAP the
top-r eigenpairs `.vecs` [d, r], `.vals` [r] with r = ⌈c·d⌉; Sophia one mean per tensor `.mean`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from adaptfl.core.domain import FINITE, NONNEG, Domain
from adaptfl.local_update.rules import Preconditioner

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]
Tensors = dict[str, torch.Tensor]


def theta_spec(rule: Preconditioner, params: Sequence[tuple[str, Sequence[int]]],
               dtype: torch.dtype = torch.float32) -> Spec:
    """Names, shapes and dtypes of the full Θ of a model's parameters `(name, shape)`."""
    shapes = rule.theta_spec([(n, tuple(s)) for n, s in params])
    return {k: (shape, dtype) for k, shape in shapes.items()}


def muon_rank(shape: Sequence[int], c: float) -> int:
    m, n = shape[0], math.prod(shape[1:])
    return max(1, math.floor(c * m * n / (m + n + 1)))


def soap_rank(d: int, c: float) -> int:
    return max(1, min(d, math.ceil(c * d)))


def light_spec(full: Spec, c: float) -> Spec:
    """Shapes of the compressed upload for a full Θ spec."""
    out: Spec = {}
    for key, (shape, dtype) in full.items():
        slot = key.rsplit("/", 1)[1]
        if slot == "hessian":
            out[f"{key}.mean"] = ((1,), dtype)
        elif slot == "momentum_buffer":
            r = muon_rank(shape, c)
            out[f"{key}.us"] = ((shape[0], r), dtype)
            out[f"{key}.v"] = ((math.prod(shape[1:]), r), dtype)
        else:
            r = soap_rank(shape[0], c)
            out[f"{key}.vecs"] = ((shape[0], r), dtype)
            out[f"{key}.vals"] = ((r,), dtype)
    return out


def light_domain(rule: Preconditioner, key: str) -> Domain:
    """Domain of one compressed entry: a mean or eigenvalues of a ≥ 0 / PSD slot are ≥ 0; the
    factors (.us, .v, .vecs) may hold any finite value."""
    base, _, part = key.rpartition(".")
    full = rule.theta_domain(base.rsplit("/", 1)[1])
    return NONNEG if part in ("mean", "vals") and (full.nonneg or full.psd) else FINITE


def compress(theta: Mapping[str, torch.Tensor], c: float) -> Tensors:
    out: Tensors = {}
    for key, t in theta.items():
        slot = key.rsplit("/", 1)[1]
        if slot == "hessian":
            out[f"{key}.mean"] = t.mean().reshape(1)
        elif slot == "momentum_buffer":
            r = muon_rank(t.shape, c)
            u, s, vh = torch.linalg.svd(t.reshape(t.shape[0], -1), full_matrices=False)
            out[f"{key}.us"] = (u[:, :r] * s[:r]).contiguous()
            out[f"{key}.v"] = vh[:r].T.contiguous()
        else:
            r = soap_rank(t.shape[0], c)
            vals, vecs = torch.linalg.eigh(t)  # ascending: the top r are the last columns
            out[f"{key}.vecs"] = vecs[:, -r:].contiguous()
            out[f"{key}.vals"] = vals[-r:].contiguous()
    return out


def expand(light: Mapping[str, torch.Tensor], full: Spec) -> Tensors:
    """The full-shape Θ the server averages: low-rank products and broadcast means."""
    out: Tensors = {}
    for key, (shape, _) in full.items():
        slot = key.rsplit("/", 1)[1]
        if slot == "hessian":
            out[key] = light[f"{key}.mean"].reshape(()).expand(shape).clone()
        elif slot == "momentum_buffer":
            out[key] = (light[f"{key}.us"] @ light[f"{key}.v"].T).reshape(shape)
        else:
            vecs = light[f"{key}.vecs"]
            out[key] = (vecs * light[f"{key}.vals"]) @ vecs.T
    return out


def drift(thetas: Sequence[Mapping[str, torch.Tensor]], mean: Mapping[str, torch.Tensor]) -> float:
    """Preconditioner drift mean_i Σ_tensors ||Θ_i - Θ̄||_F² (FedPAC, Figure 3)."""
    if not thetas:
        return 0.0
    total = sum(float((t[k].double() - mean[k].double()).square().sum()) for t in thetas for k in mean)
    return total / len(thetas)
