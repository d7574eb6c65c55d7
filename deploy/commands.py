"""The command line of every process in an adaptfl deployment, in one place.

deploy/loopback.py runs these on 127.0.0.1; deploy/compose.yml (+ with-tls.yml) writes the
same flags as container commands, and tests/test_deploy_compose.py checks that they agree.
Each function returns argv without the program name's path: `[program, *flags]`.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPERLINK_PORT = 8000  # Control, Fleet and Runtime APIs share it: the only port to open
SUPERNODE_RUNTIME_PORT = 9094  # each SuperNode's API for its own SuperExec; never exposed


@dataclass(frozen=True)
class Tls:
    """Paths as seen by the process (inside a container, or on this machine)."""

    ca_cert: str  # the CA that signed the SuperLink's certificate
    server_cert: str = ""  # SuperLink only
    server_key: str = ""  # SuperLink only


def superlink(host: str, port: int, database: str, tls: Tls | None) -> list[str]:
    """With TLS, SuperNode authentication is on: only registered keys may join."""
    argv = ["flower-superlink", "--isolation", "process", "--database", database,
            "--disable-runtime-dependency-installation", "--host", host, "--port", str(port)]
    if tls is None:
        return [*argv, "--insecure"]
    return [*argv, "--ssl-ca-certfile", tls.ca_cert, "--ssl-certfile", tls.server_cert,
            "--ssl-keyfile", tls.server_key, "--enable-supernode-auth"]


def superexec_serverapp(superlink_address: str, tls: Tls | None) -> list[str]:
    """Runs the ServerApp; it dials the SuperLink's Runtime API (TLS when the SuperLink has it)."""
    argv = ["flower-superexec", "--runtime-api-address", superlink_address]
    return [*argv, "--insecure"] if tls is None else [*argv, "--root-certificates", tls.ca_cert]


def supernode(superlink_address: str, runtime_host: str, runtime_port: int, partition_id: int,
              num_partitions: int, tls: Tls | None, private_key: str = "",
              device: str = "") -> list[str]:
    """One data owner. `device` (cpu, cuda, cuda:N) overrides the run config's for this node."""
    node_config = f"partition-id={partition_id} num-partitions={num_partitions}"
    if device:
        node_config += f' device="{device}"'
    argv = ["flower-supernode", "--superlink", superlink_address, "--isolation", "process",
            "--host", runtime_host, "--port", str(runtime_port), "--node-config", node_config]
    if tls is None:
        return [*argv, "--insecure"]
    if not private_key:
        raise ValueError("private_key='' : with TLS the SuperLink requires SuperNode authentication")
    return [*argv, "--root-certificates", tls.ca_cert, "--auth-supernode-private-key", private_key]


def superexec_clientapp(supernode_runtime_address: str) -> list[str]:
    """Runs ClientApps for one SuperNode, next to it (same machine or pod): plain connection."""
    return ["flower-superexec", "--runtime-api-address", supernode_runtime_address, "--insecure"]
