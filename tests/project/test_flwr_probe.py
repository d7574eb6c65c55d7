"""benchmarks/bench_scale.py --probe: the probe times a ClientApp call in a Ray actor's process
(benchmarks/flwr_probe/sitecustomize.py) and the report splits a message's time by those events
(benchmarks/probe_report.py); docs/scale.md's per-message figures come from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import probe_report

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "benchmarks" / "flwr_probe"

ACTOR = """
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0  # as Flower's server sets
app = ClientApp()
@app.train()
def train(msg, context):
    return Message(RecordDict(), reply_to=msg)
msg = Message(RecordDict(), dst_node_id=7, message_type="train")
msg.metadata.__dict__["_message_id"] = "m1"
app(msg, Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={}))
"""


def test_the_probe_times_a_clientapp_call_in_a_process_named_like_rays_worker(tmp_path: Path) -> None:
    script = tmp_path / "default_worker.py"  # what Ray's actor processes run
    script.write_text(ACTOR)
    out = tmp_path / "probe"
    out.mkdir()
    env = {**os.environ, "ADAPTFL_PROBE_DIR": str(out),
           "PYTHONPATH": os.pathsep.join([str(PROBE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found = probe_report.events(out)
    assert [(e["at"], e["node"], e["type"]) for e in found] == [("app", 7, "train")]
    assert found[0]["t1"] >= found[0]["t0"]
    other = tmp_path / "worker.py"  # any other process: untouched
    other.write_text(ACTOR)
    subprocess.run([sys.executable, str(other)], env={**env, "ADAPTFL_PROBE_DIR": str(tmp_path / "none")},
                   check=True, timeout=120)
    assert not (tmp_path / "none").exists()


def _round(start: float, nodes: list[int]) -> list[dict]:
    """Two messages submitted at `start`: each 0.1 s to the actor, 0.5 s in the app, 0.2 s back."""
    out = []
    for node in nodes:
        out.append({"at": "sim", "node": node, "group": "", "type": "train", "t0": start, "t1": start + 0.8,
                    "message-bytes": 742_000, "context-bytes": 1_000})
        out.append({"at": "app", "node": node, "group": "", "type": "train", "t0": start + 0.1,
                    "t1": start + 0.6})
    return out


def test_the_report_splits_a_message_into_dispatch_app_and_return_and_rounds_on_one_clock() -> None:
    events = [*_round(0.0, [1, 2]), *_round(3.0, [1, 2]), *_round(5.0, [2, 1]), *_round(8.0, [1, 2]),
              {"at": "context-get", "t0": 0.0, "t1": 0.004},
              *({"at": "evaluate", "t0": t, "t1": t + 1.0} for t in (-1.0, 1.0, 3.9, 6.0)),
              *({"at": "aggregate", "t0": t, "t1": t + d} for t, d in ((0.8, 9.0), (3.8, 0.25), (5.8, 0.25)))]
    found = probe_report.breakdown(events, sampled=2)
    assert found["message-ms"] == pytest.approx(800)
    assert found["app-ms"] == pytest.approx(500)
    assert found["dispatch-ms"] == pytest.approx(100)
    assert found["return-ms"] == pytest.approx(200)
    assert found["context-get-ms"] == pytest.approx(4)
    assert found["message-kb"] == pytest.approx(742) and found["context-kb"] == pytest.approx(1)
    assert found["round-s"] == pytest.approx(2.5)  # rounds 2 and 3: 3 -> 5, 5 -> 8
    assert found["clients-s"] == pytest.approx(0.8)
    assert found["server-s"] == pytest.approx(2.5 - 0.8)
    assert found["evaluate-s"] == pytest.approx(1.0) and found["aggregate-s"] == pytest.approx(0.25)
    assert found["other-s"] != found["other-s"]  # no configure event: not known (NaN)


def test_the_report_refuses_too_few_rounds() -> None:
    with pytest.raises(ValueError, match="fewer than 3 rounds of 2"):
        probe_report.breakdown([*_round(0.0, [1, 2]), *_round(3.0, [1, 2])], sampled=2)


def test_events_reads_one_json_object_a_line(tmp_path: Path) -> None:
    (tmp_path / "1.jsonl").write_text(json.dumps({"at": "app"}) + "\n\n")
    assert probe_report.events(tmp_path) == [{"at": "app"}]
