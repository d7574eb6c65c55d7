"""A real deployment on 127.0.0.1: TLS, SuperNode authentication, process isolation, `flwr run`.

One deployment serves both tests (it takes about a minute): 2 rounds of FedACT on 2 registered
SuperNodes, and a third SuperNode whose key was never registered.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from adaptfl.algorithms.config import RunConfig
from adaptfl.deploy.loopback import LoopbackResult, run_loopback
from adaptfl.engine.inprocess import run_inprocess

from tests.conftest import needs_fashion_mnist

BINARIES = ("flwr", "flower-superlink", "flower-supernode", "flower-superexec")
MISSING = [b for b in BINARIES if shutil.which(b) is None]
SETTINGS = {"model": "mlp", "num-server-rounds": 2, "local-steps": 3, "batch-size": 32,
            "num-threads": 1, "seed": 7}

pytestmark = [
    pytest.mark.flower,
    needs_fashion_mnist,
    pytest.mark.skipif(bool(MISSING), reason=f"Flower binaries not on PATH: {MISSING} "
                                             "(pip install flwr==1.42.0)"),
    pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
                       reason="openssl and ssh-keygen are needed for the certificates and node keys"),
]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> LoopbackResult:
    workdir = tmp_path_factory.mktemp("loopback")
    pairs = " ".join(f"{k}={json.dumps(v)}" for k, v in SETTINGS.items())
    run_config = f"{pairs} algorithm='fedact' results-dir='{workdir / 'results'}' run-name='deploy'"
    return run_loopback(workdir, num_nodes=2, run_config=run_config, intruder=True, timeout=400)


def _rows(result: LoopbackResult) -> list[dict]:
    path = result.log_dir.parent / "results" / "deploy" / "metrics.jsonl"
    assert path.exists(), result.run.stdout[-3000:] + result.run.stderr[-3000:]
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_rounds_of_fedact_over_tls_with_node_auth(deployment, tmp_path) -> None:
    assert deployment.run.returncode == 0, deployment.run.stdout[-3000:] + deployment.run.stderr[-3000:]
    superlink_log = (deployment.log_dir / "superlink.log").read_text()
    assert "--insecure" not in " ".join(deployment.commands["superlink"])
    assert "--enable-supernode-auth" in deployment.commands["superlink"]
    assert "activate-node HTTP/1.1\" 200" in superlink_log  # the registered nodes joined
    rows = _rows(deployment)
    assert [(r["round"], r["replies-sampled"], r["replies-accepted"]) for r in rows] == [(1, 2, 2),
                                                                                        (2, 2, 2)]
    # The deployed run computes exactly what the in-process engine computes.
    cfg = RunConfig.from_flower({**SETTINGS,
                                 "results-dir": str(tmp_path), "run-name": "inproc"})
    expected = torch.load(run_inprocess(cfg, num_nodes=2) / "model.pt", weights_only=True)
    deployed = torch.load(deployment.log_dir.parent / "results" / "deploy" / "model.pt",
                          weights_only=True)
    for name in expected:
        assert torch.equal(deployed[name], expected[name]), name


def test_a_supernode_with_an_unregistered_key_is_refused(deployment) -> None:
    intruder_log = (deployment.log_dir / "supernode-intruder.log").read_text()
    assert deployment.intruder_exit not in (None, 0), "the unregistered SuperNode kept running"
    assert "Exit Code: 305" in intruder_log
    assert "activate-node HTTP/1.1\" 412" in (deployment.log_dir / "superlink.log").read_text()
    # ... and the run went on with the two enrolled nodes only.
    assert deployment.run.returncode == 0
    assert all(r["replies-sampled"] == 2 and r["replies-accepted"] == 2 for r in _rows(deployment))


def test_the_loopback_runs_the_commands_of_the_compose_demo(deployment) -> None:
    """Same programs and flags in the same order; only addresses and file paths differ."""
    from tests.test_deploy_compose import FLOWER_IMAGES, OWN_IMAGES, load, merge

    compose = merge(load("compose.yml"), load("with-tls.yml"))["services"]
    images = {**FLOWER_IMAGES, **OWN_IMAGES}
    for name, argv in deployment.commands.items():
        if name == "supernode-intruder":
            continue
        service = compose[name]
        ours = [a for a in argv if a.startswith("--")]
        theirs = [str(a) for a in service["command"] if str(a).startswith("--")]
        assert argv[0] == images[service["image"]] and ours == theirs, name
        if name.startswith("supernode-"):
            assert argv[argv.index("--node-config") + 1] == \
                service["command"][service["command"].index("--node-config") + 1]
    assert {n for n in compose if n.startswith(("supernode-", "superexec-"))} <= set(deployment.commands)
