"""The run config is checked at the edge: bad input stops the run before round 1, in one line;
the keys, pyproject.toml and the key table of docs/algorithms.md all come from the declarations."""

from __future__ import annotations

import re
import tomllib

import pytest

from adaptfl.algorithms.config import (
    ALGORITHMS_PAGE,
    RunConfig,
    algorithm_table,
    declared_keys,
    key_table,
    pyproject_block,
)
from adaptfl.core.params import PRESET
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.local_update.modulation import ACT, Cautious
from adaptfl.local_update.rules.sgd import SGD
from adaptfl.server_app.loop import run_federated
from tests.conftest import FASHION_MNIST_DIR
from tests.support.flower_processes import PROJECT


def _pyproject_config() -> dict:
    with open(PROJECT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


def test_pyproject_and_docs_are_generated_from_the_declarations() -> None:
    text = (PROJECT / "pyproject.toml").read_text()
    assert pyproject_block() in text, "pyproject.toml is stale: python scripts/regenerate_docs.py"
    page = (PROJECT / ALGORITHMS_PAGE).read_text()
    assert key_table() in page and algorithm_table() in page, \
        f"{ALGORITHMS_PAGE}'s tables are stale: python scripts/regenerate_docs.py"
    assert RunConfig.from_flower(_pyproject_config()).to_flower() == RunConfig.of().to_flower()


def test_a_key_declared_twice_has_one_type() -> None:
    for key, decls in declared_keys().items():
        assert len({(info.type, info.optional) for _, info in decls}) == 1, key


@pytest.mark.parametrize("key,value", [
    ("tau", 0.0), ("tau", 1.5), ("rho", 1.2), ("rho", -0.5), ("local-steps", 0),
    ("fraction-train", 0.0), ("v-sync", "sometimes"), ("beta2", 1.0), ("lr", -1.0),
    ("trust", "maybe"), ("eps", float("nan")), ("device", "tpu"), ("lr", "fast"), ("seed", -1),
    ("lr", 1e10), ("weight-decay", 1e6), ("mu", 1e12), ("eta", 1e6), ("resume", 1),
])
def test_invalid_value_is_named_in_one_line(key: str, value: object) -> None:
    algorithm = {"mu": "fedprox", "eta": "fedadam"}.get(key, "fedact")
    with pytest.raises(ValueError, match=re.escape(key)) as err:
        RunConfig.from_flower({"algorithm": algorithm, key: value})
    assert "\n" not in str(err.value)


def test_gamma_above_alpha_is_refused() -> None:
    with pytest.raises(ValueError, match="gamma"):
        RunConfig.of(algorithm="fedact", alpha=1.0, gamma=2.0)


def test_unknown_keys_are_named_with_the_closest_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'tua' \(did you mean 'tau'"):
        RunConfig.from_flower({"tua": 0.3})
    with pytest.raises(ValueError, match="learning-rate"):
        RunConfig.from_flower({"learning-rate": 0.1})


def test_missing_keys_take_the_declared_defaults() -> None:
    cfg = RunConfig.from_flower({"algorithm": "fedact", "tau": 0.3})
    assert cfg.algorithm.trust == ACT(tau=0.3) and cfg.federation.num_server_rounds == 20


def test_a_key_the_algorithm_does_not_read_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['tau'\] not used by algorithm 'fedavg'"):
        RunConfig.of(algorithm="fedavg", tau=0.3)
    with pytest.raises(ValueError, match="light"):  # local-soap shares no Θ to compress
        RunConfig.of(algorithm="local-soap", light=True)
    assert RunConfig.from_flower({"algorithm": "fedavg", "tau": 0.3}, drop_unused=True)


def test_preset_is_the_components_default_and_steals_no_number() -> None:
    cfg = RunConfig.from_flower({**_pyproject_config(), "algorithm": "fedact"})
    trust = cfg.algorithm.trust
    assert (trust.alpha, trust.gamma) == (None, None)
    assert (trust.trust_alpha, trust.trust_gamma) == (2.0, 0.5)  # α = 1/τ, γ = τ
    # every value the paper's tables use is runnable, γ = 0 (hard masking) included
    hard = RunConfig.of(algorithm="fedact", gamma=0.0).algorithm.trust
    assert hard.trust_gamma == 0.0
    assert RunConfig.of(algorithm="fedavg", lr=PRESET).lr == SGD.default_lr
    assert RunConfig.of(algorithm="fedact", weight_decay=0.0).weight_decay == 0.0


def test_unknown_algorithm_stops_the_run_before_round_1(tmp_path) -> None:
    with pytest.raises(ValueError, match="fedmagic"):
        RunConfig.of(algorithm="fedmagic", figures=False, results_dir=str(tmp_path))
    calls = []

    def handler(msg, context):  # pragma: no cover - must never run
        calls.append(msg)
        raise AssertionError("a client was contacted")

    cfg = RunConfig.of(algorithm="fedact",
                       figures=False, results_dir=str(tmp_path), data_dir=FASHION_MNIST_DIR,
                       model="llama-tiny")  # a language model on images
    with pytest.raises(ValueError, match="language model"):
        run_federated(InProcessGrid(2, cfg.to_flower(), handler=handler), cfg)
    assert calls == [] and not any(tmp_path.iterdir())


@pytest.mark.parametrize("kw,match", [
    (dict(algorithm="fedact", preconditioner="sgd"), "sgd"),
    (dict(algorithm="fedact", preconditioner="soap"), "v-sync"),
    (dict(algorithm="fedpac-soap", preconditioner="adamw"), "shares preconditioner state"),
    (dict(algorithm="fedpac-muon", trust="act"), "trust-on-muon"),
    (dict(algorithm="localadamw", v_sync="full"), "bias-correction='local'"),
])
def test_nonsense_combinations_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RunConfig.of(**kw)


def test_components_come_from_the_preset_and_switch_by_key() -> None:
    assert RunConfig.of(algorithm="localadamw").algorithm.correction.weight == 0.0
    assert not RunConfig.of(algorithm="localadamw").algorithm.moments.synced
    assert not RunConfig.of(algorithm="fedadamw").algorithm.trust.active
    fal = RunConfig.of(algorithm="fedact-local").algorithm
    assert fal.correction.weight == 0.0 and fal.moments.synced
    assert isinstance(RunConfig.of(algorithm="fedact", trust="cautious").algorithm.trust, Cautious)
    assert RunConfig.of(algorithm="fedavg").lr == 0.1 and RunConfig.of(algorithm="fedavg", lr=0.3).lr == 0.3
    # a switched component keeps the preset's values it also has (bias correction: paper)
    assert RunConfig.of(algorithm="fedact", preconditioner="adam").algorithm.preconditioner.bias_correction \
        == "paper"


def test_cosine_lr_and_step_offset() -> None:
    cfg = RunConfig.of(algorithm="fedact", local_steps=7, num_server_rounds=4, lr=1.0)
    assert cfg.round_info(1).lr == 1.0
    assert cfg.round_info(3).lr == pytest.approx(0.5) and cfg.round_info(3).step_offset == 14
    assert cfg.replace(lr_schedule="constant").round_info(3).lr == 1.0


@pytest.mark.parametrize("keys, lrs", [
    # torch's StepLR(step_size=2, gamma=0.5) stepped once a round
    (dict(lr_schedule="step", lr_step_every=2, lr_gamma=0.5), [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]),
    # MultiStepLR: Flower's advanced-pytorch halves at round 5 and keeps it
    (dict(lr_schedule="multistep", lr_milestones="5", lr_gamma=0.5), [1.0] * 4 + [0.5] * 2),
    (dict(lr_schedule="multistep", lr_milestones="3,5"), [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]),
    (dict(lr_schedule="exponential", lr_gamma=0.5), [1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125]),
])
def test_torch_style_lr_schedules_by_round(keys: dict, lrs: list[float]) -> None:
    cfg = RunConfig.of(lr=1.0, num_server_rounds=6, **keys)
    assert [cfg.round_info(r).lr for r in range(1, 7)] == pytest.approx(lrs, rel=1e-12)


@pytest.mark.parametrize("keys, said", [
    (dict(lr_gamma=0.5), "lr-gamma=0.5 is read only by lr-schedule 'step' or 'multistep' or "
                         "'exponential' (lr-schedule='cosine'); remove it or choose that schedule"),
    (dict(lr_schedule="exponential", lr_milestones="5"), "lr-milestones='5' is read only by lr-schedule "
                                                         "'multistep' (lr-schedule='exponential')"),
    (dict(lr_schedule="step"), "lr-schedule='step' needs lr-step-every (e.g. lr-step-every=5)"),
    (dict(lr_schedule="multistep"), "lr-schedule='multistep' needs lr-milestones (e.g. lr-milestones='5')"),
    (dict(lr_schedule="multistep", lr_milestones="5,3"), "invalid lr-milestones='5,3': rounds >= 2"),
    (dict(lr_schedule="multistep", lr_milestones="five"), "invalid lr-milestones='five': comma-separated"),
    (dict(lr_schedule="step", lr_step_every=2, lr_gamma=1.5), "invalid lr-gamma=1.5: must be <= 1.0"),
    (dict(lr_schedule="linear"), "invalid lr-schedule='linear': choose one of ['cosine', 'constant', "
                                 "'step', 'multistep', 'exponential']"),
])
def test_a_schedule_key_without_its_schedule_is_refused(keys: dict, said: str) -> None:
    with pytest.raises(ValueError) as refused:
        RunConfig.of(**keys)
    assert str(refused.value).startswith(said), str(refused.value)


def test_to_flower_round_trips_for_every_algorithm() -> None:
    from adaptfl.algorithms.catalog import catalog

    for name in catalog():
        values = RunConfig.of(algorithm=name).to_flower()
        assert RunConfig.from_flower(values).to_flower() == values, name
