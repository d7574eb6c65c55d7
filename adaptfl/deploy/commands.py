"""The command line of every process in an adaptfl deployment, in one place.

adaptfl/deploy/loopback.py runs these on 127.0.0.1; deploy/compose.yml (+ with-tls.yml) writes the
same flags as container commands, and tests/deploy/test_deploy_compose.py checks that they agree.
Each function returns argv without the program name's path: `[program, *flags]`.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPERLINK_PORT = 8000  # Control, Fleet and Runtime APIs share it: loopback/operators only
FLEET_PROXY_PORT = 9092  # the only port to open: Fleet API paths only (adaptfl/deploy/fleet_proxy.py)
SUPERNODE_RUNTIME_PORT = 9094  # each SuperNode's API for its own SuperExec, on loopback


@dataclass(frozen=True)
class Tls:
    """Paths as seen by the process (inside a container, or on this machine)."""

    ca_cert: str  # the CA that signed the SuperLink's certificate
    server_cert: str = ""  # SuperLink only
    server_key: str = ""  # SuperLink only


def _secret(secret_file: str) -> list[str]:
    """The shared secret that SuperExec and the API it dials sign each request with (HMAC)."""
    return ["--superexec-auth-secret-file", secret_file] if secret_file else []


def superlink(host: str, port: int, database: str, tls: Tls | None, secret_file: str = "") -> list[str]:
    """With TLS, SuperNode authentication is on: only registered keys may join.

    Its port serves the Control API too: expose it to operators only, and only
    `fleet_proxy` to SuperNodes. With `secret_file`, its Runtime API serves only a SuperExec
    holding the same secret.
    """
    argv = ["flower-superlink", "--isolation", "process",
            *(["--database", database] if database else []),  # "": Flower's in-memory state
            "--disable-runtime-dependency-installation", "--host", host, "--port", str(port),
            *_secret(secret_file)]
    if tls is None:
        return [*argv, "--insecure"]
    return [*argv, "--ssl-ca-certfile", tls.ca_cert, "--ssl-certfile", tls.server_cert,
            "--ssl-keyfile", tls.server_key, "--enable-supernode-auth"]


def fleet_proxy(listen: str, superlink_address: str, tls: Tls | None,
                superlink_name: str = "") -> list[str]:
    """The public face of the SuperLink: only Fleet API paths pass (adaptfl/deploy/fleet_proxy.py).

    With TLS, `tls` holds the proxy's own certificate and key and the CA that signed the
    SuperLink's; `superlink_name` is the name in the SuperLink's certificate.
    """
    argv = ["python", "-m", "adaptfl.deploy.fleet_proxy", "--listen", listen,
            "--upstream", superlink_address]
    if tls is None:
        return argv
    argv += ["--certfile", tls.server_cert, "--keyfile", tls.server_key, "--upstream-ca", tls.ca_cert]
    return [*argv, "--upstream-name", superlink_name] if superlink_name else argv


def superexec_serverapp(superlink_address: str, tls: Tls | None, secret_file: str = "") -> list[str]:
    """Runs the ServerApp; it dials the SuperLink's Runtime API (TLS when the SuperLink has it)."""
    argv = ["flower-superexec", "--runtime-api-address", superlink_address, *_secret(secret_file)]
    return [*argv, "--insecure"] if tls is None else [*argv, "--root-certificates", tls.ca_cert]


def supernode(superlink_address: str, runtime_host: str, runtime_port: int, partition_id: int,
              num_partitions: int, tls: Tls | None, private_key: str = "",
              device: str = "", secret_file: str = "", trusted_entities: str = "") -> list[str]:
    """One data owner. `device` (cpu, cuda, cuda:N) overrides the run config's for this node.

    `superlink_address` is the Fleet API proxy's. `runtime_host` should be 127.0.0.1 (its
    SuperExec runs beside it); `trusted_entities` (a YAML of Ed25519 keys) makes it run only apps
    signed by one of them (in Flower 1.42: apps from Flower Hub only, see deploy/README.md).
    """
    node_config = f"partition-id={partition_id} num-partitions={num_partitions}"
    if device:
        node_config += f' device="{device}"'
    argv = ["flower-supernode", "--superlink", superlink_address, "--isolation", "process",
            "--host", runtime_host, "--port", str(runtime_port), "--node-config", node_config,
            *_secret(secret_file)]
    if trusted_entities:
        argv += ["--trusted-entities", trusted_entities]
    if tls is None:
        return [*argv, "--insecure"]
    if not private_key:
        raise ValueError("private_key='' : with TLS the SuperLink requires SuperNode authentication")
    return [*argv, "--root-certificates", tls.ca_cert, "--auth-supernode-private-key", private_key]


def superexec_clientapp(supernode_runtime_address: str, secret_file: str = "") -> list[str]:
    """Runs ClientApps for one SuperNode, next to it (same machine or pod, on loopback).

    Plain HTTP on purpose: the link never leaves the host. The shared secret (HMAC over each
    request) keeps other local processes from posing as this SuperExec.
    """
    return ["flower-superexec", "--runtime-api-address", supernode_runtime_address,
            *_secret(secret_file), "--insecure"]
