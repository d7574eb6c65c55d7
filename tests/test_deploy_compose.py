"""The compose files, checked without a Docker engine: they parse, name only Flower 1.42 images
and flags, and run exactly the commands of deploy/commands.py (which deploy/loopback.py runs)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import flwr
import pytest
from adaptfl.deploy import commands

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency: pip install -e '.[test]'")

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
FLOWER_IMAGES = {"flwr/superlink:1.42.0": "flower-superlink", "flwr/supernode:1.42.0": "flower-supernode"}
OWN_IMAGES = {"adaptfl-superexec:0.1.0": "flower-superexec",
              "adaptfl-superexec:0.1.0-cuda": "flower-superexec"}
BASE_IMAGES = {"Dockerfile": "flwr/superexec:1.42.0", "certs.Dockerfile": "ubuntu:24.04"}
NUM_NODES = 2
CERTS = "/app/certificates"
TLS = commands.Tls(ca_cert=f"{CERTS}/ca.crt", server_cert=f"{CERTS}/server.pem",
                   server_key=f"{CERTS}/server.key")


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


def expected_commands(tls: commands.Tls | None) -> dict[str, list[str]]:
    """deploy/commands.py with the compose network's names and the containers' paths."""
    argv = {
        "superlink": commands.superlink("0.0.0.0", commands.SUPERLINK_PORT, "/app/state/state.db", tls),
        "superexec-serverapp": commands.superexec_serverapp("superlink:8000", tls),
    }
    for i in range(1, NUM_NODES + 1):
        key = f"{CERTS}/keys/supernode-{i}" if tls else ""
        argv[f"supernode-{i}"] = commands.supernode("superlink:8000", "0.0.0.0",
                                                    commands.SUPERNODE_RUNTIME_PORT, i - 1,
                                                    NUM_NODES, tls, private_key=key)
        argv[f"superexec-clientapp-{i}"] = commands.superexec_clientapp(f"supernode-{i}:9094")
    return argv


@pytest.mark.parametrize("files,tls", [(["compose.yml"], None),
                                       (["compose.yml", "with-tls.yml"], TLS),
                                       (["compose.yml", "with-tls.yml", "with-cuda.yml"], TLS)])
def test_service_commands_are_those_of_deploy_commands(files, tls) -> None:
    merged = load(files[0])
    for overlay in files[1:]:
        merged = merge(merged, load(overlay))
    for name, argv in expected_commands(tls).items():
        service = merged["services"][name]
        program = {**FLOWER_IMAGES, **OWN_IMAGES}[service["image"]]
        assert [program, *map(str, service["command"])] == argv, name


def test_images_are_flower_1_42_or_built_from_it() -> None:
    assert flwr.__version__ == "1.42.0"  # the tag in the files must be the Flower we run
    for name in ("compose.yml", "with-tls.yml", "with-cuda.yml"):
        for service_name, service in load(name)["services"].items():
            if "image" in service:
                assert service["image"] in {**FLOWER_IMAGES, **OWN_IMAGES}, (name, service_name)
            if "build" in service:
                dockerfile = Path(service["build"]["dockerfile"]).name
                assert dockerfile in BASE_IMAGES, (name, service_name)
    for dockerfile, base in BASE_IMAGES.items():
        froms = re.findall(r"^FROM\s+(\S+)", (DEPLOY / dockerfile).read_text(), re.M)
        assert froms == [base], dockerfile
    # Runtime installation stays off: the image has the dependencies, the SuperLink says so.
    superlink = load("compose.yml")["services"]["superlink"]["command"]
    assert "--disable-runtime-dependency-installation" in superlink


@cache
def _help_flags(program: str) -> frozenset[str]:
    done = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=120, check=False)
    return frozenset(re.findall(r"(--[a-z][a-z0-9-]*)", done.stdout + done.stderr))


@pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower CLIs not installed")
def test_every_flag_exists_in_the_flower_1_42_clis() -> None:
    for tls in (None, TLS):
        for name, argv in expected_commands(tls).items():
            program, *args = argv
            unknown = {a for a in args if a.startswith("--")} - _help_flags(program)
            assert not unknown, (name, unknown)
    assert "--not-a-flower-flag" not in _help_flags("flower-superlink")


def test_gen_certs_makes_a_key_for_every_supernode_and_the_cuda_variant_reserves_gpus() -> None:
    tls = merge(load("compose.yml"), load("with-tls.yml"))["services"]
    script, _, count, *_ = tls["gen-certs"]["command"]
    assert script.endswith("generate-certs.sh") and int(count) == NUM_NODES
    assert tls["superlink"]["depends_on"]["gen-certs"]["condition"] == "service_completed_successfully"
    cuda = load("with-cuda.yml")["services"]
    for i in range(1, NUM_NODES + 1):
        service = cuda[f"superexec-clientapp-{i}"]
        assert service["build"]["args"]["TORCH_INDEX"].endswith("/cu128")
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
