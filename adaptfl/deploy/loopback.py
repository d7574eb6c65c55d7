"""A real Flower deployment on this machine: TLS, SuperNode authentication, process isolation,
and the Fleet API proxy as the only way in for SuperNodes.

    python -m adaptfl.deploy.loopback --num-nodes 2 \
        --run-config "num-server-rounds=2 model='mlp' accept-small-rounds=true"

Runs the very commands of the compose demo (adaptfl/deploy/commands.py) on 127.0.0.1 with free ports:
certificates, node keys and SuperExec secrets from deploy/generate-certs.sh (one folder per
process), one SuperLink (+ SuperExec for the ServerApp) whose port is the operators' (Control
API), the Fleet API proxy whose port is the SuperNodes', N SuperNodes (+ one SuperExec each),
their keys registered with `flwr supernode register`, then `flwr run` against it. Every process
is stopped by its PID at the end, also when something fails.

The SuperLink, its SuperExec, the proxy and the operator's `flwr` run in a network namespace of
their own where the OS allows one (adaptfl/deploy/netns.py): no other local user's process reaches the
SuperLink's port; the proxy's port, bound on the host's 127.0.0.1, is the only way in. Elsewhere
the kit says so in one warning line and runs on the host's 127.0.0.1.

`--intruder` also starts a SuperNode whose key was never registered (it must be refused);
`--attacker` plays someone who holds only ca.crt and reaches only the public (proxy) port: it
tries `flwr supernode register`, `flwr ls` and `flwr run`, and each must be refused; in a
namespace it also tries them on the SuperLink's port from outside it (`local-*`: refused too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from adaptfl import source as where
from adaptfl.deploy import commands, netns
from adaptfl.deploy.layout import GENERATE_CERTS, PROJECT  # `flwr run` sends this checkout
from adaptfl.deploy.processes import PeakMemory, ProcessGroup, free_port, wait_for_line, wait_for_port
from adaptfl.deploy.run_status import settled

CONNECTION = "loopback"  # the operator's connection in $FLWR_HOME/config.toml: the SuperLink's port
OUTSIDER = "outsider"  # the same ca.crt, but the public port: the Fleet API proxy's
LOCAL_USER = "local-user"  # the SuperLink's address, dialled by a process outside its namespace


@dataclass
class LoopbackResult:
    # `flwr run`, its return code the run's final status (run_status.settled); None: not asked for
    run: subprocess.CompletedProcess[str] | None
    intruder_exit: int | None  # exit status of the unregistered SuperNode (None: not started)
    log_dir: Path
    seconds: float  # wall time of `flwr run`
    commands: dict[str, list[str]]  # process name -> the argv it ran
    attacks: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    # process name -> peak RSS (MiB) during the runs, its children (flwr-clientapp) included
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    more: list[subprocess.CompletedProcess[str]] = field(default_factory=list)  # `more_runs`
    more_peak_rss_mb: list[dict[str, float]] = field(default_factory=list)  # and their peaks
    isolation: str = ""  # the SuperLink side's network namespace (netns.MODES), '' on the host
    warning: str = ""  # netns.FALLBACK's line where the OS allowed no namespace


@dataclass
class Nodes:
    """What a `during` callback may do to the SuperNodes while `flwr run` runs."""

    group: ProcessGroup
    workdir: Path
    certs: Path
    superlink: str  # the address SuperNodes dial (the Fleet proxy)
    num_partitions: int
    starts: dict[int, int] = field(default_factory=dict)  # node -> times started

    def kill(self, i: int) -> None:
        """SuperNode i and its SuperExec (and the ClientApp it runs) die at once, like a machine."""
        for name in (self._name("supernode", i), self._name("superexec-clientapp", i)):
            self.group.kill(name)

    def restart(self, i: int) -> None:
        """SuperNode i again, with its registered key (so the same node id) and partition."""
        self.starts[i] = self.starts.get(i, 1) + 1
        _start_node(self.group, self.workdir, self.certs, i, self.superlink, self.num_partitions, None,
                    name=self._name("supernode", i))

    def _name(self, kind: str, i: int) -> str:
        n = self.starts.get(i, 1)
        return f"{kind}-{i}" if n == 1 else f"{kind}-{i}-start{n}"


def flower_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Flower's programs from this Python's environment first: a version manager's shim on PATH
    # (pyenv: a bash script, ~0.4 s) would run again at every `flwr-clientapp` process, one
    # per message (docs/scale.md)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update({"FLWR_HOME": str(flwr_home), "FLWR_DISABLE_UPDATE_CHECK": "1",
                "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"})
    return env


def write_connections(flwr_home: Path, connections: dict[str, str], ca_cert: Path) -> None:
    """Where `flwr` finds the SuperLink: connections live in $FLWR_HOME/config.toml in 1.42."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text("".join(
        f'[superlink.{name}]\naddress = "{address}"\nroot-certificates = "{ca_cert}"\n\n'
        for name, address in connections.items()))


