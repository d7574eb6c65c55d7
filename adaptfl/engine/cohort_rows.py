"""The cohort's C clients as rows of stacked tensors: their parameters, gradients and flat
optimizer state ([C, D]: D the flat length of the model's trainable parameters, in the order of
the optimizer's param groups). Each client's own tensors become views of its row, so its model,
its optimizer and its reply read the rows, and nothing is copied back."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adaptfl.client_app.app import LocalJob
from adaptfl.local_update.shell import LocalUpdate


class CohortDeclined(RuntimeError):
    """These clients cannot share a stacked step (the caller trains them one at a time)."""


class Stacked:
    """The C clients' parameters, gradients and (`adopt_state`: the reference step's) flat
    optimizer state as rows. A row lists the parameters group after group of the optimizer, so
    each group's are one slice of it: with its own steps (`adopt_state=False`), a client's
    optimizer takes that slice as its flat parameter buffer (`adopt_buckets`)."""

    def __init__(self, jobs: Sequence[LocalJob], adopt_state: bool = True) -> None:
        opts = [job.session.optimizer for job in jobs]
        self.params = [[p for group in opt.param_groups for p in group["params"]] for opt in opts]
        first = self.params[0]
        named = {id(p): n for n, p in jobs[0].session.model.named_parameters()}
        self.names = [named[id(p)] for p in first]
        self.shapes = [tuple(p.shape) for p in first]
        self.sizes = tuple(p.numel() for p in first)
        like = first[0].detach()
        c, d = len(jobs), sum(self.sizes)
        self.x = like.new_empty(c, d)
        self.g = like.new_zeros(c, d)
        self.state = {slot: like.new_empty(c, d) for slot in opts[0].flat_slots()} if adopt_state else {}
        for i, opt in enumerate(opts):
            self._adopt(i, opt, adopt_state)

    def _adopt(self, i: int, opt: LocalUpdate, adopt_state: bool) -> None:
        """Client i's parameters (and state, or flat parameter buffers) into row i."""
        torch.cat([p.detach().reshape(-1) for p in self.params[i]], out=self.x[i])
        for p, view in zip(self.params[i], self.x[i].split(self.sizes), strict=True):
            p.data = view.view_as(p)
        if adopt_state:
            opt.adopt_flat_slots({slot: rows[i] for slot, rows in self.state.items()})
        else:
            opt.adopt_buckets(self._group_slices(self.x[i], [len(g["params"]) for g in opt.param_groups]))

    def _group_slices(self, row: torch.Tensor, groups: list[int]) -> list[torch.Tensor]:
        out, at, first = [], 0, 0
        for count in groups:
            width = sum(self.sizes[first:first + count])
            out.append(row[at:at + width])
            at, first = at + width, first + count
        return out

    def param_views(self) -> dict[str, torch.Tensor]:
        """{name: [C, *shape]} views of x, for `functional_call` under vmap."""
        return dict(zip(self.names, self.views_of(self.x), strict=True))

    def views_of(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """[C, *shape] views of `rows` [C, D], one per parameter, in row order."""
        c = rows.shape[0]
        parts = torch.split(rows, list(self.sizes), dim=1)
        return [t.view(c, *s) for t, s in zip(parts, self.shapes, strict=True)]

    def take_grads(self, i: int) -> None:
        """Client i's gradients (after its corrections) into row i of g."""
        grads = [p.grad for p in self.params[i]]
        if any(gr is None for gr in grads):
            raise CohortDeclined("a parameter got no gradient: its client steps one at a time")
        torch.cat([gr.reshape(-1) for gr in grads if gr is not None], out=self.g[i])

    def lend_grads(self, i: int) -> None:
        """Row i of g as client i's `p.grad` (its corrections then edit the row in place)."""
        for p, view in zip(self.params[i], self.g[i].split(self.sizes), strict=True):
            p.grad = view.view_as(p)

    def settle(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        """The step's results into the rows (the clients' tensors are views of them)."""
        self.x.copy_(x)
        for slot, rows in self.state.items():
            rows.copy_(state[slot])
