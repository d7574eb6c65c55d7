"""dp-ledger (privacy/ledger.py, issue 31 §8): runs naming one file add up to one ε, a resumed
round is not counted twice, and what cannot compose (another δ, a bad line) is refused."""

from __future__ import annotations

import json

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import to_recipe
from adaptfl.core.privacy_settings import Privacy
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.privacy import ledger
from adaptfl.privacy.accountant import epsilon
from adaptfl.server_app.loop import run_federated
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import die_before_checkpoint, metric_rows

# 2 rounds of 2 of 4 nodes, analytic RDP (no-amplification): each event is (1.0, 2, 4)
TINY = dict(num_server_rounds=2, local_steps=1, batch_size=16, model="mlp", weighting="uniform",
            dp="central", dp_seed=1, dp_testing_reproducible_noise=True, fraction_train=0.5,
            dp_accounting="no-amplification", dp_accept_epsilon=1e3,  # tiny federation's ε
            accept_small_rounds=True)
EVENT = (1.0, 2, 4)


def _run(tmp_path, tiny_data, name: str, book, **extra):  # noqa: ANN001, ANN202
    cfg = RunConfig.of(figures=False,
                       results_dir=str(tmp_path / "results"), data_dir=tiny_data["fashion-mnist"],
                       run_name=name, dp_ledger=str(book), **{**TINY, **extra})
    return run_federated(InProcessGrid(4, cfg.to_flower()), cfg)


def _lines(book) -> list[dict]:  # noqa: ANN001
    return [json.loads(line) for line in book.read_text().splitlines()]


@needs_fashion_mnist
def test_two_runs_naming_one_ledger_report_epsilon_over_both(tmp_path, tiny_data) -> None:
    book = tmp_path / "fashion-mnist.jsonl"
    first = metric_rows(_run(tmp_path, tiny_data, "a", book))
    second_dir = _run(tmp_path, tiny_data, "b", book)
    second = metric_rows(second_dir)
    lines = _lines(book)
    named = [(e["run"].rsplit("/", 1)[-1], e["round"]) for e in lines]
    assert named == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert lines[-1]["run"] == str(second_dir) and {e["delta"] for e in lines} == {1e-5}
    whole = epsilon([EVENT] * 4, 1e-5, "no-amplification")  # the accountant, on its own
    assert second[-1]["dp-epsilon-ledger"] == pytest.approx(whole, rel=1e-9)
    assert second[-1]["dp-epsilon"] == pytest.approx(epsilon([EVENT] * 2, 1e-5, "no-amplification"))
    assert whole > first[-1]["dp-epsilon"] and whole > second[-1]["dp-epsilon"]
    assert first[-1]["dp-epsilon-ledger"] == pytest.approx(first[-1]["dp-epsilon"])  # alone then
    assert second[0]["dp-epsilon-ledger"] == pytest.approx(epsilon([EVENT] * 3, 1e-5, "no-amplification"))
    assert ledger.total_epsilon(book) == (pytest.approx(whole), 2, 4)


@needs_fashion_mnist
def test_a_round_rerun_on_resume_is_not_appended_twice(tmp_path, tiny_data, monkeypatch) -> None:
    """Killed after round 2's ledger line, before its checkpoint: the resume reruns round 2."""
    book = tmp_path / "ledger.jsonl"
    die_before_checkpoint(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, tiny_data, "r", book)
    assert [e["round"] for e in _lines(book)] == [1, 2]
    monkeypatch.undo()  # the real checkpoint again
    rows = metric_rows(_run(tmp_path, tiny_data, "r", book, resume=True))
    assert [e["round"] for e in _lines(book)] == [1, 2] and len({e["run-key"] for e in _lines(book)}) == 1
    assert rows[-1]["dp-epsilon-ledger"] == pytest.approx(epsilon([EVENT] * 2, 1e-5, "no-amplification"))


@needs_fashion_mnist
def test_another_delta_in_the_ledger_is_refused_before_round_1(tmp_path, tiny_data) -> None:
    book = tmp_path / "ledger.jsonl"
    _run(tmp_path, tiny_data, "a", book, num_server_rounds=1)
    with pytest.raises(ValueError, match=r"1e-05, this run at dp-delta=1e-06.* one δ: run at dp-delta=1e-05"):
        _run(tmp_path, tiny_data, "b", book, dp_delta=1e-6)
    assert len(_lines(book)) == 1 and not (tmp_path / "results" / "b" / "model.pt").exists()


