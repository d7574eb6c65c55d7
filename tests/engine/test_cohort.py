"""The cohort engine (`python -m adaptfl.engine --cohort C`) against the one-at-a-time engine:
for the same seed, sampling and batches, the same final model (float64, to 1e-10), for every
client-side composition of the catalog, with partial participation, durable client state, a
resume in between, and both gradient forms; each client's random stream independent of C.

Batched gradients differ from one client's in their last bits wherever the BLAS sums in another
order (an AMD EPYC's does, an Intel Xeon's happened not to), so the every-composition test
perturbs the batched gradients by a few ulps itself: the equality it asserts holds whatever the
machine's summation order. SOAP is the exception: its eigenbasis of rank-deficient Kronecker
statistics is not continuous in its inputs (a few ulps move the model by ~5e-3), so for SOAP the
test checks the batched gradients against each client's own to round-off at every step, and the
rest of the cohort's path (rows, own steps, replies) on the single gradients' exact bits."""

from __future__ import annotations

import logging

import pytest
import torch

from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.engine import __main__ as engine_cli
from adaptfl.engine import cohort_steps
from adaptfl.engine.cohort import CohortGrid
from adaptfl.engine.cohort_steps import BatchedGradients
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.local_update import native
from adaptfl.server_app import outputs
from adaptfl.server_app.loop import run_federated
from tests.support.native_steps import count_native_steps
from tests.support.run_outputs import die_before_checkpoint, metric_rows

TASK = "tests.support.float64_task"


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plots are the same code in both engines and most of a tiny run's time."""
    monkeypatch.setattr(outputs, "plot_run", lambda *args, **kwargs: None)


def _config(algorithm: str, tmp_path, name: str, **kw: object) -> RunConfig:
    extra: dict[str, object] = {"muon_routing": "all-2d"} if algorithm.endswith("muon") else \
        {"max_precond_dim": 100} if algorithm.endswith("soap") else {}
    settings: dict[str, object] = dict(
        algorithm=algorithm, num_server_rounds=3, local_steps=4, batch_size=16, task=f"{TASK}:load",
        model=f"{TASK}:build", data_dir=str(tmp_path), run_name=name,
        figures=False, results_dir=str(tmp_path / "out"),
        client_state_dir=str(tmp_path / f"state-{name}"), fraction_train=0.75)
    return RunConfig.of(**{**settings, **extra, **kw})


def _run(cfg: RunConfig, cohort: int | None, form: str = "auto"
         ) -> tuple[dict[str, torch.Tensor], list[dict]]:
    grid = InProcessGrid(4, cfg.to_flower()) if cohort is None else \
        CohortGrid(4, cfg.to_flower(), cohort, form)
    out = run_federated(grid, cfg)
    return torch.load(out / "model.pt", weights_only=True), metric_rows(out)


def _assert_same_models(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-10, atol=1e-12, msg=name)


def _client_side(name: str) -> tuple:
    """What a client of the algorithm runs (the server optimizer and aggregator left out)."""
    a = catalog()[name]
    return (a.preconditioner, a.correction, a.trust, a.moments, a.sharing, a.terms, a.local_state)


# one algorithm per client-side composition (FedAvgM, FedAdam, FedYogi, … run FedAvg's clients):
# the reference step for the elementwise rules, each client's own step for Muon's and SOAP's
CLIENT_SIDES = sorted({_client_side(n): n for n in sorted(catalog(), reverse=True)}.values())


ULPS = 4  # the batched gradients' perturbation: another BLAS's summation order, and then some


def _perturb_batched_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batched gradient times (1 + r·eps), r uniform in [-ULPS, ULPS] (seeded): what a
    machine that sums in another order computes."""
    batched, gen = BatchedGradients.__call__, torch.Generator().manual_seed(0)

    def perturbed(self: BatchedGradients, batches: cohort_steps.Batches, j: int) -> None:
        batched(self, batches, j)
        g = self.rows.g
        r = torch.randint(-ULPS, ULPS + 1, g.shape, generator=gen).to(g.dtype)
        g.mul_(1.0 + r * torch.finfo(g.dtype).eps)
    monkeypatch.setattr(BatchedGradients, "__call__", perturbed)


def _single_gradients_after_batched_ones(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each step's batched gradients checked against every client's own (its model, its
    backward) to round-off, then the single ones' bits kept: returns the largest gap seen."""
    batched, gaps = BatchedGradients.__call__, []

    def checked(self: BatchedGradients, batches: cohort_steps.Batches, j: int) -> None:
        batched(self, batches, j)
        together = self.rows.g.clone()
        streams = [torch.get_rng_state() for _ in self.jobs]  # SOAP draws nothing
        cohort_steps.loop_gradients(self.jobs, self.rows, batches, streams, j)  # corrected too
        eps = torch.finfo(together.dtype).eps
        scale = self.rows.g.abs().amax(dim=1, keepdim=True).clamp(min=eps)
        gaps.append(float(((together - self.rows.g).abs() / scale).max()))
    monkeypatch.setattr(BatchedGradients, "__call__", checked)
    return gaps


