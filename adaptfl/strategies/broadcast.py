"""What `AdaptiveStrategy` sends in a round: the sampled nodes (seeded, the RNG in the state;
under dp from OS entropy), one instruction for all of them (the model as `arrays`, the
`recipe`, Flower's train config with "server-round", and the records the algorithm's
components send, through the round's codecs), the bytes that costs, and the records as the
clients decode them, which the server keeps (docs/compression.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from adaptfl.algorithms.recipe import FROZEN_DIGEST, to_recipe
from adaptfl.algorithms.sampling import sample_size, secret_sample, wait_for_nodes
from adaptfl.codec import model_delta
from adaptfl.codec.codec import spec_bytes, wire_bytes
from adaptfl.codec.settings import KEPT_MODELS
from adaptfl.codec.versions import Versions, addressed, echoed, record_version, versions_of
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.core.stage import RoundInfo
from adaptfl.privacy import server as dp
from adaptfl.strategies.census import take_census
from adaptfl.strategies.intake import ReplyIntake
from adaptfl.strategies.secagg_search import MIN_COHORT
from adaptfl.strategies.state import RoundReport, ServerState, Tensors
from adaptfl.strategies.train_config import refuse_adaptfl_keys, train_config_lr, with_lr


class RoundBroadcast(ReplyIntake):
    """The sending half of `AdaptiveStrategy`'s round, on its round state (set there)."""

    num_nodes: int  # connected nodes at the last sampling
    data_key: str  # the data's identity: its per-user dp ledger (privacy/ledger.py)
    train_lr: dict[int, float]  # round -> the lr its train config gave
    _censused: set[int]  # nodes asked their examples (census.py)
    announced: Versions  # this round's version of each record (codec/versions.py)

    def initialize(self, arrays: Mapping[str, torch.Tensor], spec: ModelSpec | None = None
                   ) -> None:  # AdaptiveStrategy's
        raise NotImplementedError

    def round_info(self, server_round: int, train_lr: float | None = None) -> RoundInfo:
        """The round's values (`.lr`: its effective lr): the run's schedule, or the lr the train
        config gave this round (train_config.py), kept for the round's aggregation."""
        assert self.state is not None
        if train_lr is not None:
            self.train_lr = {server_round: train_lr}
        info = self.cfg.round_info(server_round, self.state.run_key)
        given = self.train_lr.get(server_round)
        return info if given is None else with_lr(info, given, self.cfg.lr)

    def sample_nodes(self, grid: Grid) -> list[int]:
        assert self.state is not None
        fed = self.cfg.federation
        search = self.state.secagg_search  # SecAgg+: a node that sent a sum out of reach is out
        nodes = [n for n in wait_for_nodes(grid, fed) if n not in search.excluded]
        self.num_nodes = len(nodes)  # N, for rules that scale by |S|/N (SCAFFOLD, FedDyn)
        self._connected = set(nodes)
        count = sample_size(fed, len(nodes))
        if self.cfg.privacy.on:  # amplification by sampling needs a sample nobody can recompute
            sample = sorted(secret_sample(nodes, count))
        else:
            gen = torch.Generator()
            gen.set_state(self.state.sampling_rng)
            order = torch.randperm(len(nodes), generator=gen)[:count].tolist()
            self.state.sampling_rng = gen.get_state()
            sample = [nodes[i] for i in sorted(order)]
        # while liars are searched for, explanations of the failed sums sit out (strategies/secagg_search.py)
        least = max(MIN_COHORT, fed.min_replies)
        return search.cohort(sample, self.cfg.secagg.secagg_liars, least) if self.cfg.secagg.on else sample

    def payload(self) -> dict[str, Tensors]:
        """The records the algorithm's components send this round (all in its contract)."""
        assert self.state is not None and self.spec is not None
        algorithm, out = self.cfg.algorithm, {}
        for stage in algorithm.stages():
            out.update(stage.payload(self.state.extras, self.spec, algorithm))
        undeclared = sorted(set(out) - set(self.contract().down))
        if undeclared:  # a component sending what it did not declare is a bug, not a choice
            raise RuntimeError(f"records {undeclared} are sent but not in {algorithm.name}'s contract")
        return out

    def instruction(self, server_round: int, config: ConfigRecord | None = None,
                    sampled: int = 1) -> RecordDict:
        """The round's message content, the same for every sampled node (`sampled` of them)."""
        assert self.state is not None
        cfg = self.cfg
        info = self.round_info(server_round, train_config_lr(config or {}))
        recipe = to_recipe(cfg.algorithm, info, cfg.data, cfg.runtime, cfg.output.client_state_dir,
                           cfg.output.client_state_memory, cfg.llm,
                           cfg.privacy, sampled, cfg.compression, cfg.secagg.on)
        if self.spec is not None and self.spec.frozen_digest:
            recipe[FROZEN_DIGEST] = self.spec.frozen_digest
        refuse_adaptfl_keys(config or {}, type(self).__name__)
        train_config = ConfigRecord(dict(config or {}))
        train_config["server-round"] = server_round  # as Flower's FedAvg does
        content = RecordDict({wire.ARRAYS: ArrayRecord(self.state.model), wire.RECIPE: ConfigRecord(recipe),
                              wire.CONFIG: train_config})
        compression = cfg.compression.for_round(server_round)  # codec-warmup: dense in rounds 1..R
        if self.state.server_round < cfg.compression.codec_warmup < server_round:
            self._as_broadcast(self.state, server_round)  # rounds skipped across the warm-up's end
        for name, tensors in self.payload().items():  # as committed: re-encoding gives the same codes
            content[name] = ArrayRecord(compression.of(name).encode(tensors, compression.codec_block))
        return content

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.state is None:
            self.initialize(arrays.to_torch_state_dict())
        nodes = self.sample_nodes(grid)
        assert self.state is not None
        if self.partition_sizes is None and any(s.counts_examples() for s in self.cfg.algorithm.stages()):
            recipe = self.instruction(server_round, None, len(nodes)).config_records[wire.RECIPE]
            take_census(grid, self._connected, self._censused, recipe, self.state.extras,
                        self.cfg.federation.round_timeout or None)  # HaFedHo's |D| (census.py)
        dp.before_round(self.cfg.privacy, self.state, server_round, self.cfg.federation.num_server_rounds,
                        len(nodes), self.num_nodes, self.contract(),
                        self.cfg.federation.min_replies, self.data_key)  # refused: nothing is sent
        content = self.instruction(server_round, config, len(nodes))
        self.report = RoundReport(sampled=len(nodes), lr=self.round_info(server_round).lr)
        if self.cfg.compression.codec_warmup:  # the row says which codecs ran
            self.report.codec_warmup = server_round <= self.cfg.compression.codec_warmup
        self.announced = versions_of(content, self.repeated_records())  # bytes only where a node lacks them
        deltas: dict[int, ArrayRecord] = {}  # held model version -> the model's delta against it
        messages = [Message(content=self._for_node(content, node, deltas), dst_node_id=node,
                            message_type=MessageType.TRAIN) for node in nodes]
        self._count_down(content, messages)
        self._messages = messages
        return messages

    def repeated_records(self) -> set[str]:
        """The records this run may send unchanged in a later round, so worth a node's copy
        (codec/versions.py): the model where model-delta encodes it against the node's copy,
        and what the algorithm's components declare (a frozen v̄, HaFedHo's |D|)."""
        out = {name for stage in self.cfg.algorithm.stages() for name in stage.records_down_repeated()}
        return out | {wire.ARRAYS} if self.cfg.compression.model_delta != "none" else out

    def _for_node(self, content: RecordDict, node: int, deltas: dict[int, ArrayRecord]) -> RecordDict:
        """One node's instruction: less what it holds (codec/versions.py); under model-delta
        the model as its delta against the one the node holds, where the server kept that one
        (codec/model_delta.py; one delta a round per model held)."""
        assert self.state is not None
        held = self.state.held.get(node, {})
        out = addressed(content, self.announced, held)
        base = held.get(wire.ARRAYS)
        if self.cfg.compression.model_delta == "none" or base is None or \
                wire.ARRAYS not in out.array_records or base not in self.state.kept_models:
            return out
        if base not in deltas:
            deltas[base] = ArrayRecord(model_delta.encode(self.state.model, self.state.kept_models[base],
                                                          self.cfg.compression.model_delta))
        del out[wire.ARRAYS]
        out[wire.ARRAYS_DELTA] = deltas[base]
        out.config_records[wire.VERSIONS][wire.ARRAYS_DELTA] = base
        return out

    def keep_model(self, new: ServerState) -> None:
        """model-delta: the model `new` replaces joins the last KEPT_MODELS the server keeps."""
        assert self.state is not None
        if self.cfg.compression.model_delta == "none":
            return
        old = {n: t.detach().clone() for n, t in self.state.model.items()}
        kept = {**new.kept_models, record_version(ArrayRecord(old)): old}
        new.kept_models = dict(list(kept.items())[-KEPT_MODELS:])

    def _count_down(self, content: RecordDict, messages: list[Message]) -> None:
        """The round's bytes down, by record as they go over the wire in each message, and what
        the whole instruction takes at fp32 for every node."""
        assert self.state is not None
        raw = {wire.ARRAYS: self.state.model, **self.payload()}
        for name in content.array_records:
            self.report.fp32_bytes += len(messages) * spec_bytes({n: (tuple(t.shape), t.dtype)
                                                                  for n, t in raw[name].items()})
        for name in {n for m in messages for n in m.content.array_records} | set(content.array_records):
            self.report.down_bytes[name] = sum(wire_bytes(m.content.array_records[name]) for m in messages
                                               if name in m.content.array_records)
        self.report.bytes_down = sum(self.report.down_bytes.values())

    def learn_held(self, echoes: Mapping[int, ConfigRecord | None]) -> None:
        """What each node sampled this round holds now, from its reply's echo (codec/versions.py);
        a node absent from `echoes` (no usable reply) is forgotten: its next instruction is whole.
        Bookkeeping of what went where, kept in a skipped round too (the nodes hold it all the same)."""
        assert self.state is not None
        for node in {m.metadata.dst_node_id for m in self._messages}:
            held = echoed(echoes.get(node), self.announced)
            if held:
                self.state.held[node] = held
            else:
                self.state.held.pop(node, None)

    def _as_broadcast(self, state: ServerState, next_round: int) -> None:
        """The records the server sends in `next_round`, as its codecs deliver them: the server
        keeps what its clients decode, bit for bit (values whose re-encoding decodes to
        themselves: Codec.settled; so a kept record, v̄ in a round without v, settles to itself)."""
        server_round = state.server_round
        compression = self.cfg.compression.for_round(next_round)  # codec-warmup ends at a round
        for name in self.contract().down:
            codec = compression.of(name)
            if not codec.lossless and name in state.extras:
                generator = compression.generator(self.cfg.federation.seed, server_round, "server", name)
                state.extras[name] = codec.settled(state.extras[name], compression.codec_block, generator)
