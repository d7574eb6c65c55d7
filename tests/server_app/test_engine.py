"""End to end through the in-process engine: outputs a user can read, failures recorded."""

from __future__ import annotations

import csv
import json

import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse as handle_train
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.local_update import native
from adaptfl.server_app.loop import run_federated
from adaptfl.workloads import build_model
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import final_model, metric_rows

SMALL = dict(num_server_rounds=2, local_steps=3, batch_size=32, run_name="t",
             accept_small_rounds=True)  # two nodes a round


@pytest.mark.slow
def test_fedact_run_writes_metrics_plot_and_model(tmp_path, tiny_data) -> None:
    cfg = RunConfig.of(results_dir=str(tmp_path), data_dir=tiny_data["fashion-mnist"], **SMALL)
    out = run_federated(InProcessGrid(3, cfg.to_flower()), cfg)
    rows = metric_rows(out)
    assert [r["round"] for r in rows] == [1, 2]
    for key in ("test-accuracy", "test-loss", "train-loss", "direction-consistency",
                "pos-ratio", "top-mass", "bytes-down", "bytes-up", "replies-accepted",
                "replies-rejected"):
        assert key in rows[0], key
    assert rows[0]["replies-accepted"] == 3 and rows[0]["replies-rejected"] == 0
    assert 0.0 < rows[1]["pos-ratio"] < 1.0 and 0.0 < rows[1]["top-mass"] < 1.0
    assert -1.0 <= rows[1]["direction-consistency"] <= 1.0
    # Round 2 also ships Δ_G and v̄ (one model's worth each): more bytes down than round 1.
    assert rows[1]["bytes-down"] > 2.5 * rows[0]["bytes-down"]
    # which local-step path ran: FedACT's native CPU loops wherever they build here
    path = "native" if native.library() is not None else "eager"
    assert [r[wire.STEP_PATH] for r in rows] == [path, path]
    assert all(c[wire.STEP_PATH] == path for r in rows for c in r["clients"].values())
    with (out / "metrics.csv").open() as fh:
        table = list(csv.DictReader(fh))
        assert len(table) == 3  # round 0 (the initial model), 1, 2
        assert [r[wire.STEP_PATH] for r in table] == ["", path, path]
    assert (out / "plot.png").stat().st_size > 1000
    state = final_model(out)
    build_model("cnn", 10, 1, 28).load_state_dict(state)
    assert json.loads((out / "config.json").read_text())["algorithm"] == "fedact"


@pytest.mark.slow
@needs_fashion_mnist
def test_a_raising_client_is_recorded_and_the_round_goes_on(tmp_path, tiny_data) -> None:
    def flaky(msg, context):
        if context.node_config["partition-id"] == 1:
            raise RuntimeError("disk full on partition 1")
        return handle_train(msg, context)

    cfg = RunConfig.of(figures=False, results_dir=str(tmp_path), algorithm="localadamw",
                       data_dir=tiny_data["fashion-mnist"], **SMALL)
    out = run_federated(InProcessGrid(3, cfg.to_flower(), handler=flaky), cfg)
    rows = metric_rows(out)
    assert [r["replies-accepted"] for r in rows] == [2, 2]
    assert "disk full on partition 1" in rows[0]["rejected"]["2"]
    assert rows[-1]["test-accuracy"] > 0.2
    # figures=false: the numbers and the data summary, no matplotlib figure
    assert (out / "metrics.csv").exists() and (out / "data-summary.json").exists()
    assert not [p.name for p in out.glob("*.png")]


@needs_fashion_mnist
def test_progress_lines_round_zero_plots_and_tensorboard(tmp_path, caplog, tiny_data) -> None:
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = RunConfig.of(results_dir=str(tmp_path), tensorboard=True, model="mlp",
                       data_dir=tiny_data["fashion-mnist"], **SMALL)
    with caplog.at_level(logging.INFO, logger="adaptfl"):
        out = run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    lines = [r.getMessage() for r in caplog.records if "[ROUND" in r.getMessage()]
    assert lines[0].startswith("[ROUND 0/2] the initial model")
    assert lines[1].startswith("[ROUND 1/2] accuracy") and "ETA" in lines[1] and "2/2 replies" in lines[1]
    rows = metric_rows(out, initial=True)
    assert [r["round"] for r in rows] == [0, 1, 2] and set(rows[0]) == {"round", "test-accuracy", "test-loss"}
    assert (out / "plot.png").stat().st_size > 1000 and (out / "diagnostics.png").stat().st_size > 1000
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    steps = [e.step for e in events.Scalars("test-accuracy")]
    assert steps == [0, 1, 2]
    values = [e.value for e in events.Scalars("test-accuracy")]
    assert values == pytest.approx([r["test-accuracy"] for r in rows])


@pytest.mark.slow
def test_engine_cli_errors_are_one_line(tmp_path) -> None:
    import subprocess
    import sys

    for args, expected in ((["tua=0.3"], "config error: unknown run-config key 'tua' (did you mean 'tau'"),
                           ([f"results-dir={tmp_path}", "task=nope"], "config error: unknown task 'nope'")):
        done = subprocess.run([sys.executable, "-m", "adaptfl.engine", "--num-nodes", "2", *args],
                              capture_output=True, text=True, timeout=120)
        # exit 2: refused before round 1, as scripts/main_job.sh (core/exit_codes.py)
        assert done.returncode == 2 and done.stderr.strip().startswith(expected), done.stderr
        assert done.stderr.strip().count("\n") == 0, done.stderr


def test_a_batch_larger_than_the_data_is_warned_about(tmp_path, tiny_data, caplog) -> None:
    import logging

    cfg = RunConfig.of(figures=False,
                       results_dir=str(tmp_path), model="mlp", data_dir=tiny_data["fashion-mnist"],
                       num_server_rounds=3, local_steps=1, batch_size=1_000_000, run_name="big",
                       accept_small_rounds=True)
    with caplog.at_level(logging.WARNING, logger="adaptfl"):
        run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "batch-size=1000000 exceeds the 600 training examples" in messages  # the server, first
    # each of the 2 clients once in the run's 3 rounds (it holds for the whole run); the
    # server's one-step preflight on 4 rows stays quiet
    assert messages.count("exceeds this client's") == 2, messages
    row = metric_rows(tmp_path / "big")[0]
    assert 0 < row["eval-seconds"] <= row["seconds"]  # the central evaluation's share of the round


def test_a_reply_forged_in_another_nodes_name_never_reaches_the_server() -> None:
    """issue 32 §5: node 3's handler stamps its reply as node 2's. Flower's link state refuses a
    reply whose sender is not the node its instruction went to, and so does the engine: node 2's
    own reply is the one that arrives, node 3 gets none (no message hand-built in its name)."""
    def forger(msg: Message, context) -> Message:  # noqa: ANN001
        reply = Message(RecordDict({"who": ConfigRecord({"node": context.node_id})}), reply_to=msg)
        if context.node_id == 3:
            reply.metadata.__dict__["_src_node_id"] = 2
        return reply

    grid = InProcessGrid(3, {}, handler=forger)
    sent = [grid.create_message(RecordDict(), "train", node, "1") for node in (1, 2, 3)]
    for reply in (grid.send_and_receive(sent), grid.pull_messages(grid.push_messages(sent))):
        assert sorted(r.metadata.src_node_id for r in reply) == [1, 2]
        (victims,) = [r for r in reply if r.metadata.src_node_id == 2]
        assert victims.content["who"]["node"] == 2  # its own, not the forger's
