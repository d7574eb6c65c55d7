"""The run config is checked at the edge: bad input stops the run before round 1."""

from __future__ import annotations

import tomllib

import pytest
from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.presets import PRESETS, resolve
from adaptfl.algorithms.recipe import recipe_for_round, round_lr
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated

from tests.conftest import FASHION_MNIST_DIR
from tests.flower_processes import PROJECT


def _pyproject_config() -> dict:
    with open(PROJECT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


def test_pyproject_defaults_are_the_typed_defaults() -> None:
    assert RunConfig.from_flower(_pyproject_config()) == RunConfig()


@pytest.mark.parametrize("key,value,named", [
    ("tau", 0.0, "tau"), ("tau", 1.5, "tau"), ("rho", 1.2, "rho"), ("rho", -0.5, "rho"),
    ("alpha", 1.0, "gamma"),  # τ=0.5 -> γ=0.5 default; α=1 > γ is fine, so set γ above α:
    ("local-steps", 0, "local-steps"), ("fraction-train", 0.0, "fraction-train"),
    ("v-sync", "sometimes", "v-sync"), ("beta2", 1.0, "beta2"), ("lr", -1.0, "lr"),
    ("trust", "maybe", "trust"), ("eps", float("nan"), "eps"), ("device", "tpu", "device"),
])
def test_invalid_hyperparameter_is_named(key: str, value: object, named: str) -> None:
    raw = {**_pyproject_config(), key: value}
    if key == "alpha":
        raw["gamma"] = 2.0  # γ > α
    with pytest.raises(ValueError, match=named):
        RunConfig.from_flower(raw)


def test_unknown_and_missing_keys_are_named() -> None:
    with pytest.raises(ValueError, match="learning-rate"):
        RunConfig.from_flower({**_pyproject_config(), "learning-rate": 0.1})
    raw = _pyproject_config()
    del raw["rho"]
    with pytest.raises(ValueError, match="rho"):
        RunConfig.from_flower(raw)
    with pytest.raises(ValueError, match="lr"):
        RunConfig.from_flower({**_pyproject_config(), "lr": "fast"})


def test_unknown_algorithm_stops_the_run_before_round_1(tmp_path) -> None:
    calls = []

    def handler(msg, context):  # pragma: no cover - must never run
        calls.append(msg)
        raise AssertionError("a client was contacted")

    cfg = RunConfig(algorithm="fedmagic", results_dir=str(tmp_path), data_dir=FASHION_MNIST_DIR)
    with pytest.raises(ValueError, match="fedmagic"):
        run_federated(InProcessGrid(2, cfg.to_flower(), handler=handler), cfg)
    assert calls == [] and not any(tmp_path.iterdir())


def test_nonsense_combination_is_rejected() -> None:
    with pytest.raises(ValueError, match="sgd"):
        resolve(RunConfig(algorithm="fedact", preconditioner="sgd"))


def test_presets_decide_structure() -> None:
    assert resolve(RunConfig(algorithm="localadamw")).rho == 0.0
    assert resolve(RunConfig(algorithm="localadamw")).v_sync == "none"
    assert resolve(RunConfig(algorithm="fedadamw")).trust == "none"
    assert resolve(RunConfig(algorithm="fedact-local")).rho == 0.0
    assert resolve(RunConfig(algorithm="fedact-local")).v_sync == "full"
    assert resolve(RunConfig(algorithm="fedact", trust="cautious")).trust == "cautious"
    assert resolve(RunConfig(algorithm="fedavg")).lr == PRESETS["fedavg"].lr
    assert resolve(RunConfig(algorithm="fedavg", lr=0.3)).lr == 0.3


def test_cosine_lr_and_step_offset() -> None:
    assert round_lr(1.0, "cosine", 1, 4) == 1.0
    assert round_lr(1.0, "cosine", 3, 4) == pytest.approx(0.5)
    assert round_lr(1.0, "constant", 3, 4) == 1.0
    recipe = recipe_for_round(RunConfig(local_steps=7, num_server_rounds=4), 3)
    assert recipe.step_offset == 14
    assert recipe.alpha == 2.0 and recipe.gamma == 0.5  # α = 1/τ, γ = τ
