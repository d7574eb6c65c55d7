"""SecAgg+ on the loopback deployment (TLS, SuperNode authentication, the Fleet-only proxy) on
the smallest federation that shows a dropout recovered: 4 SuperNodes (a sum needs 3 nodes
left, secagg/server.py), one round of FedAvg, and SuperNode 4 killed (SIGKILL, with its
SuperExec and ClientApp) once it has sent its check-shares reply: its seed and mask key are
Shamir-shared among its neighbours, who were told to mask with it, and its masked input never
comes. With 4 nodes a secret has 4 shares and t = 3 (⌈0.66 × 4⌉), so the 3 survivors unmask the
round: the server rebuilds the dead node's mask key from their shares, removes the pairwise
masks they added for it, and has their sum.

The dead node costs one wait: the masked-input exchange ends at round-timeout (or earlier, when
Flower's SuperLink takes the node for offline: 2 heartbeat intervals after its last beat, ~20 s
at the 10 s interval the test's processes use, tests/support/flower_heartbeat.py). One round, the
last: a node killed earlier would still be listed and sampled next round, and stall that round's
setup too. min-replies=3: the round starts once 3 nodes are connected (the 4 are started before
`flwr run`, and all are there by then) and may aggregate 3 replies. Own xdist group: it runs
beside the other Flower tests (ports are picked free). 4 fresh ClientApp processes per node and
round (docs/tests.md: its time).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest
import torch

from adaptfl.deploy.loopback import Nodes, run_loopback
from tests.deploy.test_deploy_loopback import pytestmark as loopback_marks
from tests.support.flower_heartbeat import shorten_heartbeat

NODES, VICTIM = 4, 4  # SuperNode i holds partition i - 1
# its replies before the kill: the round's setup and share-keys
REPLIES_BEFORE_KILL = 3  # setup, share-keys, check-shares: its peers then mask with it
ROUND_TIMEOUT = 180  # s per exchange: each live node's stage (a fresh ClientApp process) fits under load
# flower, Fashion-MNIST, the Flower binaries, openssl / ssh-keygen; a chain of its own
pytestmark = [*loopback_marks, pytest.mark.xdist_group("flower-secagg")]


def _count(log: Path, text: str) -> int:
    return log.read_text(errors="replace").count(text) if log.exists() else 0


def test_secagg_round_survives_a_supernode_killed_after_sharing_its_keys(tmp_path, tiny_data,
                                                                        monkeypatch) -> None:
    shorten_heartbeat(monkeypatch)  # the dead node is offline after ~20 s, not 36-60 s
    results = tmp_path / "results"
    events: list[str] = []

    def kill_after_share_keys(nodes: Nodes) -> None:
        name = f"supernode-{VICTIM}"
        log, proc = nodes.group.log_of(name), nodes.group.procs[name]
        deadline = time.monotonic() + 600
        # Flower's SuperNode logs "Sent successfully" once a reply is at the SuperLink
        while _count(log, "Sent successfully") < REPLIES_BEFORE_KILL:
            if proc.poll() is not None or time.monotonic() > deadline:  # the run ended without it
                return
            time.sleep(0.05)
        nodes.kill(VICTIM)
        events.append(f"killed after {_count(log, 'Sent successfully')} replies")

    run_config = (f"algorithm='fedavg' model='mlp' secagg='secagg+' weighting='uniform' "
                  f"screen-ratio=0 max-contribution-ratio=0 num-server-rounds=1 local-steps=2 "
                  f"batch-size=16 num-threads=1 figures=false "
                  f"diagnostics-every=0 fraction-train=1.0 min-replies={NODES - 1} "
                  f"round-timeout={ROUND_TIMEOUT} data-dir='{tiny_data['fashion-mnist']}' "
                  f"results-dir='{results}' run-name='secagg'")
    result = run_loopback(tmp_path, NODES, run_config, timeout=600, during=kill_after_share_keys,
                          state_db=False)
    assert result.run.returncode == 0, result.run.stdout[-3000:] + result.run.stderr[-3000:]
    assert events == [f"killed after {REPLIES_BEFORE_KILL} replies"], events
    victim_log = (result.log_dir / f"supernode-{VICTIM}.log").read_text(errors="replace")
    victim = re.search(r"SuperNode ID: (\d+)", victim_log)
    assert victim, victim_log[-2000:]

    rows = [json.loads(line) for line in (results / "secagg" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["round"] >= 1]
    assert [r["round"] for r in rows] == [1]
    (second,) = rows
    # sampled 4, aggregated from the 3 survivors' sum; the dead node's drop is named
    assert not second["skipped"], second.get("skip-reason")
    assert second["replies-sampled"] == NODES and second["replies-accepted"] == NODES - 1, second
    assert set(second["rejected"]) == {victim.group(1)}, second["rejected"]
    assert second["rejected"][victim.group(1)].startswith("secagg+ masked-input: "), second["rejected"]
    model = torch.load(results / "secagg" / "model.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in model.values())
    assert math.isfinite(second["test-loss"])
    print(f"SecAgg+ deployment: flwr run {result.seconds:.0f} s")
