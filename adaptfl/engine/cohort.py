"""`python -m adaptfl.engine --cohort C`: the in-process engine training C sampled clients at a
time as one vectorised computation (cohort_steps.py), instead of one after another.

Only the transport of the round's training messages changes: each client is set up by its
ClientApp's own code (`prepare_train`), steps in a cohort, and replies with the Message its
ClientApp would send (`reply_train`), so the server side is untouched. Clients whose optimizer
the batched reference does not cover (Muon's and SOAP's per-tensor rules, a user's own rule)
share batched gradients and each takes its own optimizer step; where their gradients cannot be
batched either (loss terms, buffers) they train one at a time, and the run says so once;
SecAgg+'s message stages always run one at a time.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from flwr.app import Error, Message, MessageType
from flwr.common.constant import ErrorCode

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import SECURE
from adaptfl.client_app.app import LocalJob, answer, prepare_train, reply_train
from adaptfl.client_app.device import peak_memory_mb
from adaptfl.client_app.train import run_local_steps
from adaptfl.core import wire
from adaptfl.engine.cohort_rows import CohortDeclined
from adaptfl.engine.cohort_steps import (
    FORMS,
    convolutions_on_cpu,
    own_signature,
    pick_form,
    signature,
    train_cohort,
)
from adaptfl.engine.inprocess import ClientHandler, InProcessGrid
from adaptfl.local_update.step.choose import native_declines
from adaptfl.server_app.loop import run_federated

log = logging.getLogger(__name__)
MEMORY_SHARE = 0.5  # of the memory free when a round starts: what `--cohort auto` may stack


def _steps_alone(message: Message, grid: InProcessGrid) -> bool:
    """Whether the ClientApp would answer this message with anything but plain training (a
    SecAgg+ stage, a refusal): those go through the handler, one at a time."""
    content = message.content
    if message.metadata.message_type != MessageType.TRAIN or wire.SECAGG in content.config_records:
        return True
    recipe = content.config_records.get(wire.RECIPE)
    node = grid.contexts[message.metadata.dst_node_id].node_config
    required = str(node.get(wire.NODE_SECAGG_REQUIRED, "")).lower() in ("1", "true", "yes")
    return recipe is None or bool(recipe.get(SECURE, False)) or required


def fitting_cohort(job: LocalJob, sampled: int) -> int:
    """How many clients like `job` fit in MEMORY_SHARE of the free memory: per client its
    parameters, start copy, gradients, stacked rows of x, g and every flat state slot, and a
    batch's activations (estimated as 8 floats per input value)."""
    opt = job.session.optimizer
    params = [p for g in opt.param_groups for p in g["params"]]
    d, elem = sum(p.numel() for p in params), params[0].element_size()
    slots = sum(1 for v in opt.state[params[0]].values() if torch.is_tensor(v))
    x, _ = job.split.batch(job.indices[:1])
    per_client = elem * (d * (5 + 2 * slots) + 8 * x.numel() * job.session.info.batch_size)
    device = job.session.device
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, min(sampled, int(MEMORY_SHARE * free // per_client)))


def cohort_key(job: LocalJob, form: str) -> tuple[Any, ...]:
    """How `job`'s steps batch, and with whom: ("reference", …) where one reference step moves
    every row, else ("own", …): batched gradients, each client's optimizer stepping itself (a
    rule the reference lacks; or, with form auto, FedACT's trust step on a CPU where the native
    loops run, float32: one client at a time they beat the batched reference there,
    benchmarks/bench_cohort.py --algorithm fedact: 0.78x on an Intel Xeon, docs/scale.md)."""
    key = signature(job)
    opt = job.session.optimizer
    native_trust = form == "auto" and native_declines(opt, opt.rule(opt.param_groups[0])) is None
    return key if key is not None and not native_trust else ("own", *own_signature(job))


def own_step_reason(job: LocalJob) -> str:
    """Why a group takes its own optimizer steps (said once a run)."""
    opt = job.session.optimizer
    rules = sorted({opt.rule(group).name for group in opt.param_groups})
    if signature(job) is None:
        return f"its local rule {'+'.join(rules)} has no batched step here"
    return "on this CPU its trust step (the native loops) is faster client by client"


class CohortGrid(InProcessGrid):
    """`InProcessGrid` whose training messages run `cohort` clients at a time (None: as many as
    fit, `fitting_cohort`), in `form` (cohort_steps.FORMS)."""

    def __init__(self, num_nodes: int, run_config: dict[str, Any], cohort: int | None = None,
                 form: str = "auto", handler: ClientHandler = answer) -> None:
        if cohort is not None and cohort < 1:
            raise ValueError(f"--cohort {cohort}: must be >= 1 (or auto)")
        if form not in FORMS:
            raise ValueError(f"--cohort-form {form!r}: choose one of {FORMS}")
        super().__init__(num_nodes, run_config, handler)
        self.cohort, self.form = cohort, form
        self._said: set[str] = set()

    def _say(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            log.info("%s", line)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        replies: dict[int, Message] = {}
        alone = [i for i, m in enumerate(messages) if _steps_alone(m, self)]
        for i, reply in zip(alone, self._one_by_one([messages[i] for i in alone], timeout), strict=True):
            if reply is not None:
                replies[i] = reply
        todo = [i for i in range(len(messages)) if i not in alone]
        while todo:
            first = todo[0]
            job = self._prepare(messages[first], replies, first)
            if job is None:
                todo = todo[1:]
                continue
            size = self.cohort or fitting_cohort(job, len(todo))
            chunk, todo = todo[:size], todo[size:]
            self._train_chunk(messages, chunk, {first: job}, replies, timeout)
        return [replies[i] for i in sorted(replies)]

    def _one_by_one(self, messages: Sequence[Message], timeout: float | None) -> list[Message | None]:
        """The handler's replies, one message at a time (None: no reply, as Flower drops one)."""
        out: list[Message | None] = []
        for message in messages:
            answered = list(super().send_and_receive([message], timeout=timeout))
            out.append(answered[0] if answered else None)
        return out

    def _prepare(self, message: Message, replies: dict[int, Message], i: int) -> LocalJob | None:
        """The client set up for its round; None with its error reply recorded, as the
        ClientApp answers a round it cannot run."""
        node = message.metadata.dst_node_id
        try:
            return prepare_train(message, self.contexts[node])
        except ValueError as err:
            log.error("round refused: %s", err)
            replies[i] = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(err)),
                                 reply_to=message)
        except Exception as err:  # noqa: BLE001 - Flower turns a raising ClientApp into this
            log.log(self.detail, "client on node %d raised: %s", node, err)
            replies[i] = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                       reason=traceback.format_exc()), reply_to=message)
        return None

    def _train_chunk(self, messages: Sequence[Message], chunk: Sequence[int], ready: dict[int, LocalJob],
                     replies: dict[int, Message], timeout: float | None) -> None:
        started = time.perf_counter()
        jobs: dict[int, LocalJob] = {}
        for i in chunk:
            job = ready.get(i) or self._prepare(messages[i], replies, i)
            if job is not None:
                jobs[i] = job
        groups: dict[Any, list[int]] = {}
        for i, job in jobs.items():
            groups.setdefault(cohort_key(job, self.form), []).append(i)
        done: dict[int, Message | None] = {}
        for key, members in groups.items():
            done.update(self._train_group(key[0] == "own", members, jobs, messages, timeout))
        took = time.perf_counter() - started
        if timeout is not None and took > timeout:  # Flower drops a reply later than the timeout
            log.log(self.detail, "cohort of %d took %.1f s > timeout %.1f s: no replies",
                    len(chunk), took, timeout)
            return
        replies.update({i: r for i, r in done.items() if r is not None})

    def _train_group(self, own: bool, members: Sequence[int], jobs: dict[int, LocalJob],
                     messages: Sequence[Message], timeout: float | None) -> dict[int, Message | None]:
        """One `cohort_key` group's replies: stacked, or one at a time where it cannot be."""
        first = jobs[members[0]]
        if self.form == "auto" and convolutions_on_cpu(first):
            return self._alone(members, jobs, "on a CPU its convolutions train faster one client at a time")
        why = own_step_reason(first) if own else ""
        if own and pick_form([jobs[i] for i in members], self.form) == "loop":
            return self._alone(members, jobs, f"{why}, and its gradients go client by client")
        try:
            form = train_cohort([jobs[i] for i in members], self.form, own_steps=own)
        except CohortDeclined as declined:  # before any reply: the clients' state is untouched
            log.warning("cohort: %s; these %d clients train one at a time", declined, len(members))
            return dict(zip(members, self._one_by_one([messages[i] for i in members], timeout),
                            strict=True))
        device = first.session.device
        peak = peak_memory_mb(device)
        steps = f"each client's own optimizer step ({why})" if own else "one reference step"
        self._say(f"cohort: {first.session.algorithm.name}: up to {len(members)} clients a step, "
                  f"{form} gradients, {steps}, on {device}")
        return {i: reply_train(jobs[i], peak, cohort=(len(members), form)) for i in members}

    def _alone(self, members: Sequence[int], jobs: dict[int, LocalJob], why: str
               ) -> dict[int, Message | None]:
        """Clients that train one at a time (`alone_reason`): their own loop, as the ClientApp
        runs it."""
        out: dict[int, Message | None] = {}
        for i in members:
            job = jobs[i]
            self._say(f"cohort: {job.session.algorithm.name}: {why}: its clients train one at a time")
            run_local_steps(job.session, job.split, job.loss, job.indices, job.client_id,
                            warn=job.warn, precision=job.precision)
            out[i] = reply_train(job, peak_memory_mb(job.session.device))
        return out


def run_cohort(cfg: RunConfig, num_nodes: int, cohort: int | None, form: str = "auto",
               on_round: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """`run_inprocess` with the clients trained `cohort` at a time (None: as many as fit)."""
    return run_federated(CohortGrid(num_nodes, cfg.to_flower(), cohort, form), cfg, on_round=on_round)
