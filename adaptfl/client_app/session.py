"""`ClientSession`: one round of an adaptfl algorithm inside any Flower ClientApp.

Your ClientApp keeps its own model, data and training loop; the session turns the server's
message into the torch optimizer the recipe asks for (warm-started, corrected, modulated) and,
after your loop, into the reply:

    @app.train()
    def train(msg, context):
        model = Net()
        session = ClientSession(msg, model, context=context)   # loads the global weights
        for x, y in loader:
            logits = model(x)
            loss = session.loss(x, logits, F.cross_entropy(logits, y))  # + the algorithm's terms
            session.backward(loss, logits)                             # (+ Sophia's ĝ when due)
            session.step()                                             # gradient terms, then step
        return session.reply(num_examples=len(loader.dataset))

For algorithms without client terms (FedACT, FedAdamW, FedPAC, FedMIX-P, the server-optimizer
family) `session.optimizer` is all you need: `loss.backward(); session.optimizer.step()`.

The session refuses a message that carries a record the algorithm does not consume (so nothing
the server sends is silently ignored), and refuses to reply when the algorithm's terms were
bypassed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from adaptfl.algorithms.algorithm import Algorithm
from adaptfl.algorithms.recipe import (
    CLIENT_STATE_DIR,
    CLIENT_STATE_MEMORY,
    FROZEN_DIGEST,
    SECURE,
    algorithm_from_recipe,
    compression_from_recipe,
    privacy_from_recipe,
    round_from_recipe,
)
from adaptfl.client_app.client_state import ClientStateStore, MemoryStore
from adaptfl.codec.feedback import encode_reply
from adaptfl.codec.values import MalformedEncoding
from adaptfl.codec.versions import Store, echo, take_held
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec, frozen_digest, load_federated
from adaptfl.core.stage import ClientData, ClientPart, ClientRound, RoundInfo
from adaptfl.local_update.shell import LocalUpdate
from adaptfl.privacy.client import node_terms
from adaptfl.privacy.mechanism import privatize, round_seed, shared_records
from adaptfl.privacy.reply_metrics import released_metrics

if TYPE_CHECKING:
    from flwr.app.typing import MetricRecordValues

log = logging.getLogger(__name__)
BASE_RECORDS = frozenset({wire.ARRAYS})


class ContractError(ValueError):
    """The message does not match what the algorithm consumes."""


def build_optimizer(model: torch.nn.Module, algorithm: Algorithm, info: RoundInfo) -> LocalUpdate:
    """The round's LocalUpdate over the model's trainable parameters, as the recipe says."""
    rule = algorithm.preconditioner
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    options: dict[str, Any] = {}
    for stage in algorithm.stages():
        options.update(stage.optimizer_options(info))
    # the model is the session's own for the round: its parameters may live in one flat buffer
    return LocalUpdate(rule.groups(named, info.lr_scale), lr=info.lr, weight_decay=info.weight_decay,
                       preconditioner=rule, trust=algorithm.trust, step_offset=info.step_offset,
                       diagnostics_every=info.diagnostics_every, parameters_as_bucket_view=True,
                       **options)


def check_records(content: RecordDict, algorithm: Algorithm) -> None:
    """Every record of the message must be one the algorithm consumes: its arrays, the recipe
    and Flower's train config; nothing else is read, so anything else means the two disagree."""
    consumed = BASE_RECORDS | {r.name for s in algorithm.stages() for r in s.records_down()}
    extra = sorted(set(content.array_records) - consumed)
    extra += sorted(set(content.config_records) - {wire.RECIPE, wire.CONFIG})
    extra += sorted(content.metric_records)
    if extra:
        raise ContractError(f"message carries record{'s' if len(extra) > 1 else ''} {extra} that "
                            f"algorithm {algorithm.name!r} does not consume (it reads "
                            f"{sorted(consumed | {wire.RECIPE, wire.CONFIG})}); server and client disagree")
    if wire.ARRAYS not in content.array_records:
        raise ContractError(f"message lacks the model record {wire.ARRAYS!r}")


def check_frozen(model: torch.nn.Module, recipe: Any) -> None:
    """This node's frozen parameters must be the server's (core/contract.py)."""
    expected = str(recipe.get(FROZEN_DIGEST, ""))
    if expected and frozen_digest(model) != expected:
        raise ContractError("this node's frozen parameters differ from the server's (another "
                            "base model file or revision, or a frozen part built from another "
                            "seed): adapters trained on them would not fit the global model")


