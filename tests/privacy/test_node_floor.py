"""dp against the server it distrusts (docs/privacy.md, "A client that owns its noise"): a server
that does not follow the protocol plays each attack here, in whole in-process runs (mlp, 3
nodes, tiny Fashion-MNIST), by rewriting what it sends. Every honest node refuses, in one line
naming why, and no reply carrying an update (plain Δ or a masked vector) leaves any node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Message

from adaptfl.algorithms import recipe as recipe_module
from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import SAMPLED
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.privacy.client import NODE_KEYS, NodeFloor
from adaptfl.secagg import aggregate
from adaptfl.secagg.server import SecAggServer
from adaptfl.server_app.abort import RunAborted
from adaptfl.server_app.loop import run_federated
from adaptfl.strategies import broadcast

NODES = 3


def _cfg(tiny_data, tmp_path: Path, **kw: Any) -> RunConfig:  # noqa: ANN001
    values = dict(model="mlp", num_server_rounds=1, local_steps=1, batch_size=16, dp="client",
                  data_dir=tiny_data["fashion-mnist"],
                  figures=False, results_dir=str(tmp_path), weighting="uniform",
                  screen_ratio=0, max_contribution_ratio=0, max_skipped_rounds=5, run_name="attack",
                  client_state_dir=str(tmp_path / "state"),
                  dp_accept_epsilon=1e3)  # tiny federations: the plan's ε is past the default bound
    return RunConfig.of(**{**values, **kw})


def _run(cfg: RunConfig, node_config: dict[str, Any]) -> list[Message]:
    """Every reply a node sent in the run."""
    grid = InProcessGrid(NODES, cfg.to_flower())
    for context in grid.contexts.values():
        context.node_config.update(node_config)
    sent: list[Message] = []
    handler = grid.handler

    def spy(msg: Message, context: Context) -> Message:
        reply = handler(msg, context)
        sent.append(reply)
        return reply

    grid.handler = spy
    try:
        run_federated(grid, cfg)
    except RunAborted:  # every round refused: the run ends without a model
        pass
    return sent


def _recipe_rewrite(monkeypatch, change: Callable[[dict], None]) -> None:  # noqa: ANN001
    real = recipe_module.to_recipe

    def lying(*args: Any, **kwargs: Any) -> dict:
        out = real(*args, **kwargs)
        if out.get(SAMPLED, NODES) == NODES:  # a round's, not the server's own dry run (n = 1)
            change(out)
        return out

    monkeypatch.setattr(broadcast, "to_recipe", lying)


def _downgrade(to: str) -> Callable[[dict], None]:
    def change(recipe: dict) -> None:
        for key in [k for k in recipe if k.startswith("privacy.")]:
            del recipe[key]
        if to != "none":
            recipe.update({"privacy.dp": to, SAMPLED: NODES})
    return change


def _secagg_server(monkeypatch, **lies: Any) -> None:  # noqa: ANN001
    """SecAggServer built with the server's own lies (bound, noise std) in place of the honest ones."""
    def lying(shares, threshold, bits, bound, noise_std, timeout, seed, server_round, plan=None):  # noqa: ANN001, ANN202
        bound = lies.get("bound", lambda b: b)(bound)
        noise_std = lies.get("noise_std", lambda s: s)(noise_std)
        return SecAggServer(shares, threshold, bits, bound, noise_std, timeout, seed, server_round, plan)

    monkeypatch.setattr(aggregate, "SecAggServer", lying)


def _shrunk_ranges(monkeypatch) -> None:  # noqa: ANN001
    real = aggregate.record_ranges
    monkeypatch.setattr(aggregate, "record_ranges", lambda s: {r: c / 4 for r, c in real(s).items()})


