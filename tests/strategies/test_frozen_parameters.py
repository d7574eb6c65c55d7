"""Frozen parameters (`requires_grad=False`) take no part in the federation, for every algorithm.

A user's own model whose first layer is frozen (one module object shared by every model the
user's `build` returns, as a pretrained base is shared by a process): two rounds of every
algorithm on two clients leave it bit-identical; every array that crosses the wire, down and up,
is named after a trainable entry only (the model record and Δ hold exactly those, and no
per-parameter record — Δ_G, v̄, Θ, c, m, g, … — names a frozen one); the bytes per round are
those of the trainable part; a client whose frozen part differs from the server's is refused in
one line; MOON (two model copies per client) is refused before round 1.
"""

from __future__ import annotations

import hashlib
from collections import deque
from types import SimpleNamespace

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.codec.codec import spec_bytes
from adaptfl.core import contract, wire
from adaptfl.core.contract import ModelSpec, federated_state, frozen_digest, frozen_parameters
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run, run_federated
from tests.support.run_outputs import metric_rows
from tests.support.user_package import write_user_package

MODULE = '''
def load(data_dir):
    return quadrants(240, 200)

torch.manual_seed(7)
BASE = torch.nn.Linear(6, 16)  # the "pretrained" part, one object per process
BASE.requires_grad_(False)

def build(task):
    return torch.nn.Sequential(BASE, torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, task.num_outputs))

def build_other_base(task):
    model = build(task)
    other = torch.nn.Linear(6, 16)
    other.requires_grad_(False)
    model[0] = other
    return model
'''
TRAINABLE = {"2.weight", "2.bias", "4.weight", "4.bias"}
FROZEN = {"0.weight", "0.bias"}
# every algorithm but MOON, which is refused (test below); one per family in the fast subset
FAST = {"fedavg", "fedact", "fedadamw", "fedpac-muon", "fedmixp-soap", "local-sophia", "scaffold",
        "fedyogi", "hafedho", "mimelite", "feddyn", "fedprox"}
ALGORITHMS = [a if a in FAST else pytest.param(a, marks=pytest.mark.slow)
              for a in sorted(set(catalog()) - {"moon"})]


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    import importlib

    return importlib.import_module(write_user_package(tmp_path, monkeypatch, "frozen_pkg", MODULE))


def _cfg(tmp_path, algorithm: str, **kw) -> RunConfig:
    extra = {"muon_routing": "all-2d"} if algorithm.endswith("muon") else \
        {"max_precond_dim": 100} if algorithm.endswith("soap") else {}
    return RunConfig.of(algorithm=algorithm, num_server_rounds=2, local_steps=3, batch_size=16,
                        partitioning="iid", task="frozen_pkg.mod:load", model="frozen_pkg.mod:build",
                        figures=False, results_dir=str(tmp_path / "out"), run_name="frozen",
                        client_state_dir=str(tmp_path / "state"), accept_small_rounds=True,
                        **{**extra, **kw})


class Recording:
    """The engine's client handler, recording every array name that crosses the wire."""

    def __init__(self) -> None:
        self.names: dict[str, set[str]] = {}

    def __call__(self, msg, context):
        reply = train_or_refuse(msg, context)
        for content in (msg.content, reply.content if not reply.has_error() else None):
            for record, arrays in (content.array_records.items() if content else ()):
                self.names.setdefault(record, set()).update(arrays)
        return reply