def test_a_line_that_does_not_parse_is_refused_naming_the_file_and_line(tmp_path) -> None:
    book = tmp_path / "ledger.jsonl"
    good = {"z": 1.0, "n": 2, "N": 4, "delta": 1e-5, "accounting": "no-amplification", "run": "a",
            "run-key": "k", "round": 1}
    book.write_text(json.dumps(good) + "\n{not json\n")
    privacy = Privacy(dp="central", dp_ledger=str(book), dp_accounting="no-amplification")
    with pytest.raises(ValueError, match=rf"dp-ledger {book} line 2: not a privacy event"):
        ledger.check_privacy_ledger(privacy)
    book.write_text(json.dumps(good) + "\n" + json.dumps({**good, "delta": 1e-6}))
    with pytest.raises(ValueError, match="one ledger reports one δ: run at dp-delta=1e-06, or name another") \
            as refused:
        ledger.check_privacy_ledger(privacy)
    assert refused.value.args[0].endswith(  # what to do with an audit's old lines
        f"a one-run audit's lines, booked here before audits booked apart, belong in "
        f"{tmp_path / 'audits' / 'ledger.jsonl'}: move them there")


def test_runs_of_both_accounting_modes_compose_into_one_total(tmp_path) -> None:
    """An audit's no-amplification run does not jam later default runs on the same data: the
    total is both events' RDP curves summed, between either mode's total and their sum."""
    book = tmp_path / "ledger.jsonl"
    line = {"z": 1.0, "n": 2, "N": 4, "delta": 1e-5, "run": "a", "run-key": "k", "round": 1}
    book.write_text(json.dumps({**line, "accounting": "no-amplification"}) + "\n")
    privacy = Privacy(dp="central", dp_ledger=str(book))  # without-replacement, the default
    ledger.check_privacy_ledger(privacy)  # not refused
    total = ledger.record(privacy, (1.0, 2, 4), "b", "k2", 1)
    plain, sampled = (epsilon([(1.0, 2, 4)], 1e-5, m) for m in ("no-amplification", "without-replacement"))
    assert max(plain, sampled) < total < plain + sampled
    assert ledger.total_epsilon(book) == (pytest.approx(total), 2, 2)


def test_a_relative_or_dp_less_ledger_is_refused_and_clients_never_see_the_path(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"dp-ledger='ledger.jsonl' must be an absolute path"):
        RunConfig.of(dp="central", weighting="uniform", dp_ledger="ledger.jsonl")
    with pytest.raises(ValueError, match=r"dp-ledger=.* with dp='none'"):
        RunConfig.of(dp_ledger=str(tmp_path / "l.jsonl"))
    cfg = RunConfig.of(dp="central", weighting="uniform", dp_ledger=str(tmp_path / "l.jsonl"))
    recipe = to_recipe(cfg.algorithm, cfg.round_info(1), cfg.data, privacy=cfg.privacy)
    assert "privacy.dp" in recipe and not any("ledger" in k for k in recipe)


