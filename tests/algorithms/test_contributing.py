"""docs/contributing.md ("Contributing: a new component") holds: the server optimizer it shows, dropped as one
file into the server-optimizer folder, is found by the registry, selected by `server-opt=` and
by the strategies' keywords, listed in the key table, runs in a strategy's rounds with its
moments in the server state, and the test the section shows passes against it.

The file goes into a temporary folder added to the package's search path (never into the
checkout), and everything it registered is removed afterwards, so other tests see the registry
(and the key table of docs/algorithms.md) as the checkout declares it."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from adaptfl.algorithms.config import RunConfig, key_table
from adaptfl.core import params, wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import AdaptiveStrategy, FedACT
from tests.support.flower_processes import PROJECT

MODULE = "adaptfl.server_rules.server_opt.rmsprop"


def readme_block(first_line: str) -> str:
    """The ```python block of docs/contributing.md that starts with `first_line`."""
    text = (PROJECT / "docs" / "contributing.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        if block.startswith(first_line + "\n"):
            return block
    raise AssertionError(f"docs/contributing.md has no block starting {first_line!r}")


@pytest.fixture
def rmsprop_file(tmp_path: Path) -> Iterator[ModuleType]:
    """The page's file, as server_rules/server_opt/rmsprop.py would be, found by the registry's own
    discovery; unregistered afterwards."""
    import adaptfl.server_rules.server_opt as package

    folder = tmp_path / "server_opt"
    folder.mkdir()
    (folder / "rmsprop.py").write_text(readme_block("# server_rules/server_opt/rmsprop.py"))
    package.__path__.append(str(folder))
    params._discovered = False  # discover again, as a fresh process would
    try:
        params.registry("server_opt")
        yield sys.modules[MODULE]
    finally:
        package.__path__.remove(str(folder))
        params._REGISTRY["server_opt"].pop("rmsprop", None)
        sys.modules.pop(MODULE, None)
        params._discovered = True


def test_without_the_file_the_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"invalid server-opt='rmsprop': choose one of \["):
        RunConfig.of(algorithm="fedavg", server_opt="rmsprop")
    assert "rmsprop" not in key_table()


def test_one_new_file_is_selectable_and_documented(rmsprop_file: ModuleType) -> None:
    cls = params.registry("server_opt")["rmsprop"]
    assert cls.__module__ == MODULE  # found as a file of the folder, not imported by hand
    cfg = RunConfig.from_flower({"algorithm": "fedavg", "server-opt": "rmsprop", "server-beta2": 0.7})
    assert isinstance(cfg.algorithm.server_opt, cls) and cfg.algorithm.server_opt.server_beta2 == 0.7
    with pytest.raises(ValueError, match=r"invalid server-beta2=1\.5"):  # its declared range
        RunConfig.of(algorithm="fedavg", server_opt="rmsprop", server_beta2=1.5)
    strategy = FedACT(fraction_train=1.0, rho=0.5, tau=0.3, server_opt="rmsprop")
    assert type(strategy.cfg.algorithm.server_opt) is cls
    table = key_table()
    assert "| `server-beta2` | server-opt `rmsprop` | 0.99 | EMA weight β2 of v (torch: alpha) |" in table
    assert "| `eta` | server-opt `rmsprop` | 0.01 | server learning rate η |" in table
    server_opt_row = next(r for r in table.splitlines() if r.startswith("| `server-opt` |"))
    assert "rmsprop" in server_opt_row.split("|")[4]
    assert cfg.algorithm.contract(ModelSpec({"w": ((2,), torch.float32)}, ("w",))).domains[wire.DELTA]["w"] \
        is cls.delta_domain  # its Δ domain is what replies are checked against


def test_its_moments_live_in_the_strategy_state(rmsprop_file: ModuleType) -> None:
    """Two rounds of hand-built replies: the model follows RMSprop on the mean Δ, and v is kept
    in the (checkpointed) server state."""
    x0 = {"w": torch.tensor([1.0, -2.0])}
    strategy = AdaptiveStrategy(RunConfig.of(algorithm="fedavg", server_opt="rmsprop", eta=0.5,
                                             server_beta2=0.5, server_tau=0.25))
    strategy.initialize(dict(x0), ModelSpec({"w": ((2,), torch.float32)}, ("w",)))
    grid = InProcessGrid(2, {})
    x, v = x0["w"].clone(), torch.zeros(2)
    for server_round, deltas in enumerate(([[0.5, 0.0], [0.0, 1.0]], [[-1.0, 0.5], [1.0, 0.5]]), start=1):
        sent = list(strategy.configure_train(server_round, ArrayRecord(strategy.state.model), ConfigRecord(),
                                             grid))
        replies = [Message(content=RecordDict({wire.DELTA: ArrayRecord({"w": torch.tensor(d)}),
                                               wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: 1})}),
                           reply_to=msg) for msg, d in zip(sent, deltas, strict=True)]
        strategy.aggregate_train(server_round, replies)
        mean = torch.tensor(deltas).mean(0)
        v = 0.5 * v + 0.5 * mean**2
        x = x + 0.5 * mean / (v.sqrt() + 0.25)
        torch.testing.assert_close(strategy.state.model["w"], x)
        torch.testing.assert_close(strategy.state.extras["server-opt/v"]["w"], v)


def test_the_test_the_section_shows_passes(rmsprop_file: ModuleType) -> None:
    namespace: dict = {}
    block = readme_block("# tests/server_rules/test_server_opt_rmsprop.py")
    exec(compile(block, "test_server_opt_rmsprop.py", "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        test()


# --- a client term: one file in algorithms/components/, selected by `term=` -------------------
TERM_FILE = '''
"""Pull towards zero: (mu/2)·||w||² added to the local loss (a weight-decay term, as a test)."""

from dataclasses import dataclass

import torch
from adaptfl.core.params import component, param
from adaptfl.core.stage import ClientPart, ClientRound, Stage


@component("term", "anchor")
@dataclass(frozen=True)
class Anchor(Stage):
    anchor_mu: float = param(0.5, "weight of the pull towards zero", within=(0.0, None))

    def start(self, ctx: ClientRound) -> ClientPart:
        return _Anchor(ctx, self.anchor_mu)


class _Anchor(ClientPart):
    def __init__(self, ctx: ClientRound, mu: float) -> None:
        self.mu, self.params = mu, ctx.params

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        return 0.5 * self.mu * torch.stack([p.pow(2).sum() for p in self.params.values()]).sum()
'''


@pytest.fixture
def anchor_file(tmp_path: Path) -> Iterator[None]:
    import adaptfl.algorithms.components as package

    folder = tmp_path / "components"
    folder.mkdir()
    (folder / "anchor.py").write_text(TERM_FILE)
    package.__path__.append(str(folder))
    params._discovered = False
    try:
        params.registry("term")
        yield
    finally:
        package.__path__.remove(str(folder))
        params._REGISTRY["term"].pop("anchor", None)
        sys.modules.pop("adaptfl.algorithms.components.anchor", None)
        params._discovered = True


def _one_round(cfg: RunConfig, tiny_data, tmp_path: Path) -> dict[str, torch.Tensor]:
    from adaptfl.server_app.loop import run_federated
    from tests.support.run_outputs import final_model

    cfg = cfg.replace(num_server_rounds=1, local_steps=3, batch_size=16, model="mlp",
                      data_dir=tiny_data["fashion-mnist"], figures=False, results_dir=str(tmp_path),
                      client_state_dir=str(tmp_path / "state"), accept_small_rounds=True)
    return final_model(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))


@pytest.mark.slow
def test_a_new_client_term_is_one_file_selected_by_term(anchor_file, tiny_data, tmp_path) -> None:
    cfg = RunConfig.of(algorithm="fedavg", term="anchor", anchor_mu=2.0)
    assert [t.name for t in cfg.algorithm.terms] == ["anchor"] and cfg.algorithm.terms[0].anchor_mu == 2.0
    assert "| `anchor-mu` | term `anchor` | 0.5 | weight of the pull towards zero |" in key_table()
    assert "anchor" in next(r for r in key_table().splitlines() if r.startswith("| `term` |"))
    plain = _one_round(RunConfig.of(algorithm="fedavg", run_name="plain"), tiny_data, tmp_path)
    pulled = _one_round(cfg.replace(run_name="anchored"), tiny_data, tmp_path)
    norm = lambda m: sum(float(t.pow(2).sum()) for t in m.values())  # noqa: E731
    assert norm(pulled) < norm(plain)  # the term's gradient ran on the clients


@pytest.mark.slow
def test_term_switches_an_algorithms_term_and_composes(tiny_data, tmp_path) -> None:
    """fedavg + term='prox' is FedProx, bit for bit; term='none' removes an algorithm's term."""
    fedprox = _one_round(RunConfig.of(algorithm="fedprox", mu=0.5, run_name="a"), tiny_data, tmp_path)
    composed = _one_round(RunConfig.of(algorithm="fedavg", term="prox", mu=0.5, run_name="b"), tiny_data,
                          tmp_path)
    for name in fedprox:
        assert torch.equal(fedprox[name], composed[name]), name
    assert RunConfig.of(algorithm="scaffold", term="none").algorithm.terms == ()
    with pytest.raises(ValueError, match=r"invalid term='anchor': choose one of \['none', 'feddyn'"):
        RunConfig.of(algorithm="fedavg", term="anchor")
