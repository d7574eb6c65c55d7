"""A real deployment on 127.0.0.1: TLS, SuperNode authentication, process isolation, the Fleet
API proxy, `flwr run`.

One deployment serves the first tests (it takes about a minute): 2 rounds of FedACT on 2
registered SuperNodes, and a third SuperNode whose key was never registered. A second, smaller
one is attacked by someone holding only ca.crt, and its SuperNode runs only signed apps.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.deploy import netns
from adaptfl.deploy.loopback import LoopbackResult, generate_certs, run_loopback
from adaptfl.engine.inprocess import run_inprocess
from adaptfl.local_update import native
from tests.conftest import needs_fashion_mnist
from tests.deploy.test_deploy_paths import documented_certs

BINARIES = ("flwr", "flower-superlink", "flower-supernode", "flower-superexec")
MISSING = [b for b in BINARIES if shutil.which(b) is None]
SETTINGS = {"model": "mlp", "num-server-rounds": 2, "local-steps": 3, "batch-size": 32,
            "num-threads": 1, "seed": 7, "accept-small-rounds": True}  # two SuperNodes

pytestmark = [
    pytest.mark.flower,
    needs_fashion_mnist,
    pytest.mark.skipif(bool(MISSING), reason=f"Flower binaries not on PATH: {MISSING} "
                                             "(pip install flwr==1.42.0)"),
    pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
                       reason="openssl and ssh-keygen are needed for the certificates and node keys"),
]


# Each module fixture is one deployment; an xdist group per fixture keeps its tests on one worker,
# so `-n 2 --dist loadgroup` builds it once (spread over both, each worker built its own copy).
ON_DEPLOYMENT = pytest.mark.xdist_group("loopback-deployment")
ON_ATTACKED = pytest.mark.xdist_group("loopback-attacked")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> LoopbackResult:
    workdir = tmp_path_factory.mktemp("loopback")
    pairs = " ".join(f"{k}={json.dumps(v)}" for k, v in SETTINGS.items())
    run_config = (f"{pairs} algorithm='fedact' figures=false results-dir='{workdir / 'results'}' "
                  "run-name='deploy'")
    return run_loopback(workdir, num_nodes=2, run_config=run_config, intruder=True, timeout=400)


def _rows(result: LoopbackResult) -> list[dict]:
    path = result.log_dir.parent / "results" / "deploy" / "metrics.jsonl"
    assert path.exists(), result.run.stdout[-3000:] + result.run.stderr[-3000:]
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["round"] >= 1]


@ON_DEPLOYMENT
def test_two_rounds_of_fedact_over_tls_with_node_auth(deployment, tmp_path) -> None:
    assert deployment.run.returncode == 0, deployment.run.stdout[-3000:] + deployment.run.stderr[-3000:]
    superlink_log = (deployment.log_dir / "superlink.log").read_text()
    assert "--insecure" not in " ".join(deployment.commands["superlink"])
    assert "--enable-supernode-auth" in deployment.commands["superlink"]
    assert "activate-node HTTP/1.1\" 200" in superlink_log  # the registered nodes joined
    rows = _rows(deployment)
    assert [(r["round"], r["replies-sampled"], r["replies-accepted"]) for r in rows] == [(1, 2, 2),
                                                                                        (2, 2, 2)]
    # the ClientApps' step path is a simulation's here: FedACT's native loops wherever a C
    # compiler builds them (the compose image brings zig's: deploy/Dockerfile)
    assert {r["step-path"] for r in rows} == {"native" if native._compiler() else "eager"}
    # The deployed run computes exactly what the in-process engine computes.
    cfg = RunConfig.from_flower({**SETTINGS, "figures": False,
                                 "results-dir": str(tmp_path), "run-name": "inproc"})
    expected = torch.load(run_inprocess(cfg, num_nodes=2) / "model.pt", weights_only=True)
    deployed = torch.load(deployment.log_dir.parent / "results" / "deploy" / "model.pt",
                          weights_only=True)
    for name in expected:
        assert torch.equal(deployed[name], expected[name]), name


@ON_DEPLOYMENT
def test_a_supernode_with_an_unregistered_key_is_refused(deployment) -> None:
    intruder_log = (deployment.log_dir / "supernode-intruder.log").read_text()
    # Flower logs its code 305 but the process exits with status 1 (deploy/README.md says so).
    assert deployment.intruder_exit == 1, "the unregistered SuperNode kept running"
    assert "Exit Code: 305" in intruder_log
    assert "activate-node HTTP/1.1\" 412" in (deployment.log_dir / "superlink.log").read_text()
    # ... and the run went on with the two enrolled nodes only.
    assert deployment.run.returncode == 0
    assert all(r["replies-sampled"] == 2 and r["replies-accepted"] == 2 for r in _rows(deployment))


@ON_DEPLOYMENT
def test_the_loopback_runs_the_commands_of_the_compose_demo(deployment) -> None:
    """Same programs and flags in the same order; only addresses and file paths differ."""
    from tests.deploy.test_deploy_compose import merged, service_argv

    compose = merged("compose.yml", "with-tls.yml")["services"]
    for name, argv in deployment.commands.items():
        if name.endswith("-intruder"):
            continue
        theirs = service_argv(compose[name])
        ours = ["python", *argv[1:]] if name == "fleet-proxy" else argv
        assert ours[0] == theirs[0], name
        assert [a for a in ours if a.startswith("--")] == [a for a in theirs if a.startswith("--")], name
        if name.startswith("supernode-"):  # same partition, and the same loopback-only API
            for flag in ("--node-config", "--host"):
                assert ours[ours.index(flag) + 1] == theirs[theirs.index(flag) + 1], (name, flag)
    assert {n for n in compose if n.startswith(("supernode-", "superexec-", "fleet-"))} \
        <= set(deployment.commands)


@ON_DEPLOYMENT
def test_the_supernode_apis_for_their_superexecs_listen_on_loopback_only(deployment) -> None:
    for name, argv in deployment.commands.items():
        if name.startswith("supernode-"):
            assert argv[argv.index("--host") + 1] == "127.0.0.1", name
            assert "--superexec-auth-secret-file" in argv, name


def test_private_keys_and_secrets_are_0600_in_0700_folders(tmp_path) -> None:
    generate_certs(tmp_path, 2)
    private = [*tmp_path.glob("*/*.key"), *tmp_path.glob("*/*.secret")]
    assert sorted(str(p.relative_to(tmp_path)) for p in private) == sorted([
        "ca/ca.key", "superlink/server.key", "superlink/superexec.secret", "fleet-proxy/fleet-proxy.key",
        "superexec-serverapp/superexec.secret",
        *(f"supernode-{i}/{f}" for i in (1, 2) for f in ("supernode.key", "superexec.secret")),
        *(f"superexec-clientapp-{i}/superexec.secret" for i in (1, 2))])
    # The operators' folder: the CA certificate and the public keys the organisations sent.
    assert sorted(p.name for p in (tmp_path / "operator").iterdir()) == [
        "ca.crt", "supernode-1.pub", "supernode-2.pub"]
    assert (tmp_path / "operator" / "supernode-2.pub").read_bytes() == \
        (tmp_path / "supernode-2" / "supernode.pub").read_bytes()
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, path.parent
    for public in [tmp_path / "ca.crt", *tmp_path.glob("*/*.pem"), *tmp_path.glob("*/*.pub")]:
        assert stat.S_IMODE(public.stat().st_mode) == 0o644, public
    # its header lays out what it makes (tests/deploy/test_deploy_paths.py reads the layout from
    # there); ca/ca.srl is openssl's serial counter
    made = {str(p) for p in tmp_path.rglob("*")}
    assert made - documented_certs(str(tmp_path), 2) == {str(tmp_path / "ca" / "ca.srl")}
    assert documented_certs(str(tmp_path), 2) <= made
    # The CA key exists once, in the folder no process mounts.
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("ca.key")] == [Path("ca") / "ca.key"]


@pytest.fixture(scope="module")
def attacked(tmp_path_factory) -> LoopbackResult:
    """One SuperNode that trusts only the federation's Ed25519 key; an attacker with ca.crt."""
    workdir = tmp_path_factory.mktemp("attacked")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(workdir / "federation")],
                   check=True, capture_output=True)
    trusted = workdir / "trusted-entities.yaml"
    trusted.write_text(f"fpk_federation: '{(workdir / 'federation.pub').read_text().strip()}'\n")
    run_config = (f"model='mlp' num-server-rounds=1 local-steps=1 batch-size=16 min-replies=1 "
                  "accept-small-rounds=true "
                  f"results-dir='{workdir / 'results'}' run-name='unsigned'")
    return run_loopback(workdir, num_nodes=1, run_config=run_config, attacker=True,
                        trusted_entities=trusted, timeout=300)