def flwr_cli(args: list[str], env: dict[str, str], timeout: float,
             enter: Callable[[list[str]], list[str]] | None = None) -> subprocess.CompletedProcess[str]:
    """`flwr ARGS`; `enter` runs it in the SuperLink's namespace (the operator's)."""
    flwr = shutil.which("flwr", path=env.get("PATH"))
    if flwr is None:
        raise FileNotFoundError("the `flwr` CLI is not on PATH (pip install flwr==1.42.0)")
    argv = [flwr, *args]
    return subprocess.run(enter(argv) if enter else argv, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def generate_certs(cert_dir: Path, num_nodes: int) -> None:
    subprocess.run(["bash", str(GENERATE_CERTS), str(cert_dir),
                    str(num_nodes)], check=True, capture_output=True, timeout=180)


def _wait_exit(proc: subprocess.Popen[bytes], limit: float) -> int | None:
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return None


def attack_with_ca_only(certs: Path, env: dict[str, str], timeout: float = 120,
                        connection: str = OUTSIDER) -> dict[str, subprocess.CompletedProcess[str]]:
    """What someone holding only ca.crt can try through `connection` (the public port, or the
    SuperLink's from outside its namespace): each must fail."""
    attacker_key = certs / "attacker"
    if not attacker_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                        str(attacker_key)], check=True, capture_output=True, timeout=60)
    return {
        "register": flwr_cli(["supernode", "register", f"{attacker_key}.pub", connection], env, timeout),
        "ls": flwr_cli(["ls", connection], env, timeout),
        "run": flwr_cli(["run", str(PROJECT), connection, "--run-config", "num-server-rounds=1"],
                        env, timeout),
    }