def _eigenbasis(algorithm: str) -> bool:
    return catalog()[algorithm].preconditioner.name == "soap"


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", CLIENT_SIDES)
def test_every_algorithm_ends_on_the_one_at_a_time_model(algorithm: str, tmp_path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    alone, alone_rows = _run(_config(algorithm, tmp_path, "alone"), None)
    gaps = _single_gradients_after_batched_ones(monkeypatch) if _eigenbasis(algorithm) else None
    if gaps is None:
        _perturb_batched_gradients(monkeypatch)
    together, rows = _run(_config(algorithm, tmp_path, "cohort"), 3)
    _assert_same_models(alone, together)
    assert [r["replies-accepted"] for r in rows] == [r["replies-accepted"] for r in alone_rows] == [3, 3, 3]
    if gaps is not None:  # every step batched, each within round-off of the client's own
        assert rows[-1]["step-path"] == "cohort-grouped" and len(gaps) == 3 * 4
        assert max(gaps) <= 64 * torch.finfo(torch.float64).eps, max(gaps)


@pytest.mark.parametrize("algorithm,form,ran", [  # FedProx adds a loss term: the loop
    ("fedact", "vmap", "vmap"), ("fedact", "loop", "loop"), ("fedact", "grouped", "grouped"),
    ("scaffold", "auto", "grouped"), ("fedprox", "auto", "loop")])
@pytest.mark.slow
def test_the_forms_end_on_the_one_at_a_time_model(algorithm: str, form: str, ran: str, tmp_path) -> None:
    alone, alone_rows = _run(_config(algorithm, tmp_path, "alone"), None)
    together, rows = _run(_config(algorithm, tmp_path, "cohort"), 3, form)
    _assert_same_models(alone, together)
    assert {r["step-path"] for r in rows} == {f"cohort-{ran}"}
    assert {r["cohort-size"] for r in rows} == {3}
    for mine, theirs in zip(rows, alone_rows, strict=True):  # the clients' metrics too
        for key in ("train-loss", "pos-ratio", "top-mass"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-9), key


@pytest.mark.parametrize("form,ran", [("grouped", "cohort-grouped"), ("vmap", "cohort-vmap"),
                                      ("loop", "cohort-loop"), ("auto", None)])
def test_a_convolution_in_every_form_ends_on_the_one_at_a_time_model(form: str, ran: str | None,
                                                                     tmp_path, caplog) -> None:
    """The float64 task read as an image: the grouped form's grouped convolution, vmap's, the
    loop's, and auto's pick on a CPU (one at a time: batched convolutions were slower there)."""
    caplog.set_level(logging.INFO, logger="adaptfl.engine.cohort")
    model = {"model": f"{TASK}:build_cnn"}
    alone, _ = _run(_config("scaffold", tmp_path, "alone", **model), None)
    together, rows = _run(_config("scaffold", tmp_path, "cohort", **model), 3, form)
    _assert_same_models(alone, together)
    if ran is not None:
        assert {r["step-path"] for r in rows} == {ran}
        return
    assert "cohort-size" not in rows[-1]
    assert any("convolutions train faster one client at a time" in r.getMessage() for r in caplog.records)


def test_a_client_stream_does_not_depend_on_the_cohort_size(tmp_path) -> None:
    """Sophia draws GNB labels from each client's own RNG stream at every refresh: cohorts of 2
    (3 sampled: a cohort of 2, then 1) and of 3 end on the one-at-a-time model."""
    kw = {"hessian_interval": 2}
    alone, _ = _run(_config("fedpac-sophia", tmp_path, "alone", **kw), None)
    for size in (2, 3):
        together, rows = _run(_config("fedpac-sophia", tmp_path, f"c{size}", **kw), size)
        _assert_same_models(alone, together)
        assert {r["step-path"] for r in rows} == {"cohort-loop"}


def test_a_resumed_cohort_run_equals_an_uninterrupted_one_at_a_time(tmp_path, monkeypatch) -> None:
    """SCAFFOLD's c_i is durable client state: killed before round 2's checkpoint, resumed."""
    alone, _ = _run(_config("scaffold", tmp_path, "alone"), None)
    cut = _config("scaffold", tmp_path, "cut")
    with monkeypatch.context() as m:
        die_before_checkpoint(m, 2)
        with pytest.raises(KeyboardInterrupt):
            _run(cut, 3)
    resumed, rows = _run(cut.replace(resume=True), 3)
    assert [r["round"] for r in rows] == [1, 2, 3]
    _assert_same_models(alone, resumed)


def test_a_rule_without_a_batched_step_shares_the_gradients_and_steps_itself(tmp_path, caplog) -> None:
    """Muon's per-tensor rule: the gradients batched (grouped), each client's own Muon step."""
    caplog.set_level(logging.INFO, logger="adaptfl.engine.cohort")
    alone, _ = _run(_config("local-muon", tmp_path, "alone"), None)
    together, rows = _run(_config("local-muon", tmp_path, "cohort"), 3)
    _assert_same_models(alone, together)
    assert {r["step-path"] for r in rows} == {"cohort-grouped"}
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cohort: local-muon")]
    assert said == ["cohort: local-muon: up to 3 clients a step, grouped gradients, each client's own "
                    "optimizer step (its local rule adamw+muon has no batched step here), on cpu"]


def test_own_steps_whose_gradients_cannot_batch_train_one_at_a_time_and_say_so(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="adaptfl.engine.cohort")
    alone, _ = _run(_config("local-muon", tmp_path, "alone"), None)
    together, rows = _run(_config("local-muon", tmp_path, "cohort"), 3, "loop")
    assert torch.equal(torch.cat([t.reshape(-1) for t in alone.values()]),
                       torch.cat([t.reshape(-1) for t in together.values()]))
    assert "cohort-size" not in rows[-1]
    said = [r.getMessage() for r in caplog.records if "one at a time" in r.getMessage()]
    assert said == ["cohort: local-muon: its local rule adamw+muon has no batched step here, and its "
                    "gradients go client by client: its clients train one at a time"]


@pytest.mark.parametrize("given,error", [("0", "--cohort 0: give a count >= 1 or auto"),
                                         ("two", "--cohort two: give a count >= 1 or auto")])
def test_a_bad_cohort_is_refused_in_one_line(given: str, error: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        engine_cli.main(["--cohort", given, "algorithm='fedavg'"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == f"config error: {error}"


def test_auto_leaves_fedact_on_a_cpu_to_the_native_loops(tiny_data, tmp_path, caplog,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 FedACT on a CPU where the native loops build: each client's own step (the native
    loops) is faster than the batched reference there (docs/scale.md), so --cohort-form auto
    batches the gradients only and says so; an explicit form takes the reference step."""
    caplog.set_level(logging.INFO, logger="adaptfl.engine.cohort")
    cfg = RunConfig.of(algorithm="fedact", model="mlp", num_server_rounds=1, local_steps=2, batch_size=16,
                       data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), run_name="auto",
                       accept_small_rounds=True)
    steps = count_native_steps(monkeypatch)
    alone = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg.replace(run_name="alone")))
    alone_native, steps[0] = steps[0], 0
    rows = metric_rows(run_federated(CohortGrid(2, cfg.to_flower(), 2), cfg))
    assert rows[-1]["step-path"] == "cohort-grouped"
    ran_native = steps[0]
    forced = metric_rows(run_federated(CohortGrid(2, cfg.to_flower(), 2, "vmap"),
                                       cfg.replace(run_name="vmap")))
    assert forced[-1]["step-path"] == "cohort-vmap"
    if native.library() is None:  # no C compiler: nothing is faster than the batch
        assert ran_native == 0
        return
    assert ran_native == alone_native > 0  # every step the native loops take alone
    assert rows[-1]["test-loss"] == pytest.approx(alone[-1]["test-loss"], rel=1e-5)
    assert any("the native loops) is faster client by client" in r.getMessage() for r in caplog.records)