def test_the_spec_leaves_the_frozen_part_out(user_package) -> None:
    model = user_package.build(user_package.load(""))
    spec = ModelSpec.of(model)
    assert set(spec.entries) == set(spec.parameters) == TRAINABLE == set(federated_state(model))
    assert set(frozen_parameters(model)) == FROZEN and spec.frozen_count == 6 * 16 + 16
    assert len(spec.frozen_digest) == 64


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.slow
def test_every_algorithm_trains_the_trainable_part_only(algorithm, user_package, tmp_path) -> None:
    base = {n: t.clone() for n, t in user_package.BASE.state_dict().items()}
    cfg = _cfg(tmp_path, algorithm)
    recording = Recording()
    rows = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower(), handler=recording), cfg))
    assert [r["replies-accepted"] for r in rows] == [2, 2], rows[-1]["rejected"]
    for name, tensor in user_package.BASE.state_dict().items():  # bit for bit
        assert torch.equal(tensor, base[name]), f"{algorithm} changed the frozen {name}"
    assert recording.names[wire.ARRAYS] == recording.names[wire.DELTA] == TRAINABLE
    for record, names in recording.names.items():  # Δ_G, v̄, Θ ("<param>/<slot>"), c, …
        touched = {n.split("/")[0] for n in names} & FROZEN
        assert not touched, f"{algorithm}: record {record!r} carries frozen {sorted(touched)}"
    model_bytes = sum(t.numel() * t.element_size() for n, t in
                      user_package.build(user_package.load("")).state_dict().items() if n in TRAINABLE)
    assert rows[0]["bytes-up"] >= 2 * model_bytes  # Δ of the trainable part, from each client
    if algorithm == "fedavg":  # the model down and Δ up (+ one .npy header per array), nothing else
        trainable = user_package.build(user_package.load("")).state_dict()
        assert rows[0]["bytes-down"] == 2 * spec_bytes({n: (tuple(t.shape), t.dtype)
                                                        for n, t in trainable.items() if n in TRAINABLE})
        assert 2 * model_bytes < rows[0]["bytes-up"] < 2 * model_bytes + 2 * 256 * len(TRAINABLE)


def test_a_client_with_another_frozen_part_is_refused(user_package, tmp_path) -> None:
    cfg = _cfg(tmp_path, "fedact")
    strategy, _, _ = build_run(cfg)
    grid = InProcessGrid(1, cfg.to_flower())
    (msg,) = strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    other = RunConfig.of(**{**{k.replace("-", "_"): v for k, v in cfg.to_flower().items()
                               if v != "preset"}, "model": "frozen_pkg.mod:build_other_base"})
    context = grid.contexts[1]
    msg.content.config_records[wire.RECIPE]["data.model"] = other.data.model
    reply = train_or_refuse(msg, context)
    assert reply.has_error() and "frozen parameters differ from the server's" in reply.error.reason
    assert "\n" not in reply.error.reason


def test_the_frozen_digest_is_hashed_again_only_when_the_base_changes(user_package, monkeypatch) -> None:
    """Clients check the digest every round: it is kept per base (SmolLM2-135M takes ~1.5 s to
    hash), and must still follow every write to it, and never hold for another base."""
    hashed = []

    def sha256():  # noqa: ANN202 - counts the full hashes
        hashed.append(1)
        return hashlib.sha256()

    monkeypatch.setattr(contract, "hashlib", SimpleNamespace(sha256=sha256))
    monkeypatch.setattr(contract, "_DIGESTS", deque(maxlen=4))  # nothing kept by other tests
    task, weight = user_package.load(""), user_package.BASE.weight
    saved = weight.detach().clone()
    first = frozen_digest(user_package.build(task))
    assert len(hashed) == 1 and frozen_digest(user_package.build(task)) == first  # same base
    assert len(hashed) == 1
    try:
        with torch.no_grad():  # a write autograd counts (load_state_dict, an optimizer)
            weight[0, 0] += 1.0
        assert frozen_digest(user_package.build(task)) != first and len(hashed) == 2
        with torch.no_grad():
            weight.copy_(saved)
        assert frozen_digest(user_package.build(task)) == first and len(hashed) == 3
        weight.data.mul_(2.0)  # through .data: not counted by the version, seen by the sample
        assert frozen_digest(user_package.build(task)) != first and len(hashed) == 4
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert frozen_digest(user_package.build_other_base(task)) != first and len(hashed) == 5
    assert frozen_digest(user_package.build(task)) == first and len(hashed) == 6  # restored: moved


def test_moon_is_refused_for_a_frozen_base_before_round_1(user_package, tmp_path) -> None:
    with pytest.raises(ValueError, match="term 'moon' keeps two whole copies") as err:
        build_run(_cfg(tmp_path, "moon"))
    assert "\n" not in str(err.value)
