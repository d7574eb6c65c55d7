"""The one-run audit (harness/privacy_audit.py, issue 31 §9): the main theorem's bound against hand-computed
values, and on a tiny run the empirical ε stays below the accountant's with the noise on, while
with (almost) no noise it is far above it: the audit can fail."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.harness.privacy_audit import Canaries, canary_epsilon, main, run_audit
from adaptfl.privacy import client, mechanism, server
from adaptfl.privacy.accountant import epsilon
from adaptfl.privacy.audit_bound import binomial_tail, epsilon_lower_bound, p_value
from adaptfl.privacy.ledger import ledger_dir
from adaptfl.secagg import noise
from adaptfl.server_app.loop import run_federated
from adaptfl.strategies.base import AdaptiveStrategy
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import confidential_rows, metric_rows


def _all_right(r: int) -> float:
    """δ = 0, r of r right: q^r = 0.05, so ε = log(q/(1-q)) with q = 0.05^(1/r)."""
    q = 0.05 ** (1 / r)
    return math.log(q / (1 - q))


@pytest.mark.parametrize("r,expected", [(10, 1.0518732), (100, 3.4929654), (200, 4.1936300)])
def test_all_guesses_right_gives_the_closed_form_bound(r: int, expected: float) -> None:
    assert _all_right(r) == pytest.approx(expected, abs=1e-6)
    assert epsilon_lower_bound(1000, r, r, 0.0) == pytest.approx(expected, abs=1e-5)


def test_half_right_or_worse_bounds_nothing() -> None:
    assert epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 200, 40, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 0, 0, 1e-5) == 0.0
    # at ε = 0 the guesses are fair coins: P[Bin(200, ½) ≥ 100] > ½
    assert p_value(1000, 200, 100, 0.0, 0.0) == pytest.approx(binomial_tail(100, 200, 0.5))
    assert p_value(1000, 200, 100, 0.0, 0.0) > 0.5


def test_the_delta_term_is_theorem_3s_by_hand() -> None:
    """m = 4, r = 2, v = 2 at ε = log 3 (q = ¾): f(2) = 9/16; i = 1: P[Bin = 1] / 1 = 6/16,
    i = 2: (P[Bin = 0] + P[Bin = 1]) / 2 = 7/32; max 6/16; p = 9/16 + 2·4·δ·6/16."""
    delta = 0.01
    assert p_value(4, 2, 2, math.log(3), delta) == pytest.approx(9 / 16 + 8 * delta * 6 / 16)
    assert p_value(4, 2, 2, math.log(3), 0.0) == pytest.approx(9 / 16)
    # δ only weakens what the guesses can reject
    assert epsilon_lower_bound(1000, 200, 200, 1e-3) < epsilon_lower_bound(1000, 200, 200, 0.0)


def test_canary_guesses_count_the_top_as_in_and_the_bottom_as_out() -> None:
    canaries = Canaries(6, seed=0)
    canaries.included[:] = [True, True, False, False, True, False]
    canaries.scores[:] = [5.0, 4.0, 3.0, -1.0, -2.0, 0.0]  # in: 0, 1; out: 4 (wrong), 3
    assert canaries.correct(2, 2) == 3
    with pytest.raises(ValueError, match="at most the 6 canaries"):
        canaries.correct(4, 3)


TINY = dict(algorithm="fedavg", num_server_rounds=3, local_steps=1, batch_size=16, model="mlp",
            weighting="uniform", dp="central", dp_seed=3, dp_testing_reproducible_noise=True,
            fraction_train=0.5, dp_accounting="no-amplification", dp_clip_norm=0.5,
            dp_accept_epsilon=1e12,  # as the CLI's DEFAULTS: an audit measures ε, refuses no plan
            accept_small_rounds=True)
CANARIES, GUESSES = 500, 50  # r = 100: at most ε ≈ 3.49 from all right


def _audit(tmp_path, tiny_data, name: str, z: float, **extra):  # noqa: ANN001, ANN202
    cfg = RunConfig.of(figures=False,
                       results_dir=str(tmp_path), data_dir=tiny_data["fashion-mnist"], run_name=name,
                       dp_noise_multiplier=z, **{**TINY, **extra})
    return run_audit(cfg, 4, canaries=CANARIES, guesses=GUESSES, seed=1)


@needs_fashion_mnist
@pytest.mark.slow
def test_with_noise_the_audit_stays_below_the_accountant_and_without_it_exceeds_2(
        tmp_path, tiny_data) -> None:
    noised = _audit(tmp_path, tiny_data, "noised", z=2.0)
    assert noised.rounds == 3 and noised.epsilon_run == noised.epsilon_no_amplification
    assert noised.epsilon_audit <= noised.epsilon_run and not noised.failed, noised
    # each canary slot counts in the noise: std z·C/(n + m) on Δ's mean (k = 1), n = 2 sampled
    rows = confidential_rows(noised.results)  # the noise's std tells m: not released
    assert rows[0]["dp-noise-std"] == pytest.approx(2.0 * 0.5 / (2 + CANARIES))
    assert server.round_combine.__module__ == "adaptfl.privacy.server"  # restored after the run

    bare = _audit(tmp_path, tiny_data, "bare", z=0.01)  # ε in the thousands, signal ≫ noise
    assert bare.correct == 2 * GUESSES, bare
    assert bare.epsilon_audit > 3.0, bare  # all 100 right: ≈ 3.49 at δ = 1e-5
    assert bare.epsilon_audit > noised.epsilon_audit + 2.0


@needs_fashion_mnist
@pytest.mark.slow
def test_a_mechanism_that_adds_less_noise_than_it_accounts_for_fails_the_audit(
        tmp_path, tiny_data, monkeypatch) -> None:
    """The bug the audit is for: z = 10 accounted (ε ≈ 1.45 over 3 rounds), 1/1000 of its noise
    drawn. fedact: the canaries' zero v items keep v's mean at n + m items too."""
    honest = _audit(tmp_path, tiny_data, "honest", z=10.0, algorithm="fedact")
    assert not honest.failed and honest.epsilon_run < 2.0, honest
    original = mechanism.add_noise
    monkeypatch.setattr(mechanism, "add_noise",
                        lambda tensors, std, rng: original(tensors, std / 1000, rng))
    broken = _audit(tmp_path, tiny_data, "broken", z=10.0, algorithm="fedact")
    assert broken.epsilon_run == honest.epsilon_run  # the accountant cannot see the bug
    assert broken.failed and broken.epsilon_audit > broken.epsilon_run + 1.0, broken
    assert any("audit FAILED" in line for line in broken.lines())


def test_the_cli_refuses_what_it_cannot_audit_in_one_line_exit_2(capsys) -> None:
    for override, named in (("dp=none", "dp='none'"), ("secagg=secagg+", "secagg='secagg+'"),
                            ("weighting=examples", "weighting='examples'"),
                            ("resume=true", "resume")):
        with pytest.raises(SystemExit) as exited:
            main([override, "model=mlp"])
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("config error:") and named in err and "\n" not in err, err


@needs_fashion_mnist
def test_the_cli_prints_the_bound_beside_the_accountants_epsilon(tmp_path, tiny_data, capsys) -> None:
    main(["--num-nodes", "4", "--canaries", "200", "algorithm=fedavg", "model=mlp",
          "num-server-rounds=2", "local-steps=1", "batch-size=16", "fraction-train=0.5",
          "dp-noise-multiplier=2", f"data-dir={tiny_data['fashion-mnist']}", f"results-dir={tmp_path}"])
    out = capsys.readouterr().out
    assert "audit: 200 canaries, 20+20 guesses" in out and "2 rounds scored" in out, out
    assert "empirical ε ≥" in out and "at 95% confidence (δ=1e-05)" in out, out
    assert "accountant's ε = " in out and "dp-accounting=without-replacement" in out, out
    assert "accountant's ε without amplification = " in out and "FAILED" not in out, out
    assert f"booked in {ledger_dir() / 'audits'}/fashion-mnist-" in out, out  # the audit's own


def _scored(sigma: float, rounds: int = 1, count: int = 20_000, seed: int = 3):  # noqa: ANN202
    """The canary mechanism's scores in units of C_Δ·b, as `Canaries.score` sums them: each round
    an included canary adds 1, the noise N(0, σ²) (σ = z√k; 0: no noise)."""
    canaries = Canaries(count, seed)
    noise = np.random.default_rng(seed + 1)
    for _ in range(rounds):
        canaries.scores += canaries.included + (noise.normal(0.0, sigma, count) if sigma else 0.0)
    return canaries


def test_the_audit_fails_a_noiseless_and_a_half_noise_mechanism_and_passes_an_honest_one() -> None:
    """z = 2 (k = 1), one round, 20,000 canaries, 200 + 200 guesses: the bound from the guesses
    against the canary mechanism's own ε (2.17). The no-amplification ε the audit used before
    (z/2 per round: 4.8) is above what even a half-noise mechanism audits at."""
    z, k = 2.0, 200
    reference = canary_epsilon(z, 1, 1, 1e-5)
    bound = {name: epsilon_lower_bound(20_000, 2 * k, _scored(sigma).correct(k, k), 1e-5, 0.95)
             for name, sigma in (("honest", z), ("half", z / 2), ("none", 0.0))}
    assert bound["honest"] <= reference < bound["half"] < bound["none"], (reference, bound)
    assert bound["half"] < epsilon([(z, 1, 1)], 1e-5, "no-amplification")  # the old reference


# dp='client': canary nodes (harness/node_canaries.py) clip and noise their replies with the
# node's own code; one round of z = 2 (fedavg: k = 1), 15,000 canary nodes, 150 + 150
# guesses: reference 2.17, an honest run audits below it and one with half the nodes' noise
# above it (about 49 runs in 50 of the canary mechanism's scores, simulated; at 10,000 canary
# nodes and z = 2.5, 4 in 5)
NODE_TINY = {**TINY, "dp": "client", "num_server_rounds": 1, "dp_seed": -1,
             "dp_testing_reproducible_noise": False}  # a node refuses a server's seed
NODE_CANARIES, NODE_GUESSES, NODE_Z = 15_000, 150, 2.0


@pytest.fixture
def seeded_noise(monkeypatch):  # noqa: ANN001, ANN201
    """Every node's noise (`privatize`'s source, OS entropy in a run) from one RandomState(0) in
    draw order: the audits below are the same on every run."""
    shared = np.random.RandomState(0)
    monkeypatch.setattr(mechanism, "noise_source", lambda seed: shared)


def _node_audit(tmp_path, tiny_data, name: str, canaries: int = NODE_CANARIES,  # noqa: ANN001, ANN202
                guesses: int = NODE_GUESSES, node_config=None, **extra):  # noqa: ANN001
    cfg = RunConfig.of(figures=False,
                       results_dir=str(tmp_path), data_dir=tiny_data["fashion-mnist"], run_name=name,
                       **{**NODE_TINY, "dp_noise_multiplier": NODE_Z, **extra})
    return run_audit(cfg, 4, canaries=canaries, guesses=guesses, seed=1, node_config=node_config)


@needs_fashion_mnist
def test_node_canaries_a_noiseless_node_fails_the_client_audit(tmp_path, tiny_data, monkeypatch,
                                                                seeded_noise) -> None:
    """The nodes' noise drawn at 1/1000 of its std (`privatize` through `add_noise`): every
    guess right among 500 canary nodes; the accountant cannot see it."""
    original = mechanism.add_noise
    monkeypatch.setattr(mechanism, "add_noise",
                        lambda tensors, std, rng: original(tensors, std / 1000, rng))
    bare = _node_audit(tmp_path, tiny_data, "bare", canaries=500, guesses=50)
    assert bare.rounds == 1 and bare.correct == 100, bare
    assert bare.failed and bare.epsilon_audit > 3.0 > bare.epsilon_canary, bare


@pytest.mark.slow
@needs_fashion_mnist
def test_node_canaries_pass_honest_nodes_and_fail_nodes_with_half_their_noise(
        tmp_path, tiny_data, monkeypatch, seeded_noise) -> None:
    """Each node's noise std z√k·C/√(n + m) (n + m = 10,002 in the recipe): honest passes;
    `privatize` drawing half of it fails, the accountant unchanged."""
    honest = _node_audit(tmp_path, tiny_data, "honest")
    assert honest.rounds == 1 and honest.epsilon_canary == pytest.approx(canary_epsilon(NODE_Z, 1, 1, 1e-5))
    assert not honest.failed and honest.epsilon_audit < 1.2, honest
    original = mechanism.add_noise
    monkeypatch.setattr(mechanism, "add_noise", lambda tensors, std, rng: original(tensors, std / 2, rng))
    half = _node_audit(tmp_path, tiny_data, "half")
    assert half.epsilon_run == honest.epsilon_run  # the accountant cannot see the bug
    assert half.failed and half.epsilon_audit > honest.epsilon_canary, half


def _inflating(monkeypatch, factor: int) -> None:  # noqa: ANN001
    """A server that names `factor` times the cohort it samples (each node's noise share 1/√factor)."""
    real = AdaptiveStrategy.instruction

    def lying(self, server_round, config=None, sampled=None):  # noqa: ANN001, ANN202
        if sampled is None:
            return real(self, server_round, config)
        return real(self, server_round, config, factor * sampled)

    monkeypatch.setattr(AdaptiveStrategy, "instruction", lying)


@pytest.mark.slow
@needs_fashion_mnist
def test_node_canaries_fail_a_server_that_inflates_n_past_a_missing_floor(
        tmp_path, tiny_data, monkeypatch, seeded_noise) -> None:
    """The recipe names 4·(n + m): with a node floor that allows it (dp-max-cohort that high,
    as if the floor were missing) every node adds half its noise and the audit fails; with
    the audit's own floor (the run's z over √(n + m)) every node refuses and nothing is released."""
    _inflating(monkeypatch, 4)
    weak = _node_audit(tmp_path, tiny_data, "weak", node_config={client.MAX_COHORT: 4 * (2 + NODE_CANARIES)})
    assert weak.failed and weak.epsilon_audit > weak.epsilon_canary, weak
    with pytest.raises(ValueError, match="nothing to audit"):
        _node_audit(tmp_path, tiny_data, "floored", canaries=200, guesses=20, max_skipped_rounds=1)


@pytest.fixture
def seeded_integers(monkeypatch):  # noqa: ANN001, ANN201
    """Every SecAgg+ node's discrete noise (OS entropy in a run) from a generator seeded 0, 1, 2,
    … per draw: a rejection sampler's use of one shared stream would depend on the order the
    real nodes (threads) draw in; this way only their seeds permute, which leaves their noises'
    sum as it is, and the canary nodes (drawing after them, in order) get the same seeds."""
    seeds, original = itertools.count(), noise.discrete_gaussian
    monkeypatch.setattr(noise, "discrete_gaussian", lambda sigma, size, rng=None:
                        original(sigma, size, np.random.default_rng(next(seeds))))


def _secure_audit(tmp_path, tiny_data, name: str, canaries: int, guesses: int):  # noqa: ANN001, ANN202
    """SecAgg+ of 3 of 4 nodes (its least) and the canary nodes, at the default 32-bit modulus."""
    return _node_audit(tmp_path, tiny_data, name, canaries=canaries, guesses=guesses,
                       secagg="secagg+", fraction_train=0.75)


@needs_fashion_mnist
@pytest.mark.slow
def test_secure_canaries_pass_honest_nodes_and_fail_noiseless_ones(tmp_path, tiny_data, monkeypatch,
                                                                   seeded_integers) -> None:
    """Canary nodes through SecAgg+'s encoding and integer noise: honest passes (the canary
    mechanism's noise is z·S/B ≥ z√k per round, S the integers' reach with rounding), nodes
    drawing 1/1000 of their discrete noise get every guess right."""
    honest = _secure_audit(tmp_path, tiny_data, "honest", 500, 50)
    assert honest.rounds == 1 and not honest.failed, honest
    _scaled_integer_noise(monkeypatch, 1 / 1000)
    bare = _secure_audit(tmp_path, tiny_data, "bare", 500, 50)
    assert bare.correct == 100 and bare.failed and bare.epsilon_audit > 3.0, bare


def _scaled_integer_noise(monkeypatch, factor: float) -> None:  # noqa: ANN001
    original = noise.discrete_gaussian
    monkeypatch.setattr(noise, "discrete_gaussian",
                        lambda sigma, size, rng=None: original(sigma * factor, size, rng))


@pytest.mark.slow
@needs_fashion_mnist
def test_secure_canaries_fail_nodes_with_half_their_integer_noise(tmp_path, tiny_data, monkeypatch,
                                                                  seeded_integers) -> None:
    """As the dp='client' audit above (15,000 canary nodes, z = 2, 150 + 150 guesses), through
    SecAgg+: nodes drawing half their discrete noise fail, against the same reference."""
    _scaled_integer_noise(monkeypatch, 1 / 2)
    half = _secure_audit(tmp_path, tiny_data, "half", NODE_CANARIES, NODE_GUESSES)
    assert half.epsilon_canary == pytest.approx(canary_epsilon(NODE_Z, 1, 1, 1e-5))
    assert half.failed and half.epsilon_audit > half.epsilon_canary, half


@needs_fashion_mnist
@pytest.mark.parametrize("dp", ["central", "client"])
@pytest.mark.slow
def test_an_audit_books_apart_so_a_later_default_run_on_the_data_is_not_refused(dp: str, tmp_path,
                                                                                tiny_data) -> None:
    """The audit's runs (here at δ = 1e-6, no-amplification) book in <ledger dir>/audits/: the
    server's ledger and, under dp='client', every real node's. The data's ledger never holds
    them: a default dp='central' run on the same data afterwards (δ = 1e-5, which one ledger
    holding the audit's δ would refuse) runs, and its ledger's total is its own ε."""
    home = ledger_dir()
    audit = _audit(tmp_path, tiny_data, "audit", z=2.0, dp_delta=1e-6) if dp == "central" else \
        _node_audit(tmp_path, tiny_data, "audit", canaries=50, guesses=5, dp_delta=1e-6)
    booked = home / "audits" / audit.ledger.rsplit("/", 1)[-1]
    assert audit.ledger == str(booked) and booked.is_file(), audit
    assert any(f"booked in {booked}" in line for line in audit.lines())
    assert list(home.glob("*.jsonl")) == []  # neither the data's ledger nor a node's
    nodes = list((home / "audits").glob("node-*.jsonl"))
    assert len(nodes) == (2 if dp == "client" else 0), nodes  # the 2 sampled real nodes' own
    cfg = RunConfig.of(figures=False,
                       results_dir=str(tmp_path), data_dir=tiny_data["fashion-mnist"], run_name="after",
                       algorithm="fedavg", model="mlp", num_server_rounds=1, local_steps=1,
                       batch_size=16, dp="central", weighting="uniform", fraction_train=0.5,
                       dp_accept_epsilon=1e3, accept_small_rounds=True)  # the defaults' δ and accounting
    out = run_federated(InProcessGrid(4, cfg.to_flower()), cfg)
    [row] = metric_rows(out)
    assert row["dp-epsilon-ledger"] == pytest.approx(row["dp-epsilon"], rel=1e-12)
    assert confidential_rows(out)[-1]["dp-ledger-file"] == str(home / booked.name)  # the same data