@ON_ATTACKED
@pytest.mark.parametrize("attempt,path", [("register", "/v1/control/register-node"),
                                          ("ls", "/v1/control/list-runs"),
                                          ("run", "/v1/control/start-run")])
def test_someone_with_only_ca_crt_can_neither_enrol_nor_list_nor_run(attacked, attempt, path) -> None:
    tried = attacked.attacks[attempt]
    assert tried.returncode != 0, tried.stdout[-2000:]
    assert f"POST {path} is not part of the Fleet API" in (attacked.log_dir / "fleet-proxy.log").read_text()
    superlink_log = (attacked.log_dir / "superlink.log").read_text()
    assert superlink_log.count("/v1/control/register-node") == 1  # the operator's, not the attacker's


@ON_ATTACKED
def test_a_supernode_with_trusted_entities_refuses_an_unsigned_app(attacked) -> None:
    node_log = (attacked.log_dir / "supernode-1.log").read_text()
    assert "The FAB could not be verified" in node_log
    rows = [r for r in map(json.loads, (attacked.log_dir.parent / "results" / "unsigned" /
                                        "metrics.jsonl").read_text().splitlines()) if r["round"] >= 1]
    assert rows and all(r["replies-accepted"] == 0 for r in rows)
    assert "flwr-clientapp" not in (attacked.log_dir / "superexec-clientapp-1.log").read_text()


