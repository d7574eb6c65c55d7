"""A node's own privacy floor, from its node config (`--node-config`, like data-dir), never from
the server: the keys below are declared once here (`NODE_KEYS`; docs/privacy.md's node-key table
is generated from it). The server's recipe is checked against the floor before the node trains;
a recipe that asks for less is refused in one line (ValueError: the client app turns it into an
error reply naming the reason, which the run records under `rejected`).

The floor binds what the node adds whatever the server says: the per-reply noise multiplier of
dp='client' is z/√n for the z and the cohort n the recipe names, and a node adds at least
z_min/√cap of it (`dp-min-noise-multiplier` over √`dp-max-cohort`), so a server that names an
inflated n, a smaller z, a larger C, dp='none' or 'central' (to a node that requires dp) or a
seed gets a refusal, never a weaker mechanism (docs/privacy.md, "A client that owns its noise").
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import Context

from adaptfl.core import wire
from adaptfl.core.privacy_settings import Privacy
from adaptfl.core.stage import RoundInfo
from adaptfl.privacy import node_ledger


@dataclass(frozen=True)
class NodeKey:
    """One node-config key of the privacy floor: its name, default and meaning."""

    key: str
    default: float | int | bool | None
    meaning: str


MIN_NOISE = "dp-min-noise-multiplier"
MAX_CLIP = "dp-max-clip-norm"
MAX_STATE_CLIP = "dp-max-state-clip-norm"
MAX_COHORT = "dp-max-cohort"
DP_REQUIRED = "dp-required"
TESTING_SEED = "dp-testing-reproducible-noise"
MAX_EPSILON, NODE_DELTA, NODE_LEDGER = node_ledger.MAX_EPSILON, node_ledger.DELTA, node_ledger.LEDGER
FLOOR_KEYS = (MIN_NOISE, MAX_CLIP, MAX_STATE_CLIP, MAX_COHORT)

NODE_KEYS = (
    NodeKey(MIN_NOISE, 1.0, "the least z of a dp='client' recipe this node accepts"),
    NodeKey(MAX_CLIP, 1.0, "the largest C_Δ it clips Δ to"),
    NodeKey(MAX_STATE_CLIP, 1.0, "the largest C_s it clips each other shared record to"),
    NodeKey(MAX_COHORT, 10, "the largest cohort n it divides its noise by: each reply carries "
            "noise multiplier z/√n ≥ dp-min-noise-multiplier/√dp-max-cohort, whatever n the "
            "server names (a recipe below that is refused)"),
    NodeKey(DP_REQUIRED, None, "true: recipes of dp='none' or 'central' are refused (the server "
            "would see the update bare); unset: true when any key above is set"),
    NodeKey(wire.NODE_SECAGG_REQUIRED, False, "true: the node trains only inside SecAgg+ "
            "(docs/secagg.md)"),
    NodeKey(MAX_EPSILON, 1000.0, "dp='client': the most ε (at dp-node-delta) this node's own ledger "
            "of its training replies may reach, over every run on its rows; a request past it, or "
            "for a round it answered already, is refused (docs/privacy.md, 'A node's own ledger')"),
    NodeKey(NODE_DELTA, 1e-5, "the δ of that ε"),
    NodeKey(NODE_LEDGER, None, "path of the node's ledger; unset: node-<fingerprint of its rows>"
            ".jsonl in the per-user ledger dir ($ADAPTFL_LEDGER_DIR, else "
            "~/.local/share/adaptfl/ledgers)"),
    NodeKey(TESTING_SEED, False, "TESTING ONLY: accept a server's dp-seed (the noise is then "
            "known to the server)"),
)
DEFAULTS = {k.key: k.default for k in NODE_KEYS}
PAGE = "docs/privacy.md"
TABLE_HEADER = "| node-config key | default | meaning |"
TABLE_END = "<!-- end of node-key table -->"


def node_key_table() -> str:
    """docs/privacy.md's table of these keys (scripts/regenerate_docs.py writes it)."""
    rows = [f"| `{k.key}` | {'(see meaning)' if k.default is None else str(k.default).lower()} | "
            f"{k.meaning} |" for k in NODE_KEYS]
    return "\n".join([TABLE_HEADER, "|---|---|---|", *rows]) + "\n\n"


