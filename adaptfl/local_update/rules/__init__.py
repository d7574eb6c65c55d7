"""Preconditioners g -> d, one file each: sgd, adam/adamw, sophia, muon, soap.

Each is a `Preconditioner`: a frozen dataclass of its hyperparameters (declared once, so they are
also its run-config keys) with pure per-tensor math behind one interface:

    slots                     state tensors shaped like the parameter, zero at the start
    init(p)                   any other state (SOAP's Kronecker factors)
    direction(g, st, step)    Direction(d, scale): d and the factor its lr is multiplied by;
                              updates st. d must be a fresh tensor, never a tensor of st nor
                              g: the chain scales it in place, and refuses a direction that
                              aliases them
    theta_shapes(name, shape) what of st is shared with the server (FedPAC Θ, FedMIX-P P)

`elementwise` rules (sgd, adam, adamw, sophia) are run by the shell on one flat vector per param
group, so FedACT's global top-k is a single selection; the others per tensor. Everything after
the direction — mixing, correction, trust modulation, the step — is written once, in
`local_update/shell.py`. The rules know nothing of the fast paths: where AdamW's and SGD's
directions are written into the chain's buffers, read the gradients in place or carry the
correction in their last pass is `local_update/step/fused.py`, by the rule's exact class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, cast

import torch

from adaptfl.core.domain import FINITE, Domain
from adaptfl.core.params import Component, fields_of, lookup

Shape = tuple[int, ...]


@dataclass
class Step:
    """What a rule may read about the step being taken."""

    k: int  # this parameter's local step, from 1 each round (per parameter, as torch counts)
    t: int  # the global step: (r-1)·K + k
    lam: float = 1.0  # FedMIX-P's λ_r: weight of the client's own state against the reference
    bs: int = 1  # examples (tokens for language models) in the batch: Sophia's bs


class Direction(NamedTuple):
    d: torch.Tensor | None  # None: no move of the rule's own this step (SOAP's first)
    scale: float = 1.0  # the rule's lr factor (SOAP's bias-corrected size, Muon's shape scale)


class Preconditioner(Component):
    """Base of the preconditioners (see the package docstring)."""

    default_lr: ClassVar[float] = 1e-3
    default_weight_decay: ClassVar[float] = 0.0
    elementwise: ClassVar[bool] = True  # one flat vector per group (else per tensor)
    coupled_decay: ClassVar[bool] = False  # g += wd·x before the rule (Adam's L2), no decoupled decay
    decay_after: ClassVar[bool] = False  # x = (x - c·d)·(1 - lr·wd): SOAP's authors' order
    slots: ClassVar[tuple[str, ...]] = ()  # zero-initialised, shaped like the parameter
    theta_slots: ClassVar[tuple[str, ...]] = ()  # shared with the server (FedPAC / FedMIX-P)
    shareable: ClassVar[bool] = False  # has a Θ to share at all
    # torch's name of a param-group entry -> the fields it holds (AdamW's `betas` = (beta1,
    # beta2), Muon's `momentum`): the groups carry torch's names, so torch's schedulers
    # (OneCycleLR, CyclicLR with cycle_momentum) find and drive them
    torch_names: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Declared capabilities, read by the generic code (no name checks there):
    needs_loss: ClassVar[bool] = False  # refreshes state from an extra loss (Sophia's GNB ĝ):
    # `refresh_due(k)`, `extra_loss(logits, loss_fn)` and `refresh(st, ĝ)`
    routes_parameters: ClassVar[bool] = False  # `groups` sends some parameters elsewhere (Muon)
    batched_directions: ClassVar[bool] = False  # has `directions(gs, sts, step)` for a whole group

    def refresh_due(self, k: int) -> bool:
        """Whether local step k refreshes the rule's state from `extra_loss` (`needs_loss`)."""
        return False

    def extra_loss(self, logits: torch.Tensor, loss_fn: Any) -> torch.Tensor:
        """The loss whose gradient ĝ `refresh` reads (`needs_loss` only)."""
        raise NotImplementedError(f"{self.name} needs no extra loss")

    def refresh(self, st: dict[str, Any], g_hat: torch.Tensor) -> None:
        """Update the state from ĝ after the step (`needs_loss` only)."""

    def directions(self, gs: Sequence[torch.Tensor], sts: Sequence[dict[str, Any]], step: Step
                   ) -> list[Direction]:
        """The directions of a whole group at once (`batched_directions` only)."""
        return [self.direction(g, st, step) for g, st in zip(gs, sts, strict=True)]

    def init(self, p: torch.Tensor) -> dict[str, Any]:
        return {}

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        raise NotImplementedError

    def theta_shapes(self, name: str, shape: Shape) -> dict[str, Shape]:
        """{slot: shape} of what this parameter shares (empty: nothing)."""
        return {slot: tuple(shape) for slot in self.theta_slots}

    def theta_domain(self, slot: str) -> Domain:
        """Which values a shared slot may hold (checked on every Θ_i and on the averaged Θ)."""
        return FINITE

    def theta_spec(self, params: Sequence[tuple[str, Shape]]) -> dict[str, Shape]:
        """{"<param>/<slot>": shape} of the whole model's shared state (the server's Θ spec)."""
        return {f"{n}/{slot}": shp for n, s in params for slot, shp in self.theta_shapes(n, tuple(s)).items()}

    def groups(self, named: Sequence[tuple[str, torch.Tensor]], lr_scale: float
               ) -> list[dict[str, Any]]:
        """Param groups for this rule over a model's parameters; one group unless the rule
        routes some parameters elsewhere (Muon: the non-matrix ones to AdamW)."""
        return [{"params": list(named), **group_values(self)}]