def test_the_privacy_grid_names_one_ledger_per_data_set_and_renders_its_total(tmp_path, monkeypatch) -> None:
    """harness/privacy.py with a fake sweep: every dp cell names <results>/ledgers/fashion-mnist.jsonl,
    the ε = ∞ cells none, and the section states ε over the whole ledger."""
    from adaptfl.harness import privacy as harness
    from adaptfl.harness.table import append_row

    monkeypatch.setattr(harness, "noise_multiplier", lambda target: 16.0 / target)  # no bisection
    book = harness.ledger_path(tmp_path)
    cells = harness.PrivacyGrid(ledger=str(book)).cells()
    dp_cells = [c for c in cells if "dp" in c.run_config]
    assert {c.run_config.get("dp-ledger") for c in dp_cells} == {str(book)}
    assert all("dp-ledger" not in c.run_config for c in cells if c not in dp_cells)
    RunConfig.from_flower(dp_cells[0].run_config, drop_unused=True)  # a key the runs accept

    privacy = Privacy(dp="central", dp_ledger=str(book), dp_accounting="no-amplification")

    def fake_sweep(grid, results, jobs):  # noqa: ANN001, ANN202
        assert grid.ledger == str(harness.ledger_path(results))
        for key, rounds in (("a", 2), ("b", 1)):  # two runs' releases
            for r in range(1, rounds + 1):
                ledger.record(privacy, EVENT, f"{results}/runs/{key}", key, r)
        cell = next(c for c in grid.cells() if c.axes["algorithm"] == "fedavg"
                    and c.run_config.get("dp-target-epsilon") == 8.0)
        append_row(results / f"{harness.NAME}.csv",
                   {"cell": cell.cell_id, "algorithm": "fedavg", "final-test-accuracy": 0.5, "dp": "central",
                    "dp-target-epsilon": 8.0, "series:test-accuracy": json.dumps([0.5]),
                    "series:dp-epsilon": json.dumps([1.0])})
        append_row(results / f"{harness.NAME}.csv",  # a dp cell of before the ledger: left out
                   {"cell": "stale", "algorithm": "fedavg", "final-test-accuracy": 0.9, "dp": "central",
                    "dp-target-epsilon": 8.0, "series:test-accuracy": json.dumps([0.9])})
        return 1

    monkeypatch.setattr(harness, "run_sweep", fake_sweep)
    page = tmp_path / "results.md"
    page.write_text("# Results\n\n## Systems\n")
    harness.main(["--results-dir", str(tmp_path), "--out", str(page)])
    whole = epsilon([EVENT] * 3, 1e-5, "no-amplification")
    text = page.read_text()
    assert f"**Total ε spent on fashion-mnist** (its ledger, `dp-ledger`): ε = {whole:.4g}" in text
    assert "over all 2 dp runs, 3 released rounds" in text
    assert "| fedavg | 8 | – | 1.000 | 0.5000 ± 0.0000 | 0.5000 ± 0.0000 |" in text, text
    assert "no ledger" in harness.section([], tmp_path / "none.jsonl")


def test_runs_appending_at_once_leave_every_line_whole(tmp_path) -> None:
    """Four writers at once (each its own open file, as separate runs are): no line lost or torn."""
    from concurrent.futures import ThreadPoolExecutor

    book = tmp_path / "ledger.jsonl"
    privacy = Privacy(dp="central", dp_ledger=str(book), dp_accounting="no-amplification")

    def run(key: str) -> None:
        for r in range(1, 26):
            ledger.record(privacy, EVENT, key, key, r)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(run, "abcd"))
    entries = ledger.read(book)
    assert len(entries) == 100 and {(e["run-key"], e["round"]) for e in entries} == \
        {(k, r) for k in "abcd" for r in range(1, 26)}


@needs_fashion_mnist
def test_without_dp_ledger_runs_on_the_same_data_compose_across_results_dirs(tmp_path, tiny_data) -> None:
    """No dp-ledger named: two runs in two results dirs share the per-user ledger of their data
    (task + its training labels), and the second row names it and ε over both; a run on other
    data (the test split as training rows would be other data) has its own."""
    def run(results: str, name: str):  # noqa: ANN202
        cfg = RunConfig.of(figures=False,
                           results_dir=str(tmp_path / results), data_dir=tiny_data["fashion-mnist"],
                           run_name=name, **TINY)
        out = run_federated(InProcessGrid(4, cfg.to_flower()), cfg)
        whole = (out / "server-confidential.jsonl").read_text().splitlines()
        return out, [json.loads(line) for line in whole]

    _, first = run("one", "a")
    out, second = run("two", "b")
    book = ledger.ledger_dir() / f"{first[-1]['dp-ledger-file'].rsplit('/', 1)[-1]}"
    assert second[-1]["dp-ledger-file"] == first[-1]["dp-ledger-file"] == str(book)
    assert book.parent == ledger.ledger_dir() and str(tmp_path) not in str(book)  # not under results
    assert book.name.startswith("fashion-mnist-") and len(_lines(book)) == 4
    whole = epsilon([EVENT] * 4, 1e-5, "no-amplification")
    assert second[-1]["dp-epsilon-ledger"] == pytest.approx(whole, rel=1e-9)
    assert metric_rows(out)[-1]["dp-epsilon-ledger"] == pytest.approx(whole, rel=1e-9)  # released
    labels = torch.arange(10) % 3
    assert ledger.data_key("fashion-mnist", labels) != ledger.data_key("fashion-mnist", labels.flip(0))
