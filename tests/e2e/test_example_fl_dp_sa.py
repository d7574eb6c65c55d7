"""examples/fl-dp-sa: Flower's fl-dp-sa example on adaptfl, run as its README says.

Flower's five keys say the same run in adaptfl's terms (dp='client' at z = 0.2, C = 10, every
round's 20 noise shares, SecAgg+ with 7 shares and a threshold of 4); the nodes' floor from the
README's $ADAPTFL_NODE_CONFIG accepts it where the defaults refuse; and under `flwr run` the app
as shipped (100 SuperNodes, 20 a round, 3 rounds: nothing shrunk; 94 s on the 2-core VM at load
~8) completes, every round inside SecAgg+, the planned ε spent and every answering node's reply
in its own ledger.
"""

from __future__ import annotations

import importlib
import math
import re
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.privacy import node_ledger
from adaptfl.privacy.accountant import planned_epsilon
from adaptfl.privacy.client import NODE_CONFIG_ENV, check_floor, node_budget, node_settings
from adaptfl.privacy.ledger import ledger_dir
from tests.conftest import needs_fashion_mnist
from tests.e2e.test_examples import EXAMPLES, app_config, flwr_run_app, tail
from tests.support.run_outputs import confidential_rows, metric_rows

APP = EXAMPLES / "fl-dp-sa"
FLOWER = {"noise-multiplier": 0.2, "clipping-norm": 10, "num-sampled-clients": 20, "num-shares": 7,
          "reconstruction-threshold": 4}  # Flower's pyproject.toml, fl-dp-sa at fdef7af
SUPERNODES, SAMPLED, ROUNDS = 100, 20, 3


def readme_node_config() -> str:
    """The nodes' keys the README's command sets."""
    found = re.search(rf'export {NODE_CONFIG_ENV}="([^"]+)"', (APP / "README.md").read_text())
    assert found, f"examples/fl-dp-sa/README.md sets no {NODE_CONFIG_ENV}"
    return found.group(1)


def adaptfl_config(monkeypatch: pytest.MonkeyPatch) -> RunConfig:
    monkeypatch.syspath_prepend(str(APP))
    server_app = importlib.import_module("fl_dp_sa.server_app")
    return RunConfig.from_flower(server_app.adaptfl_keys(app_config(APP)))


def test_the_app_keeps_flowers_keys_and_values() -> None:
    with open(APP / "pyproject.toml", "rb") as fh:
        assert tomllib.load(fh)["project"]["dependencies"][0].startswith("adaptfl>=")  # not a path
    config = app_config(APP)
    assert {k: config[k] for k in FLOWER} == FLOWER
    assert config["num-server-rounds"] == ROUNDS and config["fraction-train"] * SUPERNODES == SAMPLED


def test_flowers_keys_say_the_same_run_in_adaptfls_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = adaptfl_config(monkeypatch)
    privacy, secagg = cfg.privacy, cfg.secagg
    assert (privacy.dp, privacy.dp_noise_multiplier, privacy.dp_clip_norm) == ("client", 0.2, 10.0)
    assert cfg.federation.min_replies == SAMPLED  # booked at, and released with, all 20 shares
    assert secagg.on and secagg.round_shares(SAMPLED) == (7, 4)  # SecAggPlusWorkflow(7, 4)
    assert cfg.algorithm.name == "localadam" and cfg.algorithm.reply_record_count() == 1
    # the plan the README shows, within what the app accepts
    planned = planned_epsilon(0.2, SAMPLED, SUPERNODES, ROUNDS, privacy.dp_delta, privacy.dp_accounting)
    assert round(planned) == 303 and planned < privacy.dp_accept_epsilon
    # Flower's README's override: refused by the plan, naming what it spends (the README says so)
    monkeypatch.syspath_prepend(str(APP))
    keys = importlib.import_module("fl_dp_sa.server_app").adaptfl_keys(
        {**app_config(APP), "noise-multiplier": 0.1, "clipping-norm": 5, "dp-num-clients": SUPERNODES})
    with pytest.raises(ValueError, match=r"plans ε=1.2e\+03 .* above dp-accept-epsilon=310"):
        RunConfig.from_flower(keys)


def test_the_readmes_node_config_accepts_the_run_the_defaults_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reply's noise z/√20 passes the README's floor, and the most one node gives in 3
    rounds fits its budget; the defaults refuse the same recipe."""
    privacy = adaptfl_config(monkeypatch).privacy
    with pytest.raises(ValueError, match="dp-noise-multiplier=0.2 is below its dp-min-noise-multiplier=1"):
        check_floor(privacy, SAMPLED, node_settings({}))
    monkeypatch.setenv(NODE_CONFIG_ENV, readme_node_config())
    node = node_settings({"partition-id": 0, "num-partitions": SUPERNODES})
    reply_z = check_floor(privacy, SAMPLED, node)
    assert reply_z == pytest.approx(0.2 / math.sqrt(SAMPLED))
    budget = node_budget(node)
    one = node_ledger.spent([node_ledger.Release("r", 1, "train", reply_z)], budget.delta)
    assert one > 1000.0  # past the default budget: one reply alone
    every = [node_ledger.Release("r", r, "train", reply_z) for r in range(1, ROUNDS + 1)]
    assert node_ledger.spent(every, budget.delta) < budget.max_epsilon
    with pytest.raises(ValueError, match="dp-noise-multiplier=0.1 is below its dp-min-noise-multiplier=0.2"):
        check_floor(replace(privacy, dp_noise_multiplier=0.1), SAMPLED, node)  # less noise: refused


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed")
@needs_fashion_mnist
def test_fl_dp_sa_runs_as_written_under_flwr_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_CONFIG_ENV, readme_node_config())
    results = tmp_path / "results"
    done = flwr_run_app(APP, tmp_path / "flwr-home", SUPERNODES,
                        f"results-dir='{results}' run-name='dpsa'", honest=True)
    assert done.returncode == 0, tail(done)
    said = done.stdout + done.stderr
    assert "each round booked as if only 20 of the 20 replies arrive (min-replies=20" in said, tail(done)
    released = metric_rows(results / "dpsa")
    assert [r["replies-sampled"] for r in released] == [SAMPLED] * ROUNDS, released
    assert released[-1]["dp-epsilon"] == pytest.approx(planned_epsilon(0.2, SAMPLED, SUPERNODES, ROUNDS,
                                                                       1e-5, "without-replacement"))
    rows = confidential_rows(results / "dpsa")
    assert [r["replies-accepted"] for r in rows] == [SAMPLED] * ROUNDS, rows
    assert all(set(r["bytes"]["up"]) == {"secagg+"} for r in rows), rows  # every reply masked
    # every answering node booked its one reply of each round it was in, at its own z/√20
    books = list(ledger_dir().glob("node-*.jsonl"))
    releases = [r for book in books for r in node_ledger.read(book)]
    assert len(releases) == SAMPLED * ROUNDS and len(books) <= SAMPLED * ROUNDS, books
    assert {(r.round, r.stage) for r in releases} == {(n, "train") for n in range(1, ROUNDS + 1)}
    assert all(r.z == pytest.approx(0.2 / math.sqrt(SAMPLED)) for r in releases)