@ON_ATTACKED
@pytest.mark.parametrize("attempt", ["register", "ls", "run"])
def test_a_local_process_outside_the_namespace_cannot_reach_the_superlinks_port(attacked, attempt) -> None:
    """Issue 21 §5: on the host's 127.0.0.1, any local process holding ca.crt reached the
    SuperLink's own port and could enrol a key, list runs and `flwr run` its own app. Where the
    OS allows it, the kit puts the SuperLink side in a network namespace: the same attempts from
    outside it find nothing listening, while the operator's, inside, ran the app."""
    mode, why = netns.choose_mode()
    if not mode:  # the documented fallback: said in one line, never silently
        proxy = attacked.commands["fleet-proxy"]
        address = proxy[proxy.index("--upstream") + 1]  # the SuperLink's
        assert attacked.isolation == ""
        assert attacked.warning == netns.FALLBACK.format(why=why, address=address)
        return
    assert attacked.isolation == mode and attacked.warning == ""
    tried = attacked.attacks[f"local-{attempt}"]
    assert tried.returncode != 0, tried.stdout[-2000:]
    assert "Connection to the SuperLink is unavailable" in tried.stdout + tried.stderr, tried.stdout[-2000:]
    # before the operator's own run: after it, the operator asks for its status (`flwr ls`,
    # deploy/run_status.py); the attacks all come before it
    superlink_log = (attacked.log_dir / "superlink.log").read_text()
    before_the_run = superlink_log.split("/v1/control/start-run")[0]
    assert "/v1/control/list-runs" not in before_the_run  # the attacker's `ls` never got there
    assert superlink_log.count("/v1/control/start-run") == 1  # the operator's run only
