"""How a run ended, said once (docs/own-app.md, "Did the run work?"): the ServerApp's last line
(completed: the final accuracy and the results folder; failed: the kind and the reason), and
`python -m adaptfl.flwr_run`'s exit status from it and the SuperLink's status. The full path
under `flwr run` is tests/project/test_template.py's generated-app run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from adaptfl import flwr_run
from adaptfl.algorithms.config import RunConfig
from adaptfl.core.exit_codes import ABORTED_EXIT_CODE, REFUSED_EXIT_CODE
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app import app
from adaptfl.server_app.abort import RunAborted


class FlowerLikeGrid(InProcessGrid):
    static_nodes = False  # as under Flower: the nodes are known at round 1 only


def _run_config(tiny_data, tmp_path, **kw) -> dict:
    values = dict(model="mlp", task="fashion-mnist", num_server_rounds=2, local_steps=2, batch_size=8,
                  data_dir=tiny_data["fashion-mnist"],
                  figures=False, results_dir=str(tmp_path / "out"), run_name="t",
                  client_state_dir=str(tmp_path / "state"), accept_small_rounds=True)  # two nodes
    return RunConfig.of(**{**values, **kw}).to_flower()


def _main(run_config: dict, grid: InProcessGrid) -> None:
    app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))


def _adaptfl_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "adaptfl"]


@pytest.fixture
def adaptfl_log(caplog: pytest.LogCaptureFixture,
                monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """adaptfl's lines, each once, whether or not the ServerApp stopped their propagation."""
    logger = logging.getLogger("adaptfl")
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="adaptfl")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.slow
def test_a_completed_run_ends_with_its_accuracy_and_folder(tiny_data, tmp_path, adaptfl_log) -> None:
    run_config = _run_config(tiny_data, tmp_path, num_server_rounds=1, local_steps=1)
    _main(run_config, FlowerLikeGrid(2, run_config))
    rows = [json.loads(line) for line in (tmp_path / "out" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert _adaptfl_lines(adaptfl_log)[-1] == (
        f"run completed: round 1, test-accuracy {rows[-1]['test-accuracy']:.4f} (initial model "
        f"{rows[0]['test-accuracy']:.4f}); results: {tmp_path / 'out' / 't'}")


def test_a_refused_config_ends_with_the_reason(tiny_data, tmp_path, adaptfl_log) -> None:
    run_config = {**_run_config(tiny_data, tmp_path), "local-steps": 0}
    with pytest.raises(ValueError):
        _main(run_config, FlowerLikeGrid(2, run_config))
    last = _adaptfl_lines(adaptfl_log)[-1]
    assert last.startswith("run FAILED (refused): ") and "local-steps" in last, last
    assert flwr_run.exit_code(("finished:failed", ""), "adaptfl: " + last) == REFUSED_EXIT_CODE


def test_a_run_whose_every_client_fails_ends_aborted(tiny_data, tmp_path, adaptfl_log) -> None:
    def broken(msg, context):
        raise RuntimeError("the client's data is gone")

    run_config = _run_config(tiny_data, tmp_path, num_server_rounds=4, max_skipped_rounds=2)
    with pytest.raises(RunAborted):
        _main(run_config, FlowerLikeGrid(2, run_config, handler=broken))
    last = _adaptfl_lines(adaptfl_log)[-1]
    assert last.startswith("run FAILED (aborted): run aborted after round 2: 2 consecutive"), last
    assert flwr_run.exit_code(("finished:failed", ""), "adaptfl: " + last) == ABORTED_EXIT_CODE


def test_the_wrapper_exit_status() -> None:
    """0 only for a completed run whose ServerApp did not say FAILED; 1 when the cause is not
    adaptfl's (no outcome line, a crash) or the SuperLink could not be asked."""
    done = "adaptfl: run completed: round 2, test-accuracy 0.5000; results: /r"
    assert flwr_run.exit_code(("finished:completed", ""), done) == 0
    assert flwr_run.exit_code(("finished:failed", "No heartbeat"), done) == 1
    assert flwr_run.exit_code(("finished:failed", ""), "") == 1
    assert flwr_run.exit_code(None, done) == 1
    assert flwr_run.exit_code(("finished:failed", ""), "adaptfl: run FAILED (error KeyError): 'x'") == 1
    assert flwr_run.superlink_of([".", "--run-config", "a=1", "remote", "--stream"]) == ["remote"]
    assert flwr_run.superlink_of(["-c", "x=1", "."]) == []
    asked = iter([None, ("running", ""), ("finished:completed", "")])
    flwr_run.POLL_SECONDS = 0.0
    assert flwr_run.wait_finished(lambda: next(asked)) == ("finished:completed", "")


def test_the_wrapper_refuses_the_run_config_before_flower(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m adaptfl.flwr_run . --run-config "algorithm=fedadamw"`: adaptfl's line, exit 2,
    no Flower process (Flower would say only "invalid format")."""
    project = Path(__file__).resolve().parents[2]
    code = flwr_run.main([str(project), "--stream", "--run-config", "algorithm=fedadamw"])
    assert code == REFUSED_EXIT_CODE
    err = capsys.readouterr().err
    assert "config error: --run-config algorithm=fedadamw:" in err and "algorithm='fedadamw'" in err, err
    assert flwr_run.run_configs_of([".", "-c", "a=1", "--run-config", "b=2"]) == (Path("."), ["a=1", "b=2"])


def test_the_wrapper_leaves_a_stock_apps_own_keys_to_it(capsys: pytest.CaptureFixture[str]) -> None:
    """A ported stock Flower app reads keys adaptfl does not declare (`num-train-examples`,
    `out-dir`): the wrapper lets them through (its own ServerApp reads them), checks the adaptfl
    keys it uses (`lr`), and a missing config file is one line and exit 2, before Flower."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    app = str(examples / "flower-app-fedact")
    assert flwr_run.refusal([app, "--run-config", "num-train-examples=500 out-dir='/tmp/x' lr=0.02"]) is None
    assert flwr_run.refusal([app, "--run-config", "lr=0"]) == "invalid lr=0: must be > 0.0"
    code = flwr_run.main([app, "--run-config", "missing.toml"])
    assert code == REFUSED_EXIT_CODE
    assert capsys.readouterr().err.startswith("config error: --run-config missing.toml: no such file")


def test_the_wrapper_repeats_the_outcome_line_without_colour_codes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Flower colours its log levels: the closing line the wrapper repeats has no escape codes
    (Flower's own streamed lines are echoed as they came)."""
    lines = ["\x1b[92mINFO \x1b[0m:      Successfully started run 7\n",
             "\x1b[91mERROR \x1b[0m: adaptfl: run FAILED (aborted): after round 3: node 2: client error 2: "
             "RuntimeError: simulated client crash\x1b[0m\n"]

    class FakeFlower:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.stdout, self.returncode = iter(lines), 0

        def __enter__(self) -> FakeFlower:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(flwr_run.subprocess, "Popen", FakeFlower)
    returned, run_id, outcome = flwr_run.stream(["."], {})
    assert (returned, run_id) == (0, 7)
    assert outcome == ("adaptfl: run FAILED (aborted): after round 3: node 2: client error 2: "
                       "RuntimeError: simulated client crash")
    assert flwr_run.exit_code(("finished:failed", ""), outcome) == ABORTED_EXIT_CODE
    assert capsys.readouterr().out == "".join(lines)
