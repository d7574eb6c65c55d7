"""Client-side terms: small pieces the recipe switches on around the local update.

A term can add to the loss before backward (`loss`: FedProx, HaFedHo, MOON), correct the
gradients after backward and before the optimizer step (`correct_`: SCAFFOLD, FedDyn, HaFedHo's
gradient option), keep durable state (`client_state.py`) and add records and metrics to the
reply (`finish`). The ClientApp builds the terms the recipe names (`recipe.terms`, comma-
separated) and never branches on the algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from adaptfl.algorithms.recipe import ClientRecipe
from adaptfl.client_app.client_state import ClientStateStore
from adaptfl.workloads import ImageData

Tensors = dict[str, torch.Tensor]


@dataclass
class RoundInputs:
    """What a term may read: the model at x^r, the recipe, the message's extra records."""

    model: torch.nn.Module  # at the global model x^r when terms are built
    recipe: ClientRecipe
    records: Mapping[str, Tensors]  # extra ArrayRecords of the message, by wire name
    store: ClientStateStore
    data: ImageData
    indices: torch.Tensor  # this client's partition
    dataset_size: int  # |D|, for p_i = |D_i| / |D|
    start: Tensors = field(init=False)  # x^r of every trainable parameter (detached copies)

    def __post_init__(self) -> None:
        self.start = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    @property
    def params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    def incoming(self, name: str) -> Tensors | None:
        """An optional record, on the model's device (None when the server did not send it)."""
        if name not in self.records:
            return None
        device = next(self.model.parameters()).device
        return {k: v.to(device) for k, v in self.records[name].items()}


@dataclass
class TermOutput:
    records: dict[str, Tensors] = field(default_factory=dict)  # extra reply ArrayRecords
    metrics: dict[str, float | int] = field(default_factory=dict)  # extra reply metrics


class LocalTerm:
    """Base: every hook does nothing."""

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        """Added to the batch loss before backward (None: nothing)."""
        return None

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        """Modify `p.grad` in place after backward, before the optimizer step."""

    def finish(self, delta: Mapping[str, torch.Tensor], train_loss: float) -> TermOutput:
        """After the K steps: save durable state, return extra records and metrics."""
        return TermOutput()


def add_to_grads_(params: Mapping[str, torch.nn.Parameter], tensors: Mapping[str, torch.Tensor],
                  scale: float = 1.0) -> None:
    """p.grad += scale·t for every parameter that has a gradient this step."""
    for n, p in params.items():
        if p.grad is not None and n in tensors:
            p.grad.add_(tensors[n], alpha=scale)


def term_names(spec: str) -> list[str]:
    return [name.strip() for name in spec.split(",") if name.strip()]


def build_terms(spec: str, inputs: RoundInputs) -> Sequence[LocalTerm]:
    """The terms named in the recipe, in order; an unknown name is an error, not a no-op."""
    from adaptfl.client_app.term_feddyn import FedDynTerm
    from adaptfl.client_app.term_hafedho import HaFedHoTerm
    from adaptfl.client_app.term_mime import GradAtXTerm
    from adaptfl.client_app.term_moon import MoonTerm
    from adaptfl.client_app.term_prox import ProxTerm
    from adaptfl.client_app.term_scaffold import ScaffoldTerm

    registry: dict[str, type] = {"prox": ProxTerm, "hafedho": HaFedHoTerm, "scaffold": ScaffoldTerm,
                                 "feddyn": FedDynTerm, "moon": MoonTerm, "grad-at-x": GradAtXTerm}
    unknown = [n for n in term_names(spec) if n not in registry]
    if unknown:
        raise ValueError(f"unknown client terms {unknown}; known: {sorted(registry)}")
    return [registry[n](inputs) for n in term_names(spec)]
