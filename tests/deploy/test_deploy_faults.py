"""SuperNodes leaving and coming back mid-run on the loopback deployment (TLS, node
authentication, the Fleet proxy): FedACT with durable client state (`local-state='persist'`:
each client keeps its AdamW moments, in `context.state` and on disk) on the smallest federation
that shows each fault: 4 SuperNodes, of which 3 and 4 die when round 1 ends (so in round 2) and 3
comes back when round 2 ends (in round 3, 4 or 5); 4 stays away, 1 and 2 never fail. The run goes on
within min-replies, each round's row says who answered and who did not, and the restarted node
continues from its state on disk. Flower takes a dead node for offline 2 heartbeat intervals
after its last beat: 36-60 s at Flower 1.42's fixed 30 s, ~20 s here, where the test's processes
beat at the 10 s least the SuperLink accepts (tests/support/flower_heartbeat.py); round 3 is
sampled the moment round 2 ends, before the restarted SuperNode has reconnected, and on 4 nodes
a round is short: 5 rounds leave it time to come back. (16
SuperNodes, their memory and time: docs/scale.md.)"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from adaptfl.deploy.loopback import Nodes, run_loopback
from tests.deploy.test_deploy_loopback import BINARIES
from tests.support.flower_heartbeat import shorten_heartbeat

NODES, ROUNDS = 4, 5
KILLED, RESTARTED = (3, 4), (3,)  # SuperNode i holds partition i - 1
MIN_REPLIES = NODES - len(KILLED)  # round 2 has exactly enough
pytestmark = [
    pytest.mark.flower,
    pytest.mark.slow,
    # Its own xdist group (its own ports and folders): ~3 min, most of it Flower's heartbeat wait
    pytest.mark.xdist_group("flower-supernode-faults"),
    pytest.mark.skipif(any(shutil.which(b) is None for b in BINARIES), reason="Flower binaries needed"),
    pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
                       reason="openssl and ssh-keygen are needed for the certificates and node keys"),
]


def _rounds_done(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return max((json.loads(line)["round"] for line in metrics.read_text().splitlines() if line.strip()),
               default=0)


def test_supernodes_killed_and_restarted_mid_run(tmp_path, tiny_data, monkeypatch) -> None:
    shorten_heartbeat(monkeypatch)  # the dead nodes are offline after ~20 s, not 36-60 s
    metrics = tmp_path / "results" / "faults" / "metrics.jsonl"
    events: list[str] = []

    def faults(nodes: Nodes) -> None:
        deadline = time.monotonic() + 600
        while _rounds_done(metrics) < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        for i in KILLED:
            nodes.kill(i)
        events.append("killed")
        while _rounds_done(metrics) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        for i in RESTARTED:
            nodes.restart(i)
        events.append("restarted")

    # client-state-memory=true: the nodes that stayed up read their state from memory (1), so a
    # restarted node's read from the disk (2) is seen as different
    run_config = (f"algorithm='fedact' local-state='persist' bias-correction='local' model='mlp' "
                  f"client-state-memory=true "
                  f"partitioning='iid' num-server-rounds={ROUNDS} local-steps=2 batch-size=16 "
                  f"num-threads=1 figures=false diagnostics-every=0 min-replies={MIN_REPLIES} "
                  f"round-timeout=300 "
                  f"data-dir='{tiny_data['fashion-mnist']}' results-dir='{tmp_path / 'results'}' "
                  f"run-name='faults' client-state-dir='{tmp_path / 'state'}'")
    result = run_loopback(tmp_path, NODES, run_config, timeout=1200, during=faults,
                          state_db=False)
    assert result.run.returncode == 0, result.run.stdout[-3000:] + result.run.stderr[-3000:]
    assert events == ["killed", "restarted"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()][1:]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    assert all(not r["skipped"] for r in rows)  # 2 replies >= min-replies every round
    answered = [set(r["clients"]) for r in rows]  # partition ids that replied
    everyone = {str(p) for p in range(NODES)}
    gone, back = {str(i - 1) for i in KILLED}, {str(i - 1) for i in RESTARTED}
    assert answered[0] == everyone
    assert answered[1] == everyone - gone, rows[1]
    # who did not answer is recorded: 2 of round 1's node ids, as missing (no reply within
    # round-timeout) or rejected (Flower's error reply for a node gone offline)
    silent = {str(n) for n in rows[1]["missing"]} | set(rows[1]["rejected"])
    assert len(silent) == len(KILLED) and silent <= set(rows[0]["latency"]), rows[1]
    assert rows[1]["replies-sampled"] - rows[1]["replies-accepted"] == len(KILLED)
    assert not (gone - back) & set().union(*answered[2:])  # 4 stayed away
    assert back <= set().union(*answered[2:]) and all(everyone - gone <= a for a in answered[2:])
    sources = [{p: c["local-state-source"] for p, c in r["clients"].items()} for r in rows]
    assert set(sources[0].values()) == {0}  # nobody had kept a state before round 1
    assert set(sources[1].values()) == {1}  # then Flower's context.state held it
    for p in back:  # a restarted node's first reply: its AdamW state came from the disk
        first = next(s[p] for s in sources[2:] if p in s)
        assert first == 2, sources[2:]
        # ... and it wrote no version for round 2 (it was dead): the one it read was round 1's
        rounds = {f.name for f in tmp_path.glob(f"state/run-*/partition-{p}/local-state.r*.pt")}
        assert rounds and "local-state.r2.pt" not in rounds, rounds
    assert result.peak_rss_mb["supernode-1"] > 0
