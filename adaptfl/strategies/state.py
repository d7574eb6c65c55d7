"""All server state in one serialisable object, so a run can be checkpointed and resumed; and
the report of one round, what the metrics file records of it."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from adaptfl.core import wire
from adaptfl.strategies.ownership import Ownership
from adaptfl.strategies.secagg_search import Search

Tensors = dict[str, torch.Tensor]


@dataclass
class ServerState:
    server_round: int  # the last completed round (0 before round 1)
    model: Tensors  # the global model x, by state_dict name
    extras: dict[str, Tensors] = field(default_factory=dict)  # wire name -> tensors (Δ_G, v̄)
    sampling_rng: torch.Tensor = field(  # torch.Generator state for client sampling
        default_factory=lambda: torch.Generator().manual_seed(0).get_state())
    # Names this job's durable client state (client_app/client_state.py): new for every run,
    # kept across a resume (Flower gives the resumed run a new run id, so that can't serve).
    run_key: str = field(default_factory=lambda: uuid.uuid4().hex)
    # which node each partition id belongs to, and what decided it (strategies/ownership.py)
    ownership: Ownership = field(default_factory=Ownership)
    # SecAgg+: who sent an input out of range, and who is left out for it (strategies/secagg_search.py)
    secagg_search: Search = field(default_factory=Search)
    # node -> record -> the version it holds, as its last reply echoed it (codec/versions.py):
    # a record goes to it without its bytes while its version is the one held
    held: dict[int, dict[str, int]] = field(default_factory=dict)
    # model version -> that earlier model, the last few (model-delta: a delta against it)
    kept_models: dict[int, Tensors] = field(default_factory=dict)

    @property
    def partition_owners(self) -> dict[int, int]:
        """partition id -> its node (the ledger's own dict: changes to it are the state's)."""
        return self.ownership.owners

    def clone(self) -> ServerState:
        return ServerState(
            server_round=self.server_round,
            model={k: v.clone() for k, v in self.model.items()},
            extras={name: {k: v.clone() for k, v in t.items()} for name, t in self.extras.items()},
            sampling_rng=self.sampling_rng.clone(),
            run_key=self.run_key,
            ownership=self.ownership.clone(),
            secagg_search=self.secagg_search.clone(),
            held={node: dict(versions) for node, versions in self.held.items()},
            kept_models={v: {k: t.clone() for k, t in m.items()} for v, m in self.kept_models.items()},
        )

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({"server_round": self.server_round, "model": self.model,
                    "extras": self.extras, "sampling_rng": self.sampling_rng,
                    "run_key": self.run_key, "ownership": self.ownership.as_dict(),
                    "secagg_search": self.secagg_search.as_dict(),
                    "held": self.held, "kept_models": self.kept_models}, buffer)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> ServerState:
        raw = torch.load(io.BytesIO(blob), weights_only=True)
        return cls(server_round=int(raw["server_round"]), model=raw["model"],
                   extras=raw["extras"], sampling_rng=raw["sampling_rng"],
                   run_key=str(raw["run_key"]),
                   ownership=Ownership.from_dict(raw.get("ownership", {}), raw.get("partition_owners", {})),
                   secagg_search=Search.from_dict(raw["secagg_search"]) if "secagg_search" in raw
                   else Search(),  # a checkpoint from before the search
                   held={int(node): {str(k): int(v) for k, v in versions.items()}
                         for node, versions in raw.get("held", {}).items()},  # none: all whole
                   kept_models={int(v): m for v, m in raw.get("kept_models", {}).items()})

    def save(self, path: Path) -> None:
        """Write atomically: a crash leaves the previous checkpoint intact."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(self.to_bytes())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ServerState:
        return cls.from_bytes(path.read_bytes())


@dataclass
class RoundReport:
    """What happened in one round, for the metrics file."""

    sampled: int = 0
    lr: float = 0.0  # the round's effective lr (0: not a training round)
    accepted: int = 0
    answered: int = 0  # sampled nodes that sent a reply (not a failure): what min-replies counts
    rejected: dict[str, str] = field(default_factory=dict)  # node id (or "unknown") -> reason
    skipped: bool = False
    skip_reason: str = ""  # why the state was kept: too few replies, or the round refused
    bytes_down: int = 0
    bytes_up: int = 0
    # record -> bytes over the wire this round, all messages together (the model is "arrays");
    # and what the same records take at fp32, for the compression ratio
    down_bytes: dict[str, int] = field(default_factory=dict)
    up_bytes: dict[str, int] = field(default_factory=dict)
    fp32_bytes: int = 0
    screened: int = 0  # replies dropped for a norm beyond screen-ratio × the others' median
    screen_ratio_max: float = 0.0  # the largest such ratio among the replies kept
    clipped: int = 0  # replies pulled back to the contribution bound (max-contribution-ratio)
    latency: dict[str, float] = field(default_factory=dict)  # node -> seconds to its reply
    metrics: dict[str, float] = field(default_factory=dict)
    codec_warmup: bool | None = None  # with codec-warmup: whether this round ran the warm-up codecs
    # partition id (node id for a reply without one) -> where each accepted reply's client ran
    # and its state came from ("ray-node" as 12 hex digits, "client-state" and
    # "local-state-source" 0/1/2, "peak-memory-mb", "step-path" by name), for replies that report
    # them, and its "node-id"
    clients: dict[str, dict[str, int | float | str]] = field(default_factory=dict)
    # SecAgg+'s search for a node whose input put the sum out of reach (strategies/secagg_search.py):
    # secagg-suspects, secagg-excluded, secagg-narrowed and secagg-search-stopped, as the row has them
    secagg: dict[str, list[int] | dict[str, str] | bool | str] = field(default_factory=dict)

    def step_path(self) -> str | None:
        """The local-step paths the accepted replies took ("native", or e.g. "eager+native" where
        they differ), for the round's metrics row; None if no reply said."""
        paths = sorted({str(c[wire.STEP_PATH]) for c in self.clients.values() if wire.STEP_PATH in c})
        return "+".join(paths) or None

    def note_client(self, node: int, metrics: Mapping[str, float | int]) -> None:
        """Per accepted reply, not averaged: the Ray node it ran on, where its client state came
        from and its peak memory. Keyed by the partition id (metrics.jsonl's readers count
        partitions); noted after the partition binding, so a node that claimed another's id has
        been dropped and cannot overwrite the owner's entry."""
        noted: dict[str, int | float | str] = {}
        if wire.RAY_NODE in metrics:
            noted[wire.RAY_NODE] = f"{int(metrics[wire.RAY_NODE]):012x}"
        for source in (wire.CLIENT_STATE, wire.LOCAL_STATE_SOURCE):  # durable state: 0/1/2
            if source in metrics:
                noted[source] = int(metrics[source])
        if wire.PEAK_MEMORY in metrics:
            noted[wire.PEAK_MEMORY] = float(metrics[wire.PEAK_MEMORY])
        code = metrics.get(wire.STEP_PATH)
        if isinstance(code, int) and 0 <= code < len(wire.STEP_PATHS):  # else not said
            noted[wire.STEP_PATH] = wire.STEP_PATHS[code]
        if noted:
            noted["node-id"] = node  # what `latency` and `rejected` are keyed by
            self.clients[str(int(metrics.get(wire.PARTITION_ID, node)))] = noted
