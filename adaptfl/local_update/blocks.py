"""One step's direction of a flat group or of one tensor, and how it steps on its own."""

from __future__ import annotations

from typing import Any

import torch


class Block:
    """The direction of one flat group, or of one tensor, and how it steps on its own."""

    def __init__(self, params: list[torch.Tensor], d: torch.Tensor | None, g: torch.Tensor,
                 coef: float, decay: float, decay_after: bool,
                 global_direction: torch.Tensor | None, flat: bool = False,
                 corrected: bool = False, bucket: torch.Tensor | None = None,
                 grads: list[torch.Tensor] | None = None,
                 grad_views: list[torch.Tensor] | None = None, pending: Any = None) -> None:
        self.params, self._d, self.g, self.coef, self.flat = params, d, g, coef, flat
        self.pending = pending  # the pass that writes d, not run yet (`Direction.pending`)
        self.grads, self.grad_views = grads, grad_views  # g still to be filled from grads, or None
        self.corrected = corrected  # d is u: the correction is in it already
        self.bucket = bucket  # the flat parameters the params are views of (bucket view), or None
        self.decay, self.decay_after, self.global_direction = decay, decay_after, global_direction

    @property
    def d(self) -> torch.Tensor | None:
        """The direction, written first if its pass is still pending."""
        self.settle()
        return self._d

    def settle(self) -> None:
        """Run the pass that writes d, if it is still pending."""
        if self.pending is not None:
            self.pending.run()
            self.pending = None

    @property
    def moves(self) -> bool:
        """Whether the rule moves on its own this step (SOAP's first step does not)."""
        return self._d is not None

    def scaled_direction(self, ref_lr: float) -> torch.Tensor:
        """(c/L)·d: this block's direction in the units of the reference lr L."""
        if self.d is None:  # SOAP's initialising step: no local move
            return torch.zeros_like(self.g)
        factor = self.coef / ref_lr if ref_lr else 1.0
        return self.d * factor if factor != 1.0 else self.d

    def _steps(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.flat:
            return [v.view_as(p) for v, p in zip(torch.split(x, [p.numel() for p in self.params]),
                                                 self.params, strict=True)]
        return [x.view_as(self.params[0])]

    def fill_g(self) -> None:
        """Copy the gradients into g where the step left them in place (`grads`)."""
        if self.grads is not None:
            if self.grad_views is None:
                raise RuntimeError("a block with gradients left in place needs their grad_views in g")
            torch._foreach_copy_(self.grad_views, self.grads)
            self.grads = None

    def decay_factor(self) -> float | None:
        """1 - δ where the flat move decays x, else None."""
        return 1.0 - self.decay if self.decay and self.moves else None

    def move(self, u: torch.Tensor, alpha: float, phi: torch.Tensor | None = None) -> None:
        """x = (1-δ)·x + alpha·u (or + phi ⊙ u) on the flat parameters (decay before the move;
        a flat rule never decays after it). The same float operations, per entry, as the
        per-tensor calls of the chain."""
        assert self.bucket is not None and not self.decay_after
        if (decay := self.decay_factor()) is not None:
            self.bucket.mul_(decay)
        if phi is None:
            self.bucket.add_(u, alpha=alpha)
        else:
            self.bucket.addcmul_(u, phi)

    def apply_own_step(self, share: float = 1.0) -> None:
        """The rule's own step at `share` of its lr, exactly as its authors write it."""
        if self.d is None:
            return
        if self.bucket is not None:
            self.move(self.d, -self.coef * share)
            return
        steps, coef = self._steps(self.d), self.coef * share
        if self.decay_after:
            for p, s in zip(self.params, steps, strict=True):
                p.add_(s, alpha=-coef).mul_(1.0 - self.decay)
            return
        if self.decay:
            torch._foreach_mul_(self.params, 1.0 - self.decay)
        torch._foreach_add_(self.params, steps, alpha=-coef)

    def add_correction(self, alpha: float, only: torch.Tensor | None = None) -> None:
        """x += alpha·Δ_G (nothing before the server has a Δ_G, or when alpha is 0)."""
        if self.global_direction is None or alpha == 0.0:
            return
        if self.bucket is not None and only is None:
            self.bucket.add_(self.global_direction, alpha=alpha)
            return
        for p, dg in zip(self.params, self._steps(self.global_direction), strict=True):
            if only is None or p is only:
                p.add_(dg, alpha=alpha)
