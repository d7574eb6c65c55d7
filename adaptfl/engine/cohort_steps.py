"""The K local steps of C clients at once: their gradients batched, then their optimizer steps.

Each client arrives set up exactly as its ClientApp sets it up (`client_app.app.prepare_train`:
its global weights, its session's stage parts, its `LocalUpdate` warm-started); here its
parameters become rows of stacked tensors (cohort_rows.py), every step computes the C
gradients, then the rows move, and the session replies as it would after its own loop. What
stays each client's own: its batches and random stream (cohort_data.py), its stage hooks (loss
terms, gradient corrections, durable state), its reply.

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
Two kinds of step:
  reference  one `local_update.step.reference.elementwise_step` moves all C rows and their stacked
             optimizer state: what a GPU would otherwise launch C times.
  own        each client's own `LocalUpdate.step` on its row of the batched gradients: for the
             rules the reference lacks (Muon, SOAP, a user's own) and for FedACT's native CPU
             loops, which beat the batched trust step on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.func import functional_call, grad_and_value, vmap

from adaptfl.client_app.app import LocalJob
from adaptfl.client_app.train import autocast_dtype
from adaptfl.core.stage import ClientPart
from adaptfl.core.wire import COHORT_FORMS
from adaptfl.engine.cohort_data import Batches, draw_batches, own_stream
from adaptfl.engine.cohort_rows import CohortDeclined, Stacked
from adaptfl.engine.grouped import GroupedModel
from adaptfl.local_update.rules import Step
from adaptfl.local_update.step.reference import Chain, elementwise_step, refresh_hessian, supports
from adaptfl.local_update.trust import rows_diagnostics
from adaptfl.workloads.losses import task_loss

IGNORED = -100  # F.cross_entropy's ignore_index: targets no loss counts (masked tokens)

FORMS = COHORT_FORMS
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (outputs, targets) -> loss


def signature(job: LocalJob) -> tuple[Any, ...] | None:
    """What must be equal for clients to share one reference step; None where the reference
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
    return ("reference", rule, opt.trust, group["lr"], group["weight_decay"], opt.ref_lr, opt.rho,
            opt.correction, opt.step_offset, opt.mix_lambda, counts.pop(), opt.steps,
            opt.diagnostics_every, *own_signature(job), tuple(sorted(opt.flat_slots())))


def own_signature(job: LocalJob) -> tuple[Any, ...]:
    """What must be equal for clients to share batched gradients, each then taking its own
    optimizer's step: the steps, the batch, the precision and the parameters group by group."""
    info, opt = job.session.info, job.session.optimizer
    return (info.local_steps, min(info.batch_size, len(job.indices)), job.precision,
            tuple(tuple((tuple(p.shape), p.dtype, p.device) for p in group["params"])
                  for group in opt.param_groups))


def pick_form(jobs: Sequence[LocalJob], form: str) -> str:
    """The fastest form that applies and `form` allows: grouped, else vmap, else the loop; with
    `auto` the loop for convolutions on a CPU (grouped and vmapped convolutions both ran slower
    than the loop there: docs/scale.md). A forced form that does not apply falls back."""
    session = jobs[0].session
    model = session.model
    if form == "loop" or not _batchable(jobs):
        return "loop"
    if form == "auto" and convolutions_on_cpu(jobs[0]):
        return "loop"
    if form in ("auto", "grouped") and GroupedModel.of(model) is not None \
            and all(p.requires_grad for p in model.parameters()):
        return "grouped"
    return "vmap"


def convolutions_on_cpu(job: LocalJob) -> bool:
    """A model with convolutions on a CPU: there batched convolutions (grouped or vmapped) ran
    slower than one client's, and the loop form gained nothing over one at a time
    (benchmarks/bench_cohort.py --model cnn: docs/scale.md)."""
    model = job.session.model
    return job.session.device.type == "cpu" and \
        any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


def _batchable(jobs: Sequence[LocalJob]) -> bool:
    """Whether one call may compute every client's gradient: no loss terms of the algorithm,
    no Sophia refresh (a second backward), no buffers (BatchNorm's running statistics)."""
    session = jobs[0].session
    opt = session.optimizer
    hooks = any(type(part).loss is not ClientPart.loss for j in jobs for part in j.session.parts)
    sophia = any(opt.rule(group).needs_loss for group in opt.param_groups)
    return not hooks and not sophia and not any(True for _ in session.model.buffers())


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


