"""The K local steps of C clients at once: their gradients, then one reference step for all.

Each client arrives set up exactly as its ClientApp sets it up (`client_app.app.prepare_train`:
its global weights, its session's stage parts, its `LocalUpdate` warm-started); here its
parameters and optimizer state become rows of stacked tensors ([C, D]: D the flat length of the
model's trainable parameters), every step computes the C gradients, then
`local_update.reference.elementwise_step` moves all C rows, and the session replies as it would
after its own loop. What stays each client's own: its batches (the same positions, from the same
seed, as `client_app/train.py` draws), its random stream (the global RNG state is swapped per
client), its stage hooks (loss terms, gradient corrections, durable state), its reply.

Three forms of the gradients:
  grouped  the C clients' models as one (engine/grouped.py: batched matmuls, grouped
           convolutions) and one `autograd.grad` of their summed losses: for plain
           `nn.Sequential` chains of Linear / Conv2d / pools / activations.
  vmap     `torch.func.vmap(grad(loss))` over the stacked parameters and batches (PyTorch's
           model-ensembling recipe): any model `torch.func` can call.
  loop     each client's own forward and backward through its own model, whose parameters are
           views of its row: every hook of the session runs as it does alone.
grouped and vmap need models without buffers or randomness, algorithms without loss terms, and
first-order rules; the loop takes the rest.
Either way the optimizer step is one batched call: what a GPU would otherwise launch C times.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.func import functional_call, grad_and_value, vmap

from adaptfl.client_app.app import LocalJob
from adaptfl.client_app.train import autocast_dtype, preload_partition, round_seed
from adaptfl.core.stage import ClientPart
from adaptfl.core.wire import COHORT_FORMS
from adaptfl.engine.grouped import GroupedModel
from adaptfl.local_update.reference import Chain, elementwise_step, refresh_hessian, supports
from adaptfl.local_update.rules import Step
from adaptfl.local_update.trust import rows_diagnostics
from adaptfl.workloads import sample_batches

log = logging.getLogger(__name__)
FORMS = COHORT_FORMS


class CohortDeclined(RuntimeError):
    """These clients cannot share a stacked step (the caller trains them one at a time)."""


def signature(job: LocalJob) -> tuple | None:
    """What must be equal for clients to share one stacked step; None where the reference
    lacks this client's optimizer (several param groups, a per-tensor rule such as Muon or SOAP,
    a rule or trust class of the user's own)."""
    opt = job.session.optimizer
    if len(opt.param_groups) != 1:
        return None
    group = opt.param_groups[0]
    rule = opt.rule(group)
    if not rule.elementwise or not supports(rule, opt.trust):
        return None
    params = group["params"]
    counts = {opt.state[p]["step"] for p in params}
    if len(counts) != 1:
        return None
    info = job.session.info
    return (rule, opt.trust, group["lr"], group["weight_decay"], opt.ref_lr, opt.rho, opt.correction,
            opt.step_offset, opt.mix_lambda, counts.pop(), opt.steps, opt.diagnostics_every,
            info.local_steps, min(info.batch_size, len(job.indices)), job.precision,
            tuple((tuple(p.shape), p.dtype, p.device) for p in params),
            tuple(sorted(opt.flat_slots())))


def pick_form(jobs: Sequence[LocalJob], form: str) -> str:
    """The fastest form that applies and `form` allows: grouped, else vmap (not for convolutions
    on a CPU: vmapped convolutions ran 2.2x slower than the loop there, docs/scale.md), else
    the loop. A forced form that does not apply falls back the same way."""
    session = jobs[0].session
    model = session.model
    hooks = any(type(part).loss is not ClientPart.loss for j in jobs for part in j.session.parts)
    rule = session.optimizer.rule(session.optimizer.param_groups[0])
    batched = not hooks and not rule.needs_loss and not any(True for _ in model.buffers())
    if form == "loop" or not batched:
        return "loop"
    if form in ("auto", "grouped") and GroupedModel.of(model) is not None:
        return "grouped"
    if form == "vmap":
        return "vmap"
    convolutions = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    return "loop" if convolutions and session.device.type == "cpu" else "vmap"


GATHER_BYTES = 16 << 20  # the most a block of stacked batches holds (all clients, several steps)


