"""Per-parameter state of `LocalUpdate` by NAME: slots that are views into one flat buffer per
elementwise group (so the flat step and torch's per-parameter `state` see the same memory),
warm starts of v̄, Δ_G and Θ by parameter name, the repacking after `load_state_dict`, and
the chain's own state (steps, ρ, trust rule, diagnostics) in torch's `state_dict`.

Torch's own `state_dict` keys parameters by position; names are how state crosses the wire.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from adaptfl.core.params import fields_of, lookup

Tensors = dict[str, torch.Tensor]


class NamedSlots:
    """Mixin of `LocalUpdate` (needs `param_groups`, `state`, `rule(group)`, `_flat` and the
    chain's settings that `state_dict` carries)."""

    param_groups: list[dict[str, Any]]
    state: Any
    _flat: list[dict[str, torch.Tensor]]
    steps: int
    rho: float
    correction: str
    step_offset: int
    mix_lambda: float
    diagnostics_every: int
    bs: int
    trust: Any
    _diag: dict[str, torch.Tensor]
    _diag_count: int
    _diag_pending: bool
    _scaled_key: Any
    _grad_views: dict[int, tuple[torch.Tensor, list[torch.Tensor]]]
    _buckets: dict[int, tuple[torch.Tensor, list[int]]]

    def rule(self, group: dict[str, Any]) -> Any:  # provided by LocalUpdate
        raise NotImplementedError

    def named(self) -> list[tuple[str, torch.Tensor]]:
        """(name, parameter) in order; unnamed parameters are called by their position."""
        out: list[tuple[str, torch.Tensor]] = []
        i = 0
        for group in self.param_groups:
            names = group.get("param_names") or [str(i + j) for j in range(len(group["params"]))]
            out.extend(zip(names, group["params"], strict=True))
            i += len(group["params"])
        return out

    def _by_name(self) -> dict[str, tuple[int, torch.Tensor]]:
        out: dict[str, tuple[int, torch.Tensor]] = {}
        for gi, group in enumerate(self.param_groups):
            names = group.get("param_names")
            for j, p in enumerate(group["params"]):
                out[names[j] if names else str(len(out))] = (gi, p)
        return out

    def _new_slot(self, gi: int, slot: str, values: Mapping[torch.Tensor, torch.Tensor] | None = None
                  ) -> None:
        group = self.param_groups[gi]
        params = group["params"]
        if not self.rule(group).elementwise:
            for p in params:
                src = None if values is None else values.get(p)
                self.state[p][slot] = torch.zeros_like(p) if src is None else src.detach().to(p).clone()
            return
        like = params[0].detach()
        flat = like.new_zeros(sum(p.numel() for p in params))
        self._flat[gi][slot] = flat
        for p, view in zip(params, torch.split(flat, [p.numel() for p in params]), strict=True):
            view = view.view_as(p)
            if values is not None and p in values:
                view.copy_(values[p])
            self.state[p][slot] = view

    def _repack(self) -> None:
        """After `load_state_dict`: loaded slots are separate tensors; put them back in the flat
        buffers so the flat path sees them."""
        self._flat = [{} for _ in self.param_groups]
        for gi, group in enumerate(self.param_groups):
            if not self.rule(group).elementwise:  # torch's load may alias the source's tensors
                for p in group["params"]:
                    self.state[p].update({k: v.clone() for k, v in self.state[p].items()
                                          if torch.is_tensor(v)})
                continue
            slots = {k for p in group["params"] for k, v in self.state[p].items()
                     if torch.is_tensor(v) and v.shape == p.shape}
            for slot in sorted(slots):
                self._new_slot(gi, slot, {p: self.state[p][slot] for p in group["params"]
                                          if slot in self.state[p]})

    def _set_slot(self, slot: str, tensors: Mapping[str, torch.Tensor], require_all: bool) -> None:
        by_name = self._by_name()
        unknown = sorted(set(tensors) - set(by_name))
        if unknown:
            raise ValueError(f"{slot}: tensors for parameters this optimizer lacks: {unknown[:5]}")
        if require_all:
            missing = sorted(set(by_name) - set(tensors))
            if missing:
                raise ValueError(f"{slot}: tensors missing for parameters {missing[:5]}")
        for name, t in tensors.items():
            p = by_name[name][1]
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{slot}[{name}] has shape {tuple(t.shape)}, parameter has "
                                 f"{tuple(p.shape)}")
        for gi, group in enumerate(self.param_groups):
            mine = {p: tensors[n] for n, (g, p) in by_name.items() if g == gi and n in tensors}
            if mine and (slot not in self.state[group["params"][0]]):
                self._new_slot(gi, slot, mine)
            else:
                for p, t in mine.items():
                    self.state[p][slot].copy_(t)

    def export_state(self, slot: str) -> Tensors:
        """A copy of one state slot (e.g. `exp_avg_sq`) as {parameter name: tensor}."""
        return {n: self.state[p][slot].detach().clone() for n, p in self.named() if slot in self.state[p]}

    def import_state(self, slot: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Warm-start one slot from {parameter name: tensor} (FedACT's v̄)."""
        self._set_slot(slot, tensors, require_all=False)

    def set_global_direction(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Δ_G (or FedPAC's g_G, MimeLite's m) for every parameter, by name."""
        self._set_slot("global_direction", tensors, require_all=True)

    # --- Θ: what FedPAC / FedMIX-P share ------------------------------------------------------
    def export_theta(self) -> Tensors:
        out = {}
        for n, p in self.named():
            st = self.state[p]
            group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
            for slot in self.rule(group).theta_shapes(n, tuple(p.shape)):
                if slot in st:
                    out[f"{n}/{slot}"] = st[slot].detach().clone()
        return out

    def import_theta(self, theta: Mapping[str, torch.Tensor], keep_reference: bool = False) -> None:
        """FedPAC's alignment: Θ^r becomes this client's state, and every parameter counts as
        warm-started (SOAP then steps fully at once). With `keep_reference` (FedMIX-P) a frozen
        copy stays as `ref_<slot>` for the mixing."""
        own = self.export_theta()
        unknown = sorted(set(theta) - set(own))
        if unknown:
            raise ValueError(f"Θ has entries this model lacks: {unknown[:5]}")
        by_name = self._by_name()
        for slot in sorted({k.rsplit("/", 1)[1] for k in theta}):
            entries = {k.rsplit("/", 1)[0]: v for k, v in theta.items() if k.rsplit("/", 1)[1] == slot}
            for name, t in entries.items():
                if tuple(t.shape) != tuple(own[f"{name}/{slot}"].shape):
                    raise ValueError(f"Θ[{name}/{slot}] has shape {tuple(t.shape)}, expected "
                                     f"{tuple(own[f'{name}/{slot}'].shape)}")
                self.state[by_name[name][1]][slot].copy_(t)
            if keep_reference:
                self._set_reference(f"ref_{slot}", entries, by_name)
        for _, p in self.named():
            self.state[p]["warm"] = True

    def _set_reference(self, slot: str, entries: Mapping[str, torch.Tensor],
                       by_name: Mapping[str, tuple[int, torch.Tensor]]) -> None:
        for gi, group in enumerate(self.param_groups):
            mine = {p: entries[n] for n, (g, p) in by_name.items() if g == gi and n in entries}
            if not mine:
                continue
            if self.rule(group).elementwise:
                self._new_slot(gi, slot, mine)
            else:
                for p, t in mine.items():
                    self.state[p][slot] = t.detach().to(p).clone()

    # --- flat buffers of an elementwise group ----------------------------------------------
    def flat_slots(self, gi: int = 0) -> dict[str, torch.Tensor]:
        """The elementwise group's live flat state buffers by slot (exp_avg, global_direction,
        ref_hessian, …), each [D] in the group's parameter order: the same memory as
        `state[p][slot]`, so writing them sets the state (the cohort engine's write-back)."""
        if not self.rule(self.param_groups[gi]).elementwise:
            raise ValueError(f"param group {gi} is not elementwise: its state is per tensor")
        return self._flat[gi]

    def has_flat_slot(self, slot: str, gi: int = 0) -> bool:
        """Whether group gi keeps `slot` as a flat buffer (Δ_G once the server sent one)."""
        return slot in self._flat[gi]

    def adopt_flat_slots(self, rows: Mapping[str, torch.Tensor], gi: int = 0) -> None:
        """Move the elementwise group's flat state into the given [D] tensors (rows of the
        cohort engine's stacked state): values copied there, then `state[p][slot]` views them."""
        params = self.param_groups[gi]["params"]
        sizes = [p.numel() for p in params]
        for slot, row in rows.items():
            row.copy_(self._flat[gi][slot])
            self._flat[gi][slot] = row
            for p, view in zip(params, torch.split(row, sizes), strict=True):
                self.state[p][slot] = view.view_as(p)

    def adopt_buckets(self, flats: Sequence[torch.Tensor]) -> None:
        """Take one [D_g] tensor per param group, which that group's parameters already are
        views of in order (the cohort engine's rows), as the groups' flat parameter buffers."""
        for gi, (group, flat) in enumerate(zip(self.param_groups, flats, strict=True)):
            params = group["params"]
            at = flat.data_ptr()
            for p in params:
                if p.data_ptr() != at:
                    raise ValueError(f"param group {gi}: its parameters are not views of the given "
                                     "buffer in order")
                at += p.numel() * p.element_size()
            self._buckets[gi] = (flat, [p.data_ptr() for p in params])

    def _flat_grad(self, gi: int, params: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The group's flat gradient buffer and its views shaped like the parameters (made once:
        one foreach copy fills it, cheaper than a cat of 150 reshaped tensors)."""
        made = self._grad_views.get(gi)
        like = params[0]
        if made is None or len(made[1]) != len(params) or made[0].device != like.device \
                or made[0].dtype != like.dtype:
            g = torch.empty(sum(p.numel() for p in params), dtype=like.dtype, device=like.device)
            views = [v.view_as(p) for v, p in zip(torch.split(g, [p.numel() for p in params]), params,
                                                  strict=True)]
            self._grad_views[gi] = made = (g, views)
        return made

    def _bucket(self, gi: int, params: list[torch.Tensor]) -> torch.Tensor:
        """The group's parameters as one flat tensor whose views they are (made, or made again
        when something replaced a parameter's `.data` since)."""
        made = self._buckets.get(gi)
        if made is not None and made[1] == [p.data_ptr() for p in params]:
            return made[0]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        for p, view in zip(params, torch.split(flat, [p.numel() for p in params]), strict=True):
            p.data = view.view_as(p)
        self._buckets[gi] = (flat, [p.data_ptr() for p in params])
        return flat

    # --- torch's state_dict, plus what the chain keeps outside the per-parameter state -------
    def state_dict(self) -> dict[str, Any]:
        # a mixin: torch.optim.Optimizer in LocalUpdate's MRO
        out: dict[str, Any] = super().state_dict()  # type: ignore[misc]
        out["local_update"] = {
            "steps": self.steps, "rho": self.rho, "correction": self.correction,
            "step_offset": self.step_offset, "mix_lambda": self.mix_lambda,
            "diagnostics_every": self.diagnostics_every, "diag_count": self._diag_count,
            "diag_pending": self._diag_pending, "bs": self.bs,
            "diag": {k: v.detach().clone() for k, v in self._diag.items()},
            "trust": {"name": self.trust.name,
                      "fields": {f.name: getattr(self.trust, f.name) for f in fields_of(type(self.trust))}},
        }
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        extra = state_dict.get("local_update")
        super().load_state_dict(  # type: ignore[misc]  # a mixin: torch.optim.Optimizer in LocalUpdate's MRO
            {k: v for k, v in state_dict.items() if k != "local_update"})
        if extra is None:  # a plain torch state dict: the per-parameter state only
            return
        self.steps, self.rho, self.correction = extra["steps"], extra["rho"], extra["correction"]
        self.step_offset, self.mix_lambda = extra["step_offset"], extra["mix_lambda"]
        self.diagnostics_every, self.bs = extra["diagnostics_every"], extra["bs"]
        self._diag_count, self._diag_pending = extra["diag_count"], extra["diag_pending"]
        self._diag = {k: v.clone() for k, v in extra["diag"].items()}
        self.trust = lookup("trust", extra["trust"]["name"])(**extra["trust"]["fields"])
        self._scaled_key = None
