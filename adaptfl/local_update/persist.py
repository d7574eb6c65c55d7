"""A `LocalUpdate`'s own state as named tensors, for a client that keeps its inner optimizer
across the rounds it takes part in (DiLoCo, MuLoCo: `local-state='persist'`).

What is kept: every entry of every parameter's state (Adam's `exp_avg`/`exp_avg_sq`, Muon's
`momentum_buffer`, SOAP's statistics and bases, Sophia's `hessian`, the step counts and flags),
as `"<parameter>/<entry>"`. What is not: what the server sends afresh every round (Δ_G as
`global_direction`, FedMIX-P's frozen `ref_*` references), and the per-round settings the recipe
gives (lr, weight decay, ρ). Python scalars travel as one-element tensors: int64 for counts,
bool for flags, float64 for floats; `import_local_state` turns them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]
_SKIP_PREFIX = "ref_"
_SKIP = {"global_direction"}


def _kept(entry: str) -> bool:
    return entry not in _SKIP and not entry.startswith(_SKIP_PREFIX)


def _as_tensor(value: Any) -> torch.Tensor | None:
    if torch.is_tensor(value):
        return value.detach().cpu().clone()
    if isinstance(value, bool):
        return torch.tensor([value], dtype=torch.bool)
    if isinstance(value, int):
        return torch.tensor([value], dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor([value], dtype=torch.float64)
    return None  # nothing else lives in a rule's state


def _as_value(t: torch.Tensor, like: Any) -> Any:
    """The stored tensor as the kind of value the fresh state holds (a scalar stays a scalar)."""
    if isinstance(like, bool) or (like is None and t.dtype == torch.bool and t.shape == (1,)):
        return bool(t.item())
    if isinstance(like, int) or (like is None and t.dtype == torch.int64 and t.shape == (1,)):
        return int(t.item())
    if isinstance(like, float):
        return float(t.item())
    return t


def export_local_state(opt: Any) -> Tensors:
    """{"<parameter>/<entry>": tensor} of everything the next round's steps would read."""
    out: Tensors = {}
    for name, p in opt.named():
        for entry, value in opt.state[p].items():
            t = _as_tensor(value) if _kept(entry) else None
            if t is not None:
                out[f"{name}/{entry}"] = t
    return out


def why_unusable(opt: Any, tensors: Mapping[str, torch.Tensor]) -> str | None:
    """Why a stored state cannot be this optimizer's (another model, another rule), or None."""
    by_name = dict(opt.named())
    for key, t in tensors.items():
        name, _, entry = key.rpartition("/")
        if name not in by_name:
            return f"state for parameter {name!r}, which this model lacks"
        fresh = opt.state[by_name[name]].get(entry)
        if torch.is_tensor(fresh) and tuple(fresh.shape) != tuple(t.shape):
            return f"{key} has shape {tuple(t.shape)}, expected {tuple(fresh.shape)}"
        if not t.is_floating_point() and t.dtype not in (torch.int64, torch.bool):
            return f"{key} has dtype {t.dtype}"
    counted = {k.rpartition("/")[0] for k in tensors if k.endswith("/step")}
    if counted != set(by_name):  # every parameter's step count: a partial state is not a state
        return f"step counts for {len(counted)} of {len(by_name)} parameters"
    return None


def import_local_state(opt: Any, tensors: Mapping[str, torch.Tensor]) -> str | None:
    """Load a stored state into a freshly built optimizer; returns why it was refused (then the
    optimizer is left untouched), or None. Slots that are views into an elementwise group's flat
    buffer are copied into, so the flat step keeps seeing them."""
    why = why_unusable(opt, tensors)
    if why is not None:
        return why
    by_name = dict(opt.named())
    for key, t in tensors.items():
        name, _, entry = key.rpartition("/")
        st = opt.state[by_name[name]]
        fresh = st.get(entry)
        if torch.is_tensor(fresh):
            fresh.copy_(t)
        elif fresh is not None or t.shape == (1,) and t.dtype in (torch.int64, torch.bool):
            st[entry] = _as_value(t, fresh)
        else:  # a tensor the rule creates later (SOAP's bases): on the parameter's device
            st[entry] = t.to(by_name[name].device).clone()
    return None