NODE_CONFIG_ENV = "ADAPTFL_NODE_CONFIG"  # the node owner's keys of NODE_KEYS, "k=v k=v"


def node_settings(node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The node's config with the keys of NODE_KEYS its owner set in $ADAPTFL_NODE_CONFIG
    (`--node-config`'s "key=value key=value"): the way to set a floor, cap and budget where no
    --node-config reaches the node (Flower's simulation, whose nodes get only partition-id and
    num-partitions). The environment is the node's process's, never the server's; a key set in
    both is the node config's."""
    text = os.environ.get(NODE_CONFIG_ENV, "").strip()
    pairs = [item.split("=", 1) for item in text.split()] if text else []
    known = {k.key for k in NODE_KEYS}
    bad = [item for item in pairs if len(item) != 2 or item[0] not in known]
    if bad:
        raise ValueError(f"${NODE_CONFIG_ENV}: {'='.join(bad[0])!r} is not key=value of a node key "
                         f"({', '.join(sorted(known))})")
    return {**dict(pairs), **node_config}


def node_number(node_config: Mapping[str, Any], key: str) -> float:
    """A number > 0 of the node config (its default when unset), or one line saying why not."""
    value = node_config.get(key, DEFAULTS[key])
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if not math.isfinite(out) or out <= 0.0:
        raise ValueError(f"node config {key}={value!r} must be a number > 0")
    return out


def node_budget(node_config: Mapping[str, Any]) -> node_ledger.Budget:
    """The bound of the node's own ledger (node_ledger.py)."""
    delta = node_number(node_config, NODE_DELTA)
    if delta >= 1.0:
        raise ValueError(f"node config {NODE_DELTA}={delta:g} must be below 1")
    return node_ledger.Budget(node_number(node_config, MAX_EPSILON), delta)


def truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class NodeFloor:
    """The floor one node's config sets (defaults: NODE_KEYS)."""

    min_noise: float
    max_clip: float
    max_state_clip: float
    max_cohort: int
    dp_required: bool
    testing_seed: bool

    @classmethod
    def of(cls, node_config: Mapping[str, Any]) -> NodeFloor:
        def number(key: str) -> float:
            return node_number(node_config, key)

        required = node_config.get(DP_REQUIRED)
        return cls(number(MIN_NOISE), number(MAX_CLIP), number(MAX_STATE_CLIP),
                   max(1, int(number(MAX_COHORT))),
                   truthy(required) if required is not None else any(k in node_config for k in FLOOR_KEYS),
                   truthy(node_config.get(TESTING_SEED, False)))

    @property
    def reply_multiplier(self) -> float:
        """The least noise multiplier of one reply's own noise: z_min/√cap."""
        return self.min_noise / math.sqrt(self.max_cohort)


def _refuse(why: str) -> ValueError:
    return ValueError(f"refused by this node: {why}")


def check_floor(privacy: Privacy, sampled: int, node_config: Mapping[str, Any]) -> float:
    """Refuse (ValueError, one line) a recipe below this node's floor; under dp='client' the
    noise multiplier of this node's reply: max(z/√n, z_min/√cap), which the checks make z/√n."""
    floor = NodeFloor.of(node_config)
    if privacy.dp != "client":
        if floor.dp_required:
            raise _refuse(f"the recipe says dp={privacy.dp!r} and this node's {DP_REQUIRED} is on "
                          "(its update would reach the server bare); only dp='client' is answered")
        return 0.0
    if privacy.dp_seed >= 0 and not floor.testing_seed:
        raise _refuse(f"the server names dp-seed={privacy.dp_seed}, which would let it subtract "
                      "this node's noise")
    z = privacy.dp_noise_multiplier
    if z < floor.min_noise:
        raise _refuse(f"dp-noise-multiplier={z:g} is below its {MIN_NOISE}={floor.min_noise:g}")
    if privacy.dp_clip_norm > floor.max_clip:
        raise _refuse(f"dp-clip-norm={privacy.dp_clip_norm:g} is above its {MAX_CLIP}={floor.max_clip:g}")
    if privacy.dp_state_clip_norm > floor.max_state_clip:
        raise _refuse(f"dp-state-clip-norm={privacy.dp_state_clip_norm:g} is above its "
                      f"{MAX_STATE_CLIP}={floor.max_state_clip:g}")
    if sampled < 1 or z / math.sqrt(sampled) < floor.reply_multiplier * (1.0 - 1e-12):
        raise _refuse(f"a cohort of n={sampled} at dp-noise-multiplier={z:g} leaves this reply "
                      f"noise multiplier {z / math.sqrt(max(sampled, 1)):.4g}, below its floor "
                      f"{MIN_NOISE}/√{MAX_COHORT} = {floor.min_noise:g}/√{floor.max_cohort}")
    return max(z / math.sqrt(sampled), floor.reply_multiplier)


@dataclass
class NodeBooking:
    """One session's training reply in the node's own ledger (privacy/node_ledger.py): booked
    by adaptfl's ClientApp before it trains, under the name of its rows; a ClientApp of one's own
    books it when the reply is made (ClientSession.reply_content), under the node config's name."""

    node_config: Mapping[str, Any] | None  # None: no node (the server's own dry run of a reply)
    release: node_ledger.Release
    booked: bool = False

    @classmethod
    def of(cls, node_config: Mapping[str, Any] | None, run: str, server_round: int,
           reply_z: float) -> NodeBooking:
        return cls(node_config, node_ledger.Release(run, server_round, "train", reply_z))

    def book(self, data_key: str) -> float:
        """Book the reply (ValueError, one line: a round answered already, or past
        dp-node-max-epsilon); ε of the node's ledger after it."""
        config = self.node_config or {}
        spent = node_ledger.book(node_ledger.ledger_path(config, data_key), self.release,
                                 node_budget(config))
        self.booked = True
        return spent

    def book_once(self) -> None:
        """At the reply: book it unless it was booked before training."""
        if not self.booked and self.node_config is not None:
            self.book(node_ledger.config_key(self.node_config))


def check_evaluation(privacy: Privacy) -> None:
    """Federated evaluation under dp='client' is not answered: its scores (the global model's on
    the node's rows, the locally adapted model's after steps on them) are exact functions of the
    node's data that no noise covers (docs/privacy.md, "What a node returns")."""
    if privacy.dp == "client":
        raise _refuse("federated evaluation under dp='client' would return this node's scores bare "
                      "(no noise covers them); evaluate centrally (fraction-evaluate=0)")


_dry_runs: list[bool] = []  # set while the server makes its own dry-run reply


@contextlib.contextmanager
def server_dry_run() -> Iterator[None]:
    """The server's own reply before round 1 (server_app/loop.py `preflight`): no node answers
    it, so no node's floor applies (each node checks its own when it is asked; the server does
    not know them) and nothing is booked. Elsewhere a session without a context keeps the
    defaults' floor."""
    _dry_runs.append(True)
    try:
        yield
    finally:
        _dry_runs.pop()


def node_terms(context: Context | None, privacy: Privacy, sampled: int, info: RoundInfo
               ) -> tuple[float, NodeBooking]:
    """A session's terms from its node: the reply's noise multiplier under the node's floor
    (`check_floor`, ValueError when refused) and its booking in the node's ledger. Without a
    context no ledger, and the defaults' floor unless it is the server's own dry run (none)."""
    node_config = node_settings(context.node_config) if context is not None else {}
    if context is None and _dry_runs and privacy.dp == "client":
        reply_z = privacy.dp_noise_multiplier / math.sqrt(max(sampled, 1))
    else:
        reply_z = check_floor(privacy, sampled, node_config)
    run = info.run_key or str(context.run_id if context is not None else 0)
    return reply_z, NodeBooking.of(node_config if context is not None else None, run,
                                   info.server_round, reply_z)
