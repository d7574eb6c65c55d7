"""A real Flower deployment on this machine: TLS, SuperNode authentication, process isolation.

    python -m adaptfl.deploy.loopback --num-nodes 2 --run-config "num-server-rounds=2 model='mlp'"

Runs the very commands of the compose demo (deploy/commands.py) on 127.0.0.1 with free ports:
certificates and node keys from deploy/generate-certs.sh, one SuperLink (+ SuperExec for the
ServerApp), N SuperNodes (+ one SuperExec each), their keys registered with
`flwr supernode register`, then `flwr run` against it. Every process is stopped by its PID at
the end, also when something fails. `--intruder` also starts a SuperNode whose key was never
registered: the SuperLink must refuse it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from adaptfl.deploy import commands
from adaptfl.deploy.processes import ProcessGroup, free_port, wait_for_port

PROJECT = Path(__file__).resolve().parent.parent
CONNECTION = "loopback"  # the name of the SuperLink connection in $FLWR_HOME/config.toml


@dataclass
class LoopbackResult:
    run: subprocess.CompletedProcess[str]  # `flwr run`
    intruder_exit: int | None  # exit status of the unregistered SuperNode (None: not started)
    log_dir: Path
    seconds: float  # wall time of `flwr run`
    commands: dict[str, list[str]]  # process name -> the argv it ran


def flower_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"FLWR_HOME": str(flwr_home), "FLWR_DISABLE_UPDATE_CHECK": "1",
                "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"})
    return env


def write_connection(flwr_home: Path, address: str, ca_cert: Path) -> None:
    """Where `flwr` finds the SuperLink: connections live in $FLWR_HOME/config.toml in 1.42."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink.{CONNECTION}]\naddress = "{address}"\nroot-certificates = "{ca_cert}"\n')


def flwr_cli(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    flwr = shutil.which("flwr")
    if flwr is None:
        raise FileNotFoundError("the `flwr` CLI is not on PATH (pip install flwr==1.42.0)")
    return subprocess.run([flwr, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def generate_certs(cert_dir: Path, num_nodes: int) -> None:
    subprocess.run(["bash", str(PROJECT / "deploy" / "generate-certs.sh"), str(cert_dir),
                    str(num_nodes)], check=True, capture_output=True, timeout=120)


def _wait_exit(proc: subprocess.Popen[bytes], limit: float) -> int | None:
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return None


def run_loopback(workdir: Path, num_nodes: int, run_config: str, intruder: bool = False,
                 timeout: float = 600) -> LoopbackResult:
    """Deploy, run once, tear down. Raises if a step before `flwr run` fails."""
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes} must be >= 1")
    workdir = workdir.resolve()
    certs, flwr_home = workdir / "certs", workdir / "flwr-home"
    generate_certs(certs, num_nodes + (1 if intruder else 0))
    env = flower_env(flwr_home)
    group = ProcessGroup(workdir / "logs", env)
    port = free_port()
    address = f"127.0.0.1:{port}"
    tls = commands.Tls(ca_cert=str(certs / "ca.crt"), server_cert=str(certs / "server.pem"),
                       server_key=str(certs / "server.key"))
    try:
        link = group.start("superlink", commands.superlink("127.0.0.1", port,
                                                           str(workdir / "state.db"), tls), workdir)
        wait_for_port(port, link, group.log_of("superlink"))
        group.start("superexec-serverapp", commands.superexec_serverapp(address, tls), workdir)
        write_connection(flwr_home, address, certs / "ca.crt")
        for i in range(1, num_nodes + 1):
            done = flwr_cli(["supernode", "register", str(certs / "keys" / f"supernode-{i}.pub"),
                             CONNECTION], env, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"registering supernode-{i} failed: {done.stdout}{done.stderr}")
        for i in range(1, num_nodes + 1):
            runtime_port = free_port()
            group.start(f"supernode-{i}", commands.supernode(
                address, "127.0.0.1", runtime_port, i - 1, num_nodes, tls,
                private_key=str(certs / "keys" / f"supernode-{i}")), workdir)
            group.start(f"superexec-clientapp-{i}",
                        commands.superexec_clientapp(f"127.0.0.1:{runtime_port}"), workdir)
        intruder_exit = None
        if intruder:  # key generated but never registered
            stranger = group.start("supernode-intruder", commands.supernode(
                address, "127.0.0.1", free_port(), 0, num_nodes, tls,
                private_key=str(certs / "keys" / f"supernode-{num_nodes + 1}")), workdir)
            intruder_exit = _wait_exit(stranger, limit=60)
        started = time.perf_counter()
        run = flwr_cli(["run", str(PROJECT), CONNECTION, "--stream", "--run-config", run_config],
                       env, timeout=timeout)
        return LoopbackResult(run=run, intruder_exit=intruder_exit, log_dir=group.log_dir,
                              seconds=time.perf_counter() - started,
                              commands={name: list(p.args) for name, p in group.procs.items()})
    finally:
        group.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=PROJECT / "results" / "loopback-deploy")
    parser.add_argument("--run-config", default="", help='e.g. "num-server-rounds=2 model=\'mlp\'"')
    parser.add_argument("--intruder", action="store_true",
                        help="also start a SuperNode with an unregistered key (must be refused)")
    args = parser.parse_args()
    result = run_loopback(args.workdir, args.num_nodes, args.run_config, args.intruder)
    print(result.run.stdout[-4000:], result.run.stderr[-4000:], sep="\n", file=sys.stderr)
    print(json.dumps({"flwr-run-exit": result.run.returncode, "seconds": round(result.seconds, 1),
                      "intruder-exit": result.intruder_exit, "logs": str(result.log_dir)}))
    sys.exit(result.run.returncode)


if __name__ == "__main__":
    main()