@dataclass
class Batches:
    """Every client's K batches: positions into its preloaded partition (train.py's draw)."""

    data: list[tuple[torch.Tensor, torch.Tensor] | None]  # per client: its rows on the device
    positions: list[list[torch.Tensor]]  # per client: K index tensors into its rows
    _block: tuple[int, int, torch.Tensor, torch.Tensor] | None = None  # (first step, steps, x, y)

    def of(self, jobs: Sequence[LocalJob], i: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        pre, batch = self.data[i], self.positions[i][k]
        if pre is not None:
            return pre[0][batch], pre[1][batch]
        job = jobs[i]
        x, y = job.split.batch(job.indices[batch])
        return x.to(job.session.device), y.to(job.session.device)

    def stacked(self, jobs: Sequence[LocalJob], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step k's batches of all clients, [C, B, ...] (equal batch sizes: `signature`). Where
        every partition is preloaded, gathered a block of steps at a time: one index per client
        per block instead of one per client per step."""
        if any(pre is None for pre in self.data):
            pairs = [self.of(jobs, i, k) for i in range(len(jobs))]
            return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        if self._block is None or not self._block[0] <= k < self._block[0] + self._block[1]:
            self._block = self._gather(k)
        first, _, x, y = self._block
        return x[:, k - first], y[:, k - first]

    def _gather(self, first: int) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        x0, y0 = self.data[0]  # type: ignore[misc]
        c, batch = len(self.data), len(self.positions[0][first])
        per_step = c * batch * (x0[0].nbytes + y0[0].nbytes)
        steps = max(1, min(len(self.positions[0]) - first, GATHER_BYTES // max(per_step, 1)))
        x = x0.new_empty(c, steps * batch, *x0.shape[1:])
        y = y0.new_empty(c, steps * batch, *y0.shape[1:])
        for i, (pre, positions) in enumerate(zip(self.data, self.positions, strict=True)):
            rows = torch.cat(positions[first:first + steps])
            torch.index_select(pre[0], 0, rows, out=x[i])  # type: ignore[index]
            torch.index_select(pre[1], 0, rows, out=y[i])  # type: ignore[index]
        return first, steps, x.view(c, steps, batch, *x.shape[2:]), y.view(c, steps, batch, *y.shape[2:])


def draw_batches(jobs: Sequence[LocalJob]) -> tuple[Batches, list[torch.Tensor]]:
    """(the batches, each client's global RNG state) as `run_local_steps` seeds them."""
    data, positions, rng = [], [], []
    for job in jobs:
        info = job.session.info
        seed = round_seed(info.seed, info.server_round, job.client_id)
        torch.manual_seed(seed)  # the client's own stream: dropout, Sophia's sampled labels
        rng.append(torch.get_rng_state())
        generator = torch.Generator().manual_seed(seed)
        if job.warn:
            log.warning("batch-size=%d exceeds this client's %d examples: every step uses all of "
                        "them", info.batch_size, len(job.indices))
        pos = sample_batches(len(job.indices), info.batch_size, info.local_steps, generator)
        pre = preload_partition(job.split, job.indices, job.session.device)
        positions.append([p.to(job.session.device) for p in pos] if pre is not None else pos)
        data.append(pre)
        job.session.model.train()
    return Batches(data, positions), rng


@contextlib.contextmanager
def own_stream(states: list[torch.Tensor], i: int) -> Iterator[None]:
    """Run with client i's global RNG state, and keep where it got to (CPU generator: this
    engine's path; on CUDA each client's loop form draws from the CUDA generator in turn)."""
    torch.set_rng_state(states[i])
    try:
        yield
    finally:
        states[i] = torch.get_rng_state()


class Stacked:
    """The C clients' parameters and flat optimizer state as rows; each client's own tensors
    become views of its row (so its model, its optimizer and its reply read the rows)."""

    def __init__(self, jobs: Sequence[LocalJob]) -> None:
        opts = [job.session.optimizer for job in jobs]
        self.params = [opt.param_groups[0]["params"] for opt in opts]
        self.names = list(opts[0].param_groups[0].get("param_names") or [])
        first = self.params[0]
        self.shapes = [tuple(p.shape) for p in first]
        self.sizes = tuple(p.numel() for p in first)
        like = first[0].detach()
        c, d = len(jobs), sum(self.sizes)
        self.x = like.new_empty(c, d)
        self.g = like.new_zeros(c, d)
        self.state = {slot: like.new_empty(c, d) for slot in opts[0].flat_slots()}
        for i, opt in enumerate(opts):
            torch.cat([p.detach().reshape(-1) for p in self.params[i]], out=self.x[i])
            for p, view in zip(self.params[i], self.x[i].split(self.sizes), strict=True):
                p.data = view.view_as(p)
            opt.adopt_flat_slots({slot: rows[i] for slot, rows in self.state.items()})

    def param_views(self) -> dict[str, torch.Tensor]:
        """{name: [C, *shape]} views of x, for `functional_call` under vmap."""
        c = self.x.shape[0]
        parts = self.x.split(self.sizes, dim=1)
        return {n: t.view(c, *s) for n, t, s in zip(self.names, parts, self.shapes, strict=True)}

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


def _forward_loss(job: LocalJob, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, the loss with the algorithm's terms), under the run's autocast (train.py's)."""
    session = job.session
    cast = autocast_dtype(job.precision, session.device)
    with torch.autocast(session.device.type, dtype=cast or torch.float32, enabled=cast is not None):
        logits = session.model(x)
        return logits, session.loss(x, logits, job.loss(logits, y))


def loop_gradients(jobs: Sequence[LocalJob], rows: Stacked, batches: Batches,
                   rng: list[torch.Tensor], j: int) -> torch.Tensor | None:
    """Step j's gradients, client by client through its own model and session hooks, into
    `rows.g`; returns the stacked ĝ of Sophia's refresh when due (None otherwise)."""
    hats = []
    for i, job in enumerate(jobs):
        x, y = batches.of(jobs, i, j)
        with own_stream(rng, i):
            logits, loss = _forward_loss(job, x, y)
            job.session.backward(loss, logits, job.loss)
        g_hat = job.session.correct_gradients()
        rows.take_grads(i)
        if g_hat is not None:
            if sorted(g_hat) != sorted(rows.names):
                raise CohortDeclined("Sophia's ĝ misses parameters: its client steps one at a time")
            hats.append(torch.cat([g_hat[n].reshape(-1) for n in rows.names]))
    return torch.stack(hats) if hats else None


class BatchedGradients:
    """Step j's gradients of all C clients in one computation (no loss terms here: `pick_form`):
    grouped (one model for all, plain autograd) or vmap(grad(loss)); gradient corrections
    (SCAFFOLD, FedDyn) then edit each client's row."""

    def __init__(self, jobs: Sequence[LocalJob], rows: Stacked, form: str) -> None:
        model, loss_fn = jobs[0].session.model, jobs[0].loss
        grouped = GroupedModel.of(model) if form == "grouped" else None
        self.jobs, self.rows = jobs, rows
        self.compute = self._grouped(grouped, loss_fn) if grouped is not None \
            else self._vmapped(model, loss_fn)
        self.corrected = [i for i, job in enumerate(jobs)
                          if any(type(p).correct_ is not ClientPart.correct_ for p in job.session.parts)]

    def _grouped(self, grouped: GroupedModel, loss_fn: Callable) -> Callable:
        rows = self.rows
        losses_of = vmap(loss_fn)  # each client's loss over its own batch (forward only)

        def compute(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            leaf = rows.x.detach().requires_grad_()
            parts = leaf.split(rows.sizes, dim=1)
            params = [t.view(len(t), *s) for t, s in zip(parts, rows.shapes, strict=True)]
            losses = losses_of(grouped.forward(params, x), y)
            (grads,) = torch.autograd.grad(losses.sum(), leaf)  # client i's loss reaches row i only
            rows.g.copy_(grads)
            return losses.detach()
        return compute

    def _vmapped(self, model: torch.nn.Module, loss_fn: Callable) -> Callable:
        rows = self.rows

        def loss_of(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return loss_fn(functional_call(model, params, (x,)), y)

        fn = vmap(grad_and_value(loss_of), randomness="error")

        def compute(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            grads, losses = fn(rows.param_views(), x, y)
            torch.cat([grads[n].reshape(len(x), -1) for n in rows.names], dim=1, out=rows.g)
            return losses
        return compute

    def __call__(self, batches: Batches, j: int) -> None:
        jobs = self.jobs
        x, y = batches.stacked(jobs, j)  # [C, B, ...] each client's own batch
        cast = autocast_dtype(jobs[0].precision, jobs[0].session.device)
        with torch.autocast(x.device.type, dtype=cast or torch.float32, enabled=cast is not None):
            losses = self.compute(x, y)
        for i, job in enumerate(jobs):
            job.session.record_loss(losses[i])
        for i in self.corrected:
            self.rows.lend_grads(i)
            jobs[i].session.correct_gradients()


def train_cohort(jobs: Sequence[LocalJob], form: str = "auto") -> str:
    """The K local steps of `jobs` (one `signature`), stacked; returns the form that ran."""
    form = pick_form(jobs, form)
    batches, rng = draw_batches(jobs)
    rows = Stacked(jobs)
    opt = jobs[0].session.optimizer
    group = opt.param_groups[0]
    rule = opt.rule(group)
    chain = Chain(lr=group["lr"], weight_decay=group["weight_decay"], ref_lr=opt.ref_lr, rho=opt.rho,
                  correction=opt.correction, trust=opt.trust, sizes=rows.sizes, fast_selection=True)
    k0 = opt.state[group["params"][0]]["step"]
    batched = BatchedGradients(jobs, rows, form) if form != "loop" else None
    for j in range(jobs[0].session.info.local_steps):
        hats = loop_gradients(jobs, rows, batches, rng, j) if batched is None else batched(batches, j)
        k = k0 + j + 1
        at = Step(k, opt.step_offset + k, opt.mix_lambda, opt.bs)
        for job in jobs:  # each optimizer counts the step as its own `step` would
            job.session.optimizer.steps += 1
        due = [job.session.optimizer.diagnostics_due() for job in jobs]
        x, state, scores = elementwise_step(rule, rows.x, rows.g, rows.state, at, chain, any(due))
        if hats is not None:
            state = refresh_hessian(rule, state, hats)
        rows.settle(x, state)
        measured = rows_diagnostics(scores) if scores is not None else {}
        for i, job in enumerate(jobs):
            own = job.session.optimizer
            for p in rows.params[i]:
                own.state[p]["step"] = k
            if due[i] and measured:
                own.record_diagnostics({name: values[i] for name, values in measured.items()})
    return form