def per_client_loss(loss_fn: LossFn) -> LossFn:
    """[C] each client's loss over its own batch ([C, B, ...] logits and targets): the tasks'
    shared cross-entropy as one call (a mean over each client's counted targets, as its mean
    reduction takes it), any other loss through vmap (forward only)."""
    if loss_fn is not task_loss:
        return vmap(loss_fn)

    def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        c = len(targets)
        each = task_loss(logits, targets, reduction="none").view(c, -1)
        counted = (targets.reshape(c, -1) != IGNORED).sum(dim=1)
        return each.sum(dim=1) / counted
    return cross_entropy


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

    def _grouped(self, grouped: GroupedModel, loss_fn: LossFn) -> LossFn:
        rows = self.rows
        losses_of = per_client_loss(loss_fn)

        at = {name: j for j, name in enumerate(rows.names)}
        order = [at[name] for name, _ in self.jobs[0].session.model.named_parameters()]

        def compute(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            leaf = rows.x.detach().requires_grad_()
            views = rows.views_of(leaf)  # row order: the optimizer's groups
            losses = losses_of(grouped.forward([views[j] for j in order], x), y)
            (grads,) = torch.autograd.grad(losses.sum(), leaf)  # client i's loss reaches row i only
            rows.g.copy_(grads)
            return losses.detach()
        return compute

    def _vmapped(self, model: torch.nn.Module, loss_fn: LossFn) -> LossFn:
        rows = self.rows

        def loss_of(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return loss_fn(functional_call(model, params, (x,)), y)

        fn = vmap(grad_and_value(loss_of), randomness="error")

        def compute(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            grads, losses = fn(rows.param_views(), x, y)
            torch.cat([grads[n].reshape(len(x), -1) for n in rows.names], dim=1, out=rows.g)
            return cast(torch.Tensor, losses)
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


def train_cohort(jobs: Sequence[LocalJob], form: str = "auto", own_steps: bool = False) -> str:
    """The K local steps of `jobs` (one `signature`, or one `own_signature` with `own_steps`),
    stacked; returns the form that ran. With `own_steps` only the gradients are batched (never
    the loop form) and each client's optimizer takes its own step on its row of them: its
    rule as it runs alone (Muon, SOAP, the native trust loops), its arithmetic unchanged."""
    form = pick_form(jobs, form)
    if own_steps and form == "loop":
        raise CohortDeclined("batched gradients do not apply to this model or algorithm")
    batches, rng = draw_batches(jobs)
    rows = Stacked(jobs, adopt_state=not own_steps)
    batched = BatchedGradients(jobs, rows, form) if form != "loop" else None
    step = _own_steps(jobs, rows) if own_steps else _reference_step(jobs, rows)
    for j in range(jobs[0].session.info.local_steps):
        hats = loop_gradients(jobs, rows, batches, rng, j) if batched is None else batched(batches, j)
        step(j, hats)
    return form


def _own_steps(jobs: Sequence[LocalJob], rows: Stacked) -> Callable[[int, torch.Tensor | None], None]:
    """Each client's optimizer steps on its row of the gradients (corrected already)."""
    batch = min(jobs[0].session.info.batch_size, len(jobs[0].indices))

    def step(j: int, hats: torch.Tensor | None) -> None:
        for i, job in enumerate(jobs):
            rows.lend_grads(i)
            job.session.optimizer.bs = batch
            job.session.optimizer.step()
    return step


def _reference_step(jobs: Sequence[LocalJob], rows: Stacked) -> Callable[[int, torch.Tensor | None], None]:
    """One reference step for all rows (`elementwise_step`), each optimizer's count kept."""
    opt = jobs[0].session.optimizer
    group = opt.param_groups[0]
    rule = opt.rule(group)
    chain = Chain(lr=group["lr"], weight_decay=group["weight_decay"], ref_lr=opt.ref_lr, rho=opt.rho,
                  correction=opt.correction, trust=opt.trust, sizes=rows.sizes, fast_selection=True)
    k0 = opt.state[group["params"][0]]["step"]

    def step(j: int, hats: torch.Tensor | None) -> None:
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
    return step
