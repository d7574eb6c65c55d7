"""The compose files, checked without a Docker engine: they parse, name only Flower 1.42 images
and flags, run exactly the commands of deploy/commands.py (which deploy/loopback.py runs), and
expose and mount only what each service needs."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import flwr
import pytest

from adaptfl.deploy import commands
from adaptfl.deploy.stand_in import FLOWER_TAG

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency: pip install -e '.[test]'")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
FLOWER_IMAGES = {f"flwr/superlink:{FLOWER_TAG}": "flower-superlink",
                 f"flwr/supernode:{FLOWER_TAG}": "flower-supernode",
                 f"flwr/superexec:{FLOWER_TAG}": "flower-superexec"}  # the operator's `flwr`
OWN_IMAGES = {"adaptfl-superexec:0.2.0": "flower-superexec",
              "adaptfl-superexec:0.2.0-cuda": "flower-superexec"}
NUM_NODES = 2
CERTS = "/app/certificates"
TLS = commands.Tls(ca_cert=f"{CERTS}/ca.crt", server_cert=f"{CERTS}/server.pem",
                   server_key=f"{CERTS}/server.key")
PROXY_TLS = commands.Tls(ca_cert=f"{CERTS}/ca.crt", server_cert=f"{CERTS}/fleet-proxy.pem",
                         server_key=f"{CERTS}/fleet-proxy.key")
SECRET = f"{CERTS}/superexec.secret"


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def merge(base: dict, overlay: dict) -> dict:
    """Compose's merge rules for what these files use: `command` replaced, volumes by target."""
    out = copy.deepcopy(base)
    for name, service in overlay.get("services", {}).items():
        target = out["services"].setdefault(name, {})
        for key, value in service.items():
            if key == "volumes":
                by_target = {v.split(":")[1]: v for v in target.get("volumes", []) + value}
                target["volumes"] = list(by_target.values())
            elif key == "depends_on" and isinstance(target.get(key), dict) and isinstance(value, dict):
                target[key] = {**target[key], **value}
            else:
                target[key] = copy.deepcopy(value)
    return out


def merged(*files: str) -> dict:
    out = load(files[0])
    for overlay in files[1:]:
        out = merge(out, load(overlay))
    return out


def expected_commands(tls: commands.Tls | None) -> dict[str, list[str]]:
    """deploy/commands.py with the compose network's names and the containers' paths."""
    secret = SECRET if tls else ""
    argv = {
        "superlink": commands.superlink("0.0.0.0", commands.SUPERLINK_PORT, "/app/state/state.db", tls,
                                        secret_file=secret),
        "fleet-proxy": commands.fleet_proxy("0.0.0.0:9092", "superlink:8000", PROXY_TLS if tls else None),
        "superexec-serverapp": commands.superexec_serverapp(
            "superlink:8000", commands.Tls(ca_cert=TLS.ca_cert) if tls else None, secret_file=secret),
    }
    for i in range(1, NUM_NODES + 1):
        key = f"{CERTS}/supernode.key" if tls else ""
        argv[f"supernode-{i}"] = commands.supernode(
            "fleet-proxy:9092", "127.0.0.1", commands.SUPERNODE_RUNTIME_PORT, i - 1, NUM_NODES,
            commands.Tls(ca_cert=TLS.ca_cert) if tls else None, private_key=key, secret_file=secret)
        argv[f"superexec-clientapp-{i}"] = commands.superexec_clientapp("127.0.0.1:9094", secret_file=secret)
    return argv


def service_argv(service: dict) -> list[str]:
    program = service.get("entrypoint") or [{**FLOWER_IMAGES, **OWN_IMAGES}[service["image"]]]
    return [*program, *map(str, service["command"])]


@pytest.mark.parametrize("files,tls", [(["compose.yml"], None),
                                       (["compose.yml", "with-tls.yml"], TLS),
                                       (["compose.yml", "with-tls.yml", "with-cuda.yml"], TLS)])
def test_service_commands_are_those_of_deploy_commands(files, tls) -> None:
    services = merged(*files)["services"]
    for name, argv in expected_commands(tls).items():
        assert service_argv(services[name]) == argv, name