def identity(context: Context | None) -> dict[str, int | float]:
    """Who this client is to the server, as the ClientApp says it: its partition id, else its
    node id (HaFedHo's |D| counts each client's examples once by it: strategies/examples.py)."""
    if context is None:
        return {}
    return {wire.PARTITION_ID: int(context.node_config.get(wire.NODE_PARTITION_ID, context.node_id))}


class ClientSession:
    """One round on one client (see the module docstring)."""

    def __init__(self, msg: Message | RecordDict, model: torch.nn.Module, *,
                 context: Context | None = None, data: ClientData | None = None,
                 device: torch.device | str | None = None, store: Any = None) -> None:
        content = msg if isinstance(msg, RecordDict) else msg.content
        if wire.RECIPE not in content.config_records:
            raise ContractError(f"message lacks the {wire.RECIPE!r} record: not from an adaptfl strategy")
        recipe = content.config_records[wire.RECIPE]
        self.msg, self.model = msg, model
        content, store = self._held_records(recipe, content, context, store)
        self._read_recipe(recipe, content, context)
        self._load_model(recipe, content, device)
        self._start_stages(recipe, content, context, data, store)

    def _read_recipe(self, recipe: ConfigRecord, content: RecordDict, context: Context | None) -> None:
        """What the server asks this round, checked against this node before anything runs: the
        algorithm, the round, dp's terms under the node's own floor and ledger (privacy/client.py:
        refused here, before any training), and the records against the algorithm's contract."""
        self.algorithm = algorithm_from_recipe(recipe)
        self.info = round_from_recipe(recipe)
        self.privacy, self.sampled = privacy_from_recipe(recipe)
        self.secure = bool(recipe.get(SECURE, False))  # SecAgg+ masks the reply (secagg/client.py)
        self.node_id = context.node_id if context is not None else 0
        self._identity = identity(context)
        self.reply_z, self.booking = node_terms(context, self.privacy, self.sampled, self.info)
        check_records(content, self.algorithm)
        self.config = dict(content.config_records.get(wire.CONFIG, {}))  # Flower's train_config

    def _load_model(self, recipe: ConfigRecord, content: RecordDict,
                    device: torch.device | str | None) -> None:
        """The global model x^r into the session's model (its frozen part checked, not sent), on
        the round's device, and a copy of what was sent: Δ is taken against it."""
        model = self.model
        check_frozen(model, recipe)
        arrays = content.array_records[wire.ARRAYS].to_torch_state_dict()
        load_federated(model, arrays)
        if device is not None:
            model.to(device)
        self.device = next(model.parameters()).device
        # x^r of what the server sent (never the frozen base: no second copy of it)
        state = model.state_dict()
        self.start_state = {n: state[n].detach().clone() for n in arrays}

    def _start_stages(self, recipe: ConfigRecord, content: RecordDict, context: Context | None,
                      data: ClientData | None, store: Any) -> None:
        """The algorithm's client parts started on the round's decoded records and the node's
        durable state, and the round's `LocalUpdate` built and configured by them."""
        self.compression = compression_from_recipe(recipe).for_round(self.info.server_round)
        records = {name: {k: v.to(self.device) for k, v in self._decoded(name, rec).items()}
                   for name, rec in content.array_records.items() if name != wire.ARRAYS}
        self.data = data or ClientData()
        self.info = self.info.for_client(self.data.num_examples)  # local-epochs: this client's own K
        self._ctx = ctx = ClientRound(self.model, self.algorithm, self.info, records, store, self.data)
        self.parts: list[ClientPart] = [stage.start(ctx) for stage in self.algorithm.stages()]
        self.optimizer = build_optimizer(self.model, self.algorithm, self.info)
        for part in self.parts:
            part.configure(self.optimizer)
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self._losses: list[torch.Tensor] = []
        self._stepped = self._lossed = False
        self._g_hat: dict[str, torch.Tensor] | None = None

    def _held_records(self, recipe: ConfigRecord, content: RecordDict, context: Context | None,
                      store: Store | None) -> tuple[RecordDict, Store]:
        """The instruction with the records it leaves out as held by this node (codec/versions.py:
        NotHeld refuses the round), and the node's durable state they are kept in; the versions
        now held are echoed by the reply (`held_versions`, None: a whole instruction)."""
        info = round_from_recipe(recipe)
        if store is None:
            store = ClientStateStore(context, str(recipe.get(CLIENT_STATE_DIR, "")), info.server_round,
                                     info.run_key, bool(recipe.get(CLIENT_STATE_MEMORY, True))
                                     ) if context is not None else MemoryStore()
        content, self.held_versions = take_held(content, store)
        return content, store

    def _decoded(self, name: str, record: ArrayRecord) -> dict[str, torch.Tensor]:
        """A broadcast record as the server's codec for it wrote it (the server keeps the same
        decoded values: strategies/base.py)."""
        arrays = dict(record.to_torch_state_dict())
        codec = self.compression.of(name)
        if codec.lossless:
            return arrays
        spec = self.algorithm.contract(ModelSpec.of(self.model)).down[name]
        expected = codec.record_spec(spec, self.compression.codec_block)
        got = {n: (tuple(t.shape), t.dtype) for n, t in arrays.items()}
        if got != expected:
            raise ContractError(f"record {name!r} is not what codec {codec} writes for this model: "
                                "server and client build different models or run different versions")
        try:
            return codec.decode(arrays, spec, self.compression.codec_block)
        except MalformedEncoding as why:
            raise ContractError(f"record {name!r}: {why}") from None

    # --- the training loop's hooks ------------------------------------------------------------
    def loss(self, x: torch.Tensor, logits: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """The batch loss plus the algorithm's loss terms (FedProx, HaFedHo, MOON); the plain
        loss is recorded for the reply's train-loss."""
        self.record_loss(loss)
        total = loss
        for part in self.parts:
            extra = part.loss(x, logits)
            total = total if extra is None else total + extra
        return total

    def record_loss(self, loss: torch.Tensor) -> None:
        """Keep the plain batch loss for the reply's train-loss (`loss` does it for you)."""
        self._lossed = True
        self._losses.append(loss.detach())

    def backward(self, loss: torch.Tensor, logits: torch.Tensor | None = None,
                 loss_fn: Any = None) -> None:
        """loss.backward(), preceded by Sophia's GNB ĝ on its refresh steps (one extra backward
        through the same graph)."""
        self.optimizer.bs = int(logits.shape[:-1].numel()) if logits is not None else 1
        self._g_hat = None
        if self.optimizer.hessian_due():
            if logits is None:
                raise ValueError("Sophia refreshes its Hessian from the logits: call "
                                 "session.backward(loss, logits)")
            from adaptfl.workloads import task_loss

            names = list(self.params)
            grads = torch.autograd.grad(self.optimizer.extra_loss(logits, loss_fn or task_loss),
                                        [self.params[n] for n in names], retain_graph=True,
                                        allow_unused=True)
            self._g_hat = {n: g for n, g in zip(names, grads, strict=True) if g is not None}
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)

    def step(self) -> None:
        """The algorithm's gradient corrections (SCAFFOLD, FedDyn), then the optimizer step."""
        self.optimizer.step(g_hat=self.correct_gradients())

    def correct_gradients(self) -> dict[str, torch.Tensor] | None:
        """The algorithm's gradient corrections on `p.grad`, in place; returns Sophia's ĝ of
        this step (None when not due): what the optimizer step takes (the cohort engine steps
        many clients' corrected gradients at once, engine/cohort.py)."""
        self._stepped = True
        for part in self.parts:
            part.correct_(self.params)
        return self._g_hat

    # --- the reply ----------------------------------------------------------------------------
    def _check_hooks_used(self) -> None:
        for part in self.parts:
            cls = type(part)
            if cls.correct_ is not ClientPart.correct_ and not self._stepped:
                raise ValueError(f"{self.algorithm.name} corrects the gradients before each step: "
                                 "call session.step() instead of session.optimizer.step()")
            if cls.loss is not ClientPart.loss and not self._lossed:
                raise ValueError(f"{self.algorithm.name} adds a term to the loss: pass each batch "
                                 "loss through session.loss(x, logits, loss)")

    def train_loss(self) -> float:
        return float(torch.stack(self._losses).mean()) if self._losses else float("nan")

    def reply(self, num_examples: int, metrics: Mapping[str, int | float] | None = None,
              batched: str | None = None) -> Message:
        """Δ, the algorithm's records and the metrics, as a reply to the server's message
        (`batched`: the steps ran in a cohort of clients, with these gradients, engine/cohort.py)."""
        if not isinstance(self.msg, Message):
            raise TypeError("a session built from a RecordDict has nothing to reply to; use reply_content")
        return Message(content=self.reply_content(num_examples, metrics, batched=batched),
                       reply_to=self.msg)

    def _warn_steps(self) -> None:
        """The server scales Δ by K: say which setting the training loop should match."""
        if self.info.local_epochs > 0.0:  # K from the epochs and this client's examples
            fix = (f"local-epochs={self.info.local_epochs:g} over this client's "
                   f"{self.data.num_examples} examples at batch-size={self.info.batch_size} is "
                   f"{self.info.local_steps} steps (ceil(E·examples/batch)): run that many")
        else:
            fix = "pass local_steps= to the strategy to match your training loop"
        log.warning("this client took %d local steps, the run's local-steps is %d: the server "
                    "scales Δ by K (Δ_G = -mean Δ/(K·lr), SCAFFOLD's c, FedDyn); %s",
                    self.optimizer.steps, self.info.local_steps, fix)

    def reply_content(self, num_examples: int, metrics: Mapping[str, int | float] | None = None,
                      check_steps: bool = True, batched: str | None = None) -> RecordDict:
        """The reply's records: Δ, the algorithm's uploads and the metrics."""
        self._check_hooks_used()
        if check_steps and self.optimizer.steps != self.info.local_steps:  # Δ_G, c, … divide by K
            self._warn_steps()
        end = self.model.state_dict()
        delta = {n: (end[n].detach() - t).cpu() for n, t in self.start_state.items()}
        train_loss = self.train_loss()
        self._ctx.num_examples = int(num_examples)  # HaFedHo keeps it: next round's p_i
        outputs = [part.finish(self.optimizer, delta, train_loss) for part in self.parts]
        values: dict[str, int | float] = {wire.NUM_EXAMPLES: int(num_examples), **self._identity}
        if self._losses:
            values[wire.TRAIN_LOSS] = train_loss
        values.update(self.optimizer.diagnostics())
        values[wire.STEP_PATH] = wire.STEP_PATHS.index(f"cohort-{batched}") if batched else \
            step_path(self.device, self.optimizer.paths["native"])
        if self.info.local_epochs > 0.0:  # the K this client ran; the server recomputes it
            values[wire.LOCAL_STEPS] = self.info.local_steps
        for out in outputs:
            values.update(out.metrics)
        values.update(metrics or {})
        records = {wire.DELTA: delta, **{n: t for out in outputs for n, t in out.records.items()}}
        if self.privacy.dp == "client":  # clipped and noised here: the server never sees them bare
            self.booking.book_once()  # in the node's own ledger (privacy/node_ledger.py)
            names = shared_records(self.algorithm.contract(ModelSpec.of(self.model)))
            seed = round_seed(self.privacy.dp_seed, "client", self.info.server_round, self.node_id)
            records, values = privatize(records, values, names, self.privacy, self.reply_z, seed,
                                        noised=not self.secure)
            values = released_metrics(values, names)  # nothing of its rows bare
        if not self.compression.lossless:  # after dp's noise: post-processing
            info = self.info
            records, codec_metrics = encode_reply(records, self.compression, self._ctx.store, lambda name:
                                                  self.compression.generator(info.seed, info.server_round,
                                                                             f"node-{self.node_id}", name))
            values.update(codec_metrics)
        content = RecordDict({wire.DELTA: ArrayRecord(records.pop(wire.DELTA)),
                              # cast: dict is invariant; its int/float values are MetricRecordValues
                              wire.METRICS: MetricRecord(cast("dict[str, MetricRecordValues]", values))})
        for name, tensors in records.items():
            content[name] = ArrayRecord(tensors)
        echo(content, self.held_versions)  # what this node now holds (codec/versions.py)
        return content


def step_path(device: torch.device, native_steps: int) -> int:
    """The `step-path` code (wire.STEP_PATHS) of a round: native where the CPU loops ran at least
    one of its steps (the optimizer's `paths`, as local_update/step/choose.py chose them; the
    steps that measure PosRatio/TopMass keep their scores in the fused form by design), cuda on
    a CUDA device, eager otherwise (no compiler, a rule without native loops, a small model)."""
    if native_steps > 0:
        return wire.STEP_PATHS.index("native")
    return wire.STEP_PATHS.index("cuda" if device.type == "cuda" else "eager")