def run_loopback(workdir: Path, num_nodes: int, run_config: str | None, intruder: bool = False,
                 timeout: float = 600, attacker: bool = False,
                 trusted_entities: Path | None = None, during: Callable[[Nodes], None] | None = None,
                 more_runs: Sequence[tuple[Path, str]] = (), state_db: bool = True) -> LoopbackResult:
    """Deploy, run once (unless run_config is None), tear down. Raises if a step before
    `flwr run` fails. `trusted_entities` is given to every SuperNode. `during(nodes)` runs in a
    thread beside `flwr run` (to kill and restart SuperNodes); `more_runs` are (app, run config)
    pairs run after it on the same deployment (another Flower app: a baseline). `state_db`: the
    SuperLink keeps its state in an SQLite file, as the compose demo does; False: in memory
    (Flower's default), which a loaded machine needs for many SuperNodes: there, writers waited
    past SQLite's 5 s lock timeout and the SuperLink failed the run (docs/scale.md)."""
    where.checkout("python -m adaptfl.deploy.loopback")
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes} must be >= 1")
    workdir = workdir.resolve()
    certs, flwr_home = workdir / "certs", workdir / "flwr-home"
    generate_certs(certs, num_nodes + (1 if intruder else 0))
    env = flower_env(flwr_home)
    group = ProcessGroup(workdir / "logs", env)
    port = free_port()  # free on the host too: a local user's process dialling it finds nothing
    # The proxy's socket, bound here on the host's loopback and handed to it (`--listen fd:N`).
    public = socket.create_server(("127.0.0.1", 0))
    proxy_port = public.getsockname()[1]
    address, public_address = f"127.0.0.1:{port}", f"127.0.0.1:{proxy_port}"
    link = certs / "superlink"
    tls = commands.Tls(ca_cert=str(link / "ca.crt"), server_cert=str(link / "server.pem"),
                       server_key=str(link / "server.key"))
    proxy_dir = certs / "fleet-proxy"
    proxy_tls = commands.Tls(ca_cert=str(proxy_dir / "ca.crt"),
                             server_cert=str(proxy_dir / "fleet-proxy.pem"),
                             server_key=str(proxy_dir / "fleet-proxy.key"))
    try:
        ns, warning = netns.start(group, workdir, address)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        superlink = group.start("superlink", commands.superlink(
            "127.0.0.1", port, str(workdir / "state.db") if state_db else "", tls,
            secret_file=str(link / "superexec.secret")), workdir, enter=ns.enter)
        wait_for_port(port, superlink, group.log_of("superlink"), reaches=ns.reaches)
        _, *proxy_args = commands.fleet_proxy(f"fd:{public.fileno()}", address, proxy_tls)
        proxy = group.start("fleet-proxy", [sys.executable, *proxy_args], workdir, enter=ns.enter,
                            pass_fds=(public.fileno(),))
        public.close()
        wait_for_line(proxy, group.log_of("fleet-proxy"), "Fleet API proxy on")
        serverapp_dir = certs / "superexec-serverapp"
        group.start("superexec-serverapp", commands.superexec_serverapp(
            address, commands.Tls(ca_cert=str(serverapp_dir / "ca.crt")),
            secret_file=str(serverapp_dir / "superexec.secret")), workdir, enter=ns.enter)
        write_connections(flwr_home, {CONNECTION: address, OUTSIDER: public_address,
                                      LOCAL_USER: address}, certs / "ca.crt")
        register = lambda i: flwr_cli(["supernode", "register",  # noqa: E731
                                       str(certs / f"supernode-{i}" / "supernode.pub"), CONNECTION],
                                      env, timeout=120, enter=ns.enter)
        with ThreadPoolExecutor(max_workers=4) as pool:  # 16 CLI starts one by one took ~30 s
            for i, done in enumerate(pool.map(register, range(1, num_nodes + 1)), start=1):
                if done.returncode != 0:
                    raise RuntimeError(f"registering supernode-{i} failed: {done.stdout}{done.stderr}")
        for i in range(1, num_nodes + 1):
            _start_node(group, workdir, certs, i, public_address, num_nodes, trusted_entities)
        intruder_exit = None
        if intruder:  # key generated but never registered
            stranger = _start_node(group, workdir, certs, num_nodes + 1, public_address, num_nodes,
                                   None, name="supernode-intruder")
            intruder_exit = _wait_exit(stranger, limit=60)
        attacks = attack_with_ca_only(certs, env) if attacker else {}
        if attacker and ns.mode:  # on the host's loopback (the fallback) these would succeed
            local = attack_with_ca_only(certs, env, connection=LOCAL_USER)
            attacks.update({f"local-{k}": v for k, v in local.items()})
        nodes = Nodes(group, workdir, certs, public_address, num_nodes)
        operator = lambda args: flwr_cli(args, env, timeout=60, enter=ns.enter)  # noqa: E731
        side = threading.Thread(target=during, args=(nodes,), daemon=True) if during else None
        started = time.perf_counter()
        run, more, peaks = None, [], []
        with PeakMemory(group) as memory:
            if side is not None:
                side.start()
            if run_config is not None:
                run = settled(flwr_cli(["run", str(PROJECT), CONNECTION, "--stream", "--run-config",
                                        run_config], env, timeout=timeout, enter=ns.enter),
                              operator, CONNECTION, timeout)
            seconds = time.perf_counter() - started
            if side is not None:
                side.join(timeout=60)
        for app, config in more_runs:
            with PeakMemory(group) as other:
                more.append(settled(flwr_cli(["run", str(app), CONNECTION, "--stream", "--run-config",
                                              config], env, timeout=timeout, enter=ns.enter),
                                    operator, CONNECTION, timeout))
            peaks.append(other.peak_mb)
        return LoopbackResult(run=run, intruder_exit=intruder_exit, log_dir=group.log_dir,
                              seconds=seconds,
                              commands={n: a for n, a in group.argv.items() if n != "netns"},
                              attacks=attacks, peak_rss_mb=memory.peak_mb, more=more,
                              more_peak_rss_mb=peaks, isolation=ns.mode, warning=warning)
    finally:
        public.close()
        group.stop_all()