def group_values(rule: Preconditioner) -> dict[str, Any]:
    """The rule's hyperparameters as torch param-group entries: torch's name where torch has one
    (`betas`, `momentum`: `torch_names`), else the field's (snake_case, as torch names them)."""
    values: dict[str, Any] = {"preconditioner": rule.name}
    held = {f: key for key, fields in rule.torch_names.items() for f in fields}
    for f in fields_of(type(rule)):
        if f.name not in held:
            values[f.name] = getattr(rule, f.name)
    for key, fields in rule.torch_names.items():
        values[key] = tuple(getattr(rule, f) for f in fields) if len(fields) > 1 else getattr(rule, fields[0])
    return values


def fields_from_group(cls: type[Preconditioner], group: dict[str, Any]) -> dict[str, Any]:
    """The rule's field values a param group holds, under torch's names or the fields' own
    (a group of an older state_dict, or one a user wrote with `beta1=`); the rest left out."""
    out: dict[str, Any] = {}
    for key, fields in cls.torch_names.items():
        if key not in group:
            continue
        values = group[key] if len(fields) > 1 else (group[key],)
        if not isinstance(values, tuple | list) or len(values) != len(fields):
            raise ValueError(f"param group {key}={group[key]!r}: expected "
                             f"{'(' + ', '.join(fields) + ')' if len(fields) > 1 else fields[0]}")
        out.update(zip(fields, values, strict=True))
    for f in fields_of(cls):  # torch's name wins: it is the entry a scheduler writes
        if f.name in group and f.name not in out:
            out[f.name] = group[f.name]
    return out


def zeros_like_slots(rule: Preconditioner, p: torch.Tensor) -> dict[str, torch.Tensor]:
    return {slot: torch.zeros_like(p, memory_format=torch.preserve_format) for slot in rule.slots}


def field_default(cls: type[Preconditioner], name: str) -> Any:
    return next(f.default for f in fields_of(cls) if f.name == name)


def torch_keywords(preconditioner: str | Preconditioner, hyper: dict[str, Any]) -> dict[str, Any]:
    """`hyper` (LocalUpdate's keywords) with torch's names turned into the rule's fields in place:
    `betas=(b1, b2)` for the Adam family, `momentum=` for Muon."""
    # the "preconditioner" registry holds Preconditioner subclasses only
    cls = cast(type[Preconditioner], lookup("preconditioner", preconditioner)) \
        if isinstance(preconditioner, str) else type(preconditioner)
    for key in cls.torch_names:
        if key in hyper:
            named = [f for f in cls.torch_names[key] if f in hyper]
            if named:
                raise TypeError(f"LocalUpdate got both {key}= and {named[0]}=")
            hyper.update(fields_from_group(cls, {key: hyper.pop(key)}))
    return hyper
