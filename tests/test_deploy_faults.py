"""SuperNodes leaving and coming back mid-run on the loopback deployment (TLS, node
authentication, the Fleet proxy): SCAFFOLD (durable client state) on 4 SuperNodes; 2 die after
round 1, one of them comes back after round 2. The run goes on within min-replies, each round's
row says who answered, and the restarted node continues from its state on disk.
(docs/scale.md has the 16-SuperNode version: benchmarks/bench_supernodes.py.)"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from adaptfl.deploy.loopback import Nodes, run_loopback

from tests.test_deploy_loopback import BINARIES

NODES, ROUNDS = 4, 4
pytestmark = [
    pytest.mark.flower,
    pytest.mark.slow,
    pytest.mark.skipif(any(shutil.which(b) is None for b in BINARIES), reason="Flower binaries needed"),
    pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
                       reason="openssl and ssh-keygen are needed for the certificates and node keys"),
]


def _rounds_done(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return max((json.loads(line)["round"] for line in metrics.read_text().splitlines() if line.strip()),
               default=0)


def test_supernodes_killed_and_restarted_mid_run(tmp_path, tiny_data) -> None:
    metrics = tmp_path / "results" / "faults" / "metrics.jsonl"
    events: list[str] = []

    def faults(nodes: Nodes) -> None:
        deadline = time.monotonic() + 400
        while _rounds_done(metrics) < 1 and time.monotonic() < deadline:
            time.sleep(0.3)
        nodes.kill(3)
        nodes.kill(4)
        events.append("killed 3, 4")
        while _rounds_done(metrics) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        nodes.restart(3)
        events.append("restarted 3")

    run_config = (f"algorithm='scaffold' model='mlp' partitioning='iid' num-server-rounds={ROUNDS} "
                  f"local-steps=2 batch-size=16 num-threads=1 diagnostics-every=0 min-replies=2 "
                  f"round-timeout=90 data-dir='{tiny_data['fashion-mnist']}' "
                  f"results-dir='{tmp_path / 'results'}' run-name='faults' "
                  f"client-state-dir='{tmp_path / 'state'}'")
    result = run_loopback(tmp_path, NODES, run_config, timeout=900, during=faults)
    assert result.run.returncode == 0, result.run.stdout[-3000:] + result.run.stderr[-3000:]
    assert events == ["killed 3, 4", "restarted 3"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()][1:]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    answered = [set(r.get("clients", {})) for r in rows]  # partition ids that replied
    assert answered[0] == {"0", "1", "2", "3"}
    assert answered[1] == {"0", "1"}, rows[1]  # nodes 3 and 4 (partitions 2, 3) gone
    sampled_but_silent = rows[1]["replies-sampled"] - rows[1]["replies-accepted"]
    assert sampled_but_silent == len(rows[1]["missing"]) + len(rows[1]["rejected"])  # recorded
    assert all(not r["skipped"] for r in rows)  # 2 replies >= min-replies every round
    # node 3 came back (same key, same node id, same partition 2): its c_i from the disk
    back = [r["clients"]["2"] for r in rows[2:] if "2" in r["clients"]]
    assert back and back[0]["client-state"] == 2, rows[2:]
    assert "3" not in set().union(*answered[1:])  # node 4 stayed away
    assert result.peak_rss_mb["supernode-1"] > 0