def test_images_are_flower_1_42_or_built_from_it() -> None:
    assert flwr.__version__ == "1.42.0"  # the tag in the files must be the Flower we run
    for name in ("compose.yml", "with-tls.yml", "with-cuda.yml"):
        for service_name, service in load(name)["services"].items():
            if "image" in service:
                assert service["image"] in {**FLOWER_IMAGES, **OWN_IMAGES}, (name, service_name)
            if "build" in service:
                assert service["build"]["dockerfile"] == "deploy/Dockerfile", (name, service_name)
    froms = re.findall(r"^FROM\s+(\S+)", (DEPLOY / "Dockerfile").read_text(), re.M)
    assert froms == ["flwr/superexec:${FLWR_TAG}"]
    # Runtime installation stays off: the image has the dependencies, the SuperLink says so.
    superlink = load("compose.yml")["services"]["superlink"]["command"]
    assert "--disable-runtime-dependency-installation" in superlink


@cache
def _help_flags(*program: str) -> frozenset[str]:
    done = subprocess.run([*program, "--help"], capture_output=True, text=True, timeout=120, check=False)
    return frozenset(re.findall(r"(--[a-z][a-z0-9-]*)", done.stdout + done.stderr))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower CLIs not installed")
def test_every_flag_exists_in_the_flower_1_42_clis() -> None:
    for tls in (None, TLS):
        for name, argv in expected_commands(tls).items():
            program, args = ([sys.executable, *argv[1:3]], argv[3:]) if argv[0] == "python" \
                else ([argv[0]], argv[1:])
            unknown = {a for a in args if a.startswith("--")} - _help_flags(*program)
            assert not unknown, (name, unknown)
    assert "--not-a-flower-flag" not in _help_flags("flower-superlink")


def _published(service: dict) -> list[str]:
    return [str(p) for p in service.get("ports", [])]


def _container_port(port: object) -> str:
    """The container side of a `ports` entry: "8000", "IP:HOST:8000/tcp" or {target: 8000}."""
    if isinstance(port, dict):
        return str(port["target"])
    return str(port).split("/")[0].rsplit(":", 1)[-1]


@pytest.mark.parametrize("files", [["compose.yml"], ["compose.yml", "with-tls.yml"],
                                   ["compose.yml", "with-tls.yml", "with-cuda.yml"]])
def test_only_the_fleet_proxy_is_published_and_the_superlinks_port_nowhere(files) -> None:
    """Issue 21 §5: the SuperLink's port serves the Control API (`flwr run` runs code on every
    SuperNode), so no host process may reach it: not published, not even on 127.0.0.1."""
    services = merged(*files)["services"]
    published = {name: _published(s) for name, s in services.items() if _published(s)}
    assert published == {"fleet-proxy": ["9092:9092"]}
    superlink = services["superlink"]
    assert "ports" not in superlink and "network_mode" not in superlink  # no host networking
    assert not [p for s in services.values() for p in s.get("ports", [])
                if _container_port(p) == str(commands.SUPERLINK_PORT)]
    # Nor through the container's address: `server` gives the host no address (so no route to
    # it) and lets nothing out. compose-check measures both from the host.
    server = load("compose.yml")["networks"]["server"]
    assert server["internal"] is True
    assert server["driver_opts"] == {"com.docker.network.bridge.inhibit_ipv4": "true"}
    # SuperNodes reach the SuperLink only through the proxy: they share no network with it.
    assert superlink["networks"] == ["server"]
    assert sorted(services["fleet-proxy"]["networks"]) == ["fleet", "server"]
    for i in range(1, NUM_NODES + 1):
        assert services[f"supernode-{i}"]["networks"] == ["fleet"]
        argv = service_argv(services[f"supernode-{i}"])
        assert argv[argv.index("--host") + 1] == "127.0.0.1"  # its SuperExec API: loopback only
        clientapp = services[f"superexec-clientapp-{i}"]
        assert clientapp["network_mode"] == f"service:supernode-{i}" and "ports" not in clientapp