def _start_node(group: ProcessGroup, workdir: Path, certs: Path, i: int, superlink: str,
                num_partitions: int, trusted_entities: Path | None,
                name: str = "") -> subprocess.Popen[bytes]:
    """SuperNode i and its SuperExec, on a free loopback port with their shared secret."""
    node, runtime_port = certs / f"supernode-{i}", free_port()
    name = name or f"supernode-{i}"
    proc = group.start(name, commands.supernode(
        superlink, "127.0.0.1", runtime_port, (i - 1) % num_partitions, num_partitions,
        commands.Tls(ca_cert=str(node / "ca.crt")), private_key=str(node / "supernode.key"),
        secret_file=str(node / "superexec.secret"),
        trusted_entities=str(trusted_entities) if trusted_entities else ""), workdir)
    group.start(name.replace("supernode", "superexec-clientapp"), commands.superexec_clientapp(
        f"127.0.0.1:{runtime_port}",
        secret_file=str(certs / f"superexec-clientapp-{i}" / "superexec.secret")), workdir)
    return proc


WORKDIR_NAME = "loopback-deploy"


def default_workdir(cwd: Path, checkout: Path = PROJECT, env: dict[str, str] | None = None) -> Path:
    """Where the kit writes its CA, node keys, SuperExec secrets, state.db, logs and results when
    no --workdir is given: `loopback-deploy/` in the current folder, or, run from inside the
    checkout, in the per-user cache ($XDG_CACHE_HOME or ~/.cache, then adaptfl/): private keys
    have no place in a source tree (a `git add .` or an app bundle would take them)."""
    cwd, checkout = cwd.resolve(), checkout.resolve()
    if cwd != checkout and checkout not in cwd.parents:
        return cwd / WORKDIR_NAME
    env = dict(os.environ) if env is None else env
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "adaptfl" / WORKDIR_NAME


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="the folder for the CA, node keys, SuperExec secrets, state.db, logs "
                             f"(default: ./{WORKDIR_NAME}, or {WORKDIR_NAME} in ~/.cache/adaptfl when "
                             "run from inside the adaptfl checkout)")
    parser.add_argument("--run-config", default="", help='e.g. "num-server-rounds=2 model=\'mlp\'"')
    parser.add_argument("--intruder", action="store_true",
                        help="also start a SuperNode with an unregistered key (must be refused)")
    parser.add_argument("--attacker", action="store_true",
                        help="try register / ls / run with only ca.crt via the public port")
    args = parser.parse_args()
    workdir = args.workdir or default_workdir(Path.cwd())
    print(f"loopback: work folder {workdir.resolve()} (keys, secrets, state.db, logs; --workdir "
          "sets another)", file=sys.stderr)
    result = run_loopback(workdir, args.num_nodes, args.run_config, args.intruder,
                          attacker=args.attacker)
    assert result.run is not None
    print(result.run.stdout[-4000:], result.run.stderr[-4000:], sep="\n", file=sys.stderr)
    print(json.dumps({"flwr-run-exit": result.run.returncode, "seconds": round(result.seconds, 1),
                      "intruder-exit": result.intruder_exit, "logs": str(result.log_dir),
                      "attacks-refused": {k: v.returncode != 0 for k, v in result.attacks.items()},
                      "superlink-namespace": result.isolation or "none (fallback)"}))
    sys.exit(result.run.returncode)


if __name__ == "__main__":
    main()