ATTACKS = {
    # plain dp='client'
    "inflated n": ({}, lambda m: _recipe_rewrite(m, lambda r: r.update({SAMPLED: 10 ** 10})),
                   "cohort of n=10000000000"),
    "smaller z": ({}, lambda m: _recipe_rewrite(m, lambda r: r.update({"privacy.dp-noise-multiplier": 0.01})),
                  "dp-noise-multiplier=0.01 is below"),
    "dp none": ({"dp-required": "true"}, lambda m: _recipe_rewrite(m, _downgrade("none")),
                "dp='none' and this node's dp-required"),
    "dp central": ({"dp-min-noise-multiplier": 1.0}, lambda m: _recipe_rewrite(m, _downgrade("central")),
                   "dp='central' and this node's dp-required"),
    # dp='client' under SecAgg+
    "secagg: inflated n": ({}, lambda m: _recipe_rewrite(m, lambda r: r.update({SAMPLED: 10 ** 6})),
                           "cohort of n=1000000"),
    "secagg: dp none": ({"dp-required": "true"}, lambda m: _recipe_rewrite(m, _downgrade("none")),
                        "dp='none' and this node's dp-required"),
    "secagg: zero noise": ({}, lambda m: _secagg_server(m, noise_std=lambda s: 0.0), "noise std 0 is below"),
    "secagg: half noise": ({}, lambda m: _secagg_server(m, noise_std=lambda s: s / 2),
                           "is below this node's own"),
    "secagg: shrunk range": ({}, _shrunk_ranges, "below its clipping norm"),
    "secagg: misstated B": ({}, lambda m: _secagg_server(m, bound=lambda b: b // 64),
                            "is not the B of 3 nodes"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_honest_node_refuses_a_lying_server_and_nothing_bare_leaves(attack: str, tiny_data, tmp_path,
                                                                         monkeypatch) -> None:
    node_config, play, says = ATTACKS[attack]
    cfg = _cfg(tiny_data, tmp_path, **({"secagg": "secagg+"} if attack.startswith("secagg") else {}))
    play(monkeypatch)
    replies = _run(cfg, node_config)
    carrying = [r for r in replies if not r.has_error() and
                (wire.DELTA in r.content.array_records or wire.MASKED in r.content.array_records)]
    refused = [r.error.reason for r in replies if r.has_error()]
    assert carrying == [], attack  # no update, plain or masked
    assert len(refused) == NODES and all(says in why and "\n" not in why for why in refused), refused


@pytest.mark.parametrize("secagg", ["none", "secagg+"])
def test_an_honest_server_is_answered_by_nodes_with_a_floor(secagg: str, tiny_data, tmp_path) -> None:
    """The same nodes (dp-required, a floor at the recipe's z, a cohort cap of the run's n)
    answer the honest server: the refusals above are the lies', not the floor's."""
    cfg = _cfg(tiny_data, tmp_path, secagg=secagg)
    replies = _run(cfg, {"dp-required": "true", "dp-min-noise-multiplier": 1.0, "dp-max-cohort": NODES})
    assert [r.error.reason for r in replies if r.has_error()] == []
    key = wire.MASKED if secagg == "secagg+" else wire.DELTA
    assert sum(key in r.content.array_records for r in replies) == NODES


def test_a_floor_key_set_requires_dp_and_a_bad_value_is_one_line() -> None:
    assert not NodeFloor.of({}).dp_required
    assert NodeFloor.of({"dp-max-clip-norm": 0.1}).dp_required  # a floor was meant to bind
    assert not NodeFloor.of({"dp-max-clip-norm": 0.1, "dp-required": "false"}).dp_required
    assert NodeFloor.of({}).reply_multiplier == pytest.approx(1.0 / 10 ** 0.5)
    with pytest.raises(ValueError, match="node config dp-max-cohort='x' must be a number > 0"):
        NodeFloor.of({"dp-max-cohort": "x"})
    assert {k.key for k in NODE_KEYS} >= {"dp-required", "dp-max-cohort", wire.NODE_SECAGG_REQUIRED}


def test_the_docs_node_key_table_is_generated_from_the_declaration() -> None:
    from adaptfl.privacy.client import PAGE, node_key_table

    text = (Path(__file__).resolve().parents[2] / PAGE).read_text()
    assert node_key_table() in text, "stale: run python scripts/regenerate_docs.py"


def test_nodes_whose_floor_is_below_the_defaults_run_a_recipe_the_defaults_refuse(tiny_data,
                                                                                   tmp_path) -> None:
    """Flower's fl-dp-sa settings (z = 0.2, C = 10) with every node's floor set to accept them:
    the server's own dry run before round 1 applies no node's floor (it is no node), so the
    nodes answer; a session with no node behind it keeps the defaults' floor."""
    from adaptfl.client_app.session import ClientSession
    from adaptfl.strategies.base import AdaptiveStrategy

    cfg = _cfg(tiny_data, tmp_path, dp_noise_multiplier=0.2, dp_clip_norm=10.0)
    replies = _run(cfg, {"dp-min-noise-multiplier": 0.2, "dp-max-clip-norm": 10.0, "dp-max-cohort": NODES})
    assert [r.error.reason for r in replies if r.has_error()] == []
    assert sum(wire.DELTA in r.content.array_records for r in replies) == NODES
    strategy = AdaptiveStrategy(cfg)
    model = torch.nn.Linear(3, 2)
    strategy.initialize(model.state_dict())
    with pytest.raises(ValueError, match="dp-noise-multiplier=0.2 is below its dp-min-noise-multiplier=1"):
        ClientSession(strategy.instruction(1, sampled=NODES), model)