def test_operators_reach_the_control_api_from_the_operator_container_only() -> None:
    """`flwr` in the `operator` service, on the `server` network, on demand (a profile); its
    connections name superlink:8000, and compose-check runs every `flwr` command through it."""
    services = merged("compose.yml", "with-tls.yml")["services"]
    operator = services["operator"]
    assert operator["profiles"] == ["operator"] and operator["networks"] == ["server"]
    assert operator["entrypoint"] == ["flwr"] and "ports" not in operator
    assert "./operator.toml:/app/.flwr/config.toml:ro" in operator["volumes"]
    assert "..:/app/project:ro" in operator["volumes"]
    connections = tomllib.loads((DEPLOY / "operator.toml").read_text())["superlink"]
    assert {name: c["address"] for name, c in connections.items()} == {
        "adaptfl-demo": f"superlink:{commands.SUPERLINK_PORT}",
        "adaptfl-demo-tls": f"superlink:{commands.SUPERLINK_PORT}"}
    assert connections["adaptfl-demo"]["insecure"] is True
    assert connections["adaptfl-demo-tls"]["root-certificates"] == f"{CERTS}/ca.crt"
    from adaptfl.deploy import compose_check

    demo = [c for cmds in compose_check.PHASES.values() for c in cmds]
    via_operator = [c for c in demo if "--profile operator run --rm -T operator " in c]
    assert len(via_operator) == 6  # 2 waits (`ls`), 2 `supernode register`, 2 `run`
    assert not [c for c in demo if re.search(r"(^|[;&|(]\s*)flwr\s", c)]  # no `flwr` on the host


def test_each_container_mounts_only_its_own_certificate_folder() -> None:
    services = merged("compose.yml", "with-tls.yml", "with-cuda.yml")["services"]
    mounted = {}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source, target, *mode = volume.split(":")
            if source.startswith("./certs"):
                assert mode == ["ro"] and target == CERTS, (name, volume)
                mounted[name] = source
    expected = {"superlink", "fleet-proxy", "superexec-serverapp", "operator",
                *(f"supernode-{i}" for i in range(1, NUM_NODES + 1)),
                *(f"superexec-clientapp-{i}" for i in range(1, NUM_NODES + 1))}
    assert mounted == {name: f"./certs/{name}" for name in expected}
    yaml_lines = [line for line in (DEPLOY / "with-tls.yml").read_text().splitlines()
                  if not line.lstrip().startswith("#")]
    assert not [line for line in yaml_lines if "ca.key" in line or "certs/ca/" in line]


def test_the_cuda_variant_reserves_gpus_and_builds_from_its_own_wheelhouse() -> None:
    cuda = load("with-cuda.yml")["services"]
    for i in range(1, NUM_NODES + 1):
        service = cuda[f"superexec-clientapp-{i}"]
        assert service["build"]["args"]["WHEELHOUSE"] == "deploy/wheelhouse-cuda"
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_no_flower_process_calls_home_or_installs_at_run_time() -> None:
    services = merged("compose.yml", "with-tls.yml", "with-cuda.yml")["services"]
    for name, service in services.items():
        if name == "volume-init":
            continue
        assert service["environment"] == {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
                                          "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}, name


def test_no_flower_process_runs_as_root_in_the_images() -> None:
    """Issue 21 §5: a ClientApp's code must not run as root. Flower's images run as their user
    `app`; adaptfl's image switches to root for the pip install only, and no service but the
    one-shot volume chown overrides the user."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.M)
    assert users and users[-1] == "app", users
    # The stand-ins for Flower's images too: every target builds on `base`, which ends as `app`.
    stand_in = (DEPLOY / "flower-stand-in.Dockerfile").read_text()
    stages = re.split(r"^FROM\s+", stand_in, flags=re.M)[1:]
    assert [re.findall(r"^USER\s+(\S+)", stage, flags=re.M) for stage in stages][0][-1] == "app"
    assert all(stage.startswith("base AS ") and "USER" not in stage for stage in stages[1:])
    assert len(stages) == 4  # base, superlink, supernode, superexec
    services = merged("compose.yml", "with-tls.yml", "with-cuda.yml")["services"]
    as_root = sorted(name for name, s in services.items() if str(s.get("user", "")).split(":")[0]
                     in ("root", "0"))
    assert as_root == ["volume-init"]
    assert services["volume-init"]["network_mode"] == "none"  # and it runs chown, nothing else
    assert services["volume-init"]["entrypoint"][0] == "chown"
