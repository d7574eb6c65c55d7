"""The docker-compose demo, built and run for real: `bash deploy/compose-check.sh`.

Runs docs/deployment.md's compose commands (PHASES below; that page's block is generated from them and
tests/deploy/test_deploy_compose_check.py keeps the two equal) on a Docker engine of its own:
images (Flower's, or stand-ins where Docker Hub is unreachable; the project image from the
host-built wheelhouse), the insecure demo for 2 rounds, then TLS + SuperNode authentication +
SuperExec secrets for 2 rounds with an unregistered SuperNode and an outsider holding only
ca.crt refused, each torn down with `down -v`. `flwr` runs in the `operator` container on the
compose network; the check also tries the SuperLink's port from the host, where it must be
unreachable. Exits 0 and prints one summary line when every
check held; exits 1 naming the first that did not; 2 when the machine cannot run it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from adaptfl import source as where
from adaptfl.deploy import dockerd, loopback, stand_in
from adaptfl.deploy.layout import CERTS, DEPLOY, PROJECT

# Measured on a fresh machine: +13.5 GB at peak (3.2 GB of wheels, BuildKit's copy of them, the
# 7.2 GB image, the stand-ins; docs/deployment.md); 12 GB, the first estimate, was too little.
MIN_FREE_GB = 16
ROUNDS = 2
# min-replies=2: round 1 waits until both SuperNodes have joined
RUN_CONFIG = (f"num-server-rounds={ROUNDS} min-replies=2 model='mlp' local-steps=3 batch-size=32 "
              "accept-small-rounds=true")  # two SuperNodes: rounds of two, accepted by name
# The operators' `flwr` runs in the `operator` container on the `server` network (its
# connections: deploy/operator.toml); the SuperLink's port is published nowhere on this host.
OPERATOR = "$COMPOSE {} --profile operator run --rm -T operator"
# 300 s: a SuperLink takes seconds idle, but CI runs this on 2 cores after the suite, maybe loaded
WAIT_FOR = "timeout 300 bash -c 'until {} ls {} >/dev/null 2>&1; do sleep 2; done'   # SuperLink up"
SUPERLINK_PORT = 8000  # the SuperLink's own port: Control, Fleet and Runtime APIs
PUBLIC_ADDRESS = "127.0.0.1:9092"  # the Fleet API proxy, published on every interface
INSECURE_FILES = "-f compose.yml"
TLS_FILES = "-f compose.yml -f with-tls.yml"
APP = "/app/project"  # this repository, mounted read-only into the operator container
STEP_PATH = "native"  # FedACT's CPU loops, as in a simulation on this machine (metrics `step-path`)


def _operator(files: str) -> str:
    return OPERATOR.format(files)


# Every command of the demo, run in deploy/ with bash and COMPOSE="docker compose" (v2) or
# COMPOSE=docker-compose (v1). Each phase's checks run between phases. The image is built once,
# in `images`; both variants start from it (`up --no-build`), so neither rebuilds it.
PHASES: dict[str, list[str]] = {
    "images": [
        "python -m adaptfl.deploy.wheelhouse wheelhouse   # host-built wheels: the build dials nothing",
        "python -m adaptfl.deploy.stand_in   # Flower's images, or stand-ins without Docker Hub",
        "export DOCKER_BUILDKIT=1 COMPOSE_DOCKER_CLI_BUILD=1   # BuildKit, with docker-compose v1 too",
        f"$COMPOSE {INSECURE_FILES} build",
    ],
    "insecure": [
        f"$COMPOSE {INSECURE_FILES} up -d --no-build",
        WAIT_FOR.format(_operator(INSECURE_FILES), "adaptfl-demo"),
        f"{_operator(INSECURE_FILES)} run {APP} adaptfl-demo --stream "
        f"--run-config \"{RUN_CONFIG} run-name='compose-insecure'\"",
    ],
    "insecure-down": [f"$COMPOSE {INSECURE_FILES} down -v"],
    "tls": [
        "KEY_OWNER=49999:49999 ./generate-certs.sh certs 2   # as root: keys 0600, owned by `app`",
        f"$COMPOSE {TLS_FILES} up -d --no-build superlink fleet-proxy superexec-serverapp",
        WAIT_FOR.format(_operator(TLS_FILES), "adaptfl-demo-tls"),
        f"{_operator(TLS_FILES)} supernode register /app/certificates/supernode-1.pub adaptfl-demo-tls",
        f"{_operator(TLS_FILES)} supernode register /app/certificates/supernode-2.pub adaptfl-demo-tls",
        f"$COMPOSE {TLS_FILES} up -d --no-build   # the SuperNodes join now",
        f"{_operator(TLS_FILES)} run {APP} adaptfl-demo-tls --stream "
        f"--run-config \"{RUN_CONFIG} run-name='compose-tls'\"",
    ],
    "tls-down": [f"$COMPOSE {TLS_FILES} down -v"],
}


def readme_block() -> str:
    """The compose section of docs/deployment.md: exactly the commands this check runs, in its order."""
    lines = ['export COMPOSE="docker compose"   # or COMPOSE=docker-compose (v1)', "cd deploy"]
    for name, commands in PHASES.items():
        lines += ["", f"# {name}", *commands]
    return "\n".join(lines)


class CheckFailed(Exception):
    pass


def compose_command() -> str:
    """`docker compose` (v2) where the plugin exists, else docker-compose (v1)."""
    v2 = subprocess.run([dockerd.DOCKER, "compose", "version"], capture_output=True, check=False)
    if v2.returncode == 0:
        return f"{dockerd.DOCKER} compose"
    if shutil.which("docker-compose"):
        return "docker-compose"
    raise CheckFailed("neither `docker compose` nor `docker-compose` is installed")


class Runner:
    """Runs the demo's commands in deploy/ and keeps the wall time of each phase."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.seconds: dict[str, float] = {}
        self.disk_start = shutil.disk_usage(DEPLOY).used
        self.disk_peak = 0

    def phase(self, name: str, timeout: float = 1800) -> str:
        started = time.perf_counter()
        script = "set -euo pipefail\n" + "\n".join(PHASES[name]) + "\n"
        done = subprocess.run(["bash", "-c", script], cwd=DEPLOY, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        (self.log_dir / f"{name}.log").write_text(done.stdout + done.stderr)
        self.seconds[name] = time.perf_counter() - started
        self.note_disk()
        print(f"[compose-check] {name}: exit {done.returncode} in {self.seconds[name]:.0f} s", flush=True)
        if done.returncode != 0:
            raise CheckFailed(f"phase {name} failed ({done.returncode}): "
                              f"{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout + done.stderr

    def note_disk(self) -> None:
        self.disk_peak = max(self.disk_peak, shutil.disk_usage(DEPLOY).used - self.disk_start)

    def keep_logs(self, files: str, name: str) -> None:
        """The containers' logs, before `down -v` removes them (kept only when a check fails)."""
        done = self.compose(f"{files} logs --no-color --timestamps")
        (self.log_dir / f"{name}-containers.log").write_text(done.stdout + done.stderr)

    def compose(self, args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", f"$COMPOSE {args}"], cwd=DEPLOY, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)


def results_script(results_root: str, run_name: str) -> str:
    """Python that prints {"rows": [[round, sampled, accepted, step-path], …], "model": bytes of
    model.pt} of a run's results dir (rounds 1..; round 0 is the initial model's evaluation). It
    runs inside the ServerApp's container, where the results volume is mounted."""
    return ("import csv, json, os; d = '" + results_root + "/" + run_name + "'; "
            "rows = [r for r in csv.DictReader(open(d + '/metrics.csv')) if r['round'] != '0']; "
            "print(json.dumps({'rows': [[int(r['round']), int(r['replies-sampled']), "
            "int(r['replies-accepted']), r.get('step-path', '')] for r in rows], "
            "'model': os.path.getsize(d + '/model.pt')}))")


def results_in_volume(runner: Runner, files: str, run_name: str) -> str:
    """(round, sampled, accepted) from metrics.csv in the results volume, every round's
    ClientApps on the `native` step path (as on any CPU with a C compiler: the image's zig cc);
    model.pt must be there."""
    script = results_script("/app/.adaptfl/results", run_name)
    done = runner.compose(f"{files} exec -T superexec-serverapp python -c \"{script}\"")
    if done.returncode != 0:
        raise CheckFailed(f"no results of {run_name} in the results volume: {done.stderr[-2000:]}")
    return judge_results(run_name, json.loads(done.stdout.strip().splitlines()[-1]))


def judge_results(run_name: str, found: dict[str, Any]) -> str:
    """The summary of a run's results (`results_script`'s output), or CheckFailed naming what is off."""
    rows = [tuple(r[:3]) for r in found["rows"]]
    paths = sorted({r[3] for r in found["rows"]})
    expected = [(r, 2, 2) for r in range(1, ROUNDS + 1)]
    if rows != expected or found["model"] <= 0:
        raise CheckFailed(f"{run_name}: rounds {rows} (want {expected}), model.pt {found['model']} B")
    if paths != [STEP_PATH]:
        raise CheckFailed(f"{run_name}: the ClientApps took step path {paths}, want [{STEP_PATH!r}] "
                          "(deploy/Dockerfile's CC)")
    return f"rounds {rows}, step-path {STEP_PATH}"


def intruder_refused(runner: Runner, workdir: Path) -> str:
    """A SuperNode with a key nobody registered, on the SuperNodes' network: must exit non-zero."""
    key_dir = workdir / "intruder"
    key_dir.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                    str(key_dir / "supernode.key")], check=True, capture_output=True)
    shutil.copy(CERTS / "ca.crt", key_dir / "ca.crt")
    subprocess.run(["chown", "-R", "49999:49999", str(key_dir)], check=True)
    done = subprocess.run(
        [dockerd.DOCKER, "run", "--rm", "--network", "deploy_fleet", "-v", f"{key_dir}:/app/certificates:ro",
         stand_in.FLOWER_IMAGES["supernode"], "--superlink", "fleet-proxy:9092", "--isolation", "process",
         "--host", "127.0.0.1", "--port", "9094", "--node-config", "partition-id=0 num-partitions=2",
         "--root-certificates", "/app/certificates/ca.crt",
         "--auth-supernode-private-key", "/app/certificates/supernode.key"],
        capture_output=True, text=True, timeout=180, check=False)
    log = done.stdout + done.stderr
    if done.returncode == 0 or "305" not in log:
        raise CheckFailed(f"the unregistered SuperNode was not refused (exit {done.returncode}): "
                          f"{log[-2000:]}")
    return f"exit {done.returncode}, Flower code 305"


def outsider_refused(runner: Runner) -> str:
    """`flwr supernode register`, `flwr ls` and `flwr run` through the public port with only
    ca.crt (loopback's `attack_with_ca_only`): the proxy must answer each with 403."""
    home = Path(runner.env["FLWR_HOME"])
    outsider_home = home.parent / "outsider-flwr-home"
    outsider_home.mkdir(exist_ok=True)
    (outsider_home / "config.toml").write_text(
        f'[superlink.{loopback.OUTSIDER}]\naddress = "{PUBLIC_ADDRESS}"\n'
        f'root-certificates = "{CERTS / "ca.crt"}"\n')
    tried = loopback.attack_with_ca_only(outsider_home, {**runner.env, "FLWR_HOME": str(outsider_home)})
    proxy_log = runner.compose(f"{TLS_FILES} logs fleet-proxy").stdout
    for attempt, path in (("register", "register-node"), ("ls", "list-runs"), ("run", "start-run")):
        refused = f"/v1/control/{path} is not part of the Fleet API" in proxy_log
        if tried[attempt].returncode == 0 or not refused:
            raise CheckFailed(f"`flwr {attempt}` through the proxy was not refused: "
                              f"{tried[attempt].stdout[-1000:]}")
    return "register, ls and run refused (403)"


def superlink_answers(host: str, port: int, cafile: str = "") -> bool:
    """Whether the SuperLink itself answers GET /health at host:port (200), over TLS signed by
    our CA when `cafile` is given. Not a bare TCP connect: a network may accept any connection
    (this project's machines have a gateway that does, and answers 404/426)."""
    if cafile:
        context = ssl.create_default_context(cafile=cafile)
        context.check_hostname = False  # an IP address; the CA still vouches for the SuperLink
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=5,
                                                                       context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def superlink_unreachable_from_host(runner: Runner, files: str, cafile: str = "") -> str:
    """No host process reaches the SuperLink's port (docs/threat-model.md, "The deployment"):
    published nowhere (not on 127.0.0.1 either), and its container address on the `server`
    network has no route from the host (inhibit_ipv4). The operator container reached it (the
    `flwr run` above)."""
    container = runner.compose(f"{files} ps -q superlink").stdout.strip()
    inspect = subprocess.run(
        [dockerd.DOCKER, "inspect", "-f", "{{json .NetworkSettings.Ports}} "
         "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", container],
        capture_output=True, text=True, timeout=60, check=False)
    if inspect.returncode != 0 or not container:
        raise CheckFailed(f"cannot inspect the SuperLink's container: {inspect.stderr[-1000:]}")
    ports, *addresses = inspect.stdout.split()
    bindings = [b for b in (json.loads(ports) or {}).values() if b]
    reached = [host for host in ("127.0.0.1", *addresses) if superlink_answers(host, SUPERLINK_PORT, cafile)]
    if bindings or reached or not addresses:
        raise CheckFailed(f"the SuperLink's port is reachable from the host: published {bindings}, "
                          f"answered at {reached}, addresses {addresses}")
    return (f"published nowhere, {', '.join(addresses)}:{SUPERLINK_PORT} and 127.0.0.1 unreachable "
            "from the host")


def release_build_cache() -> None:
    """BuildKit keeps a copy of the build context (the 3 GB wheelhouse) and every superseded
    image's layers; without this, each re-run after a source change leaks ~10 GB. The tagged
    images stay, so a re-run with unchanged sources still skips the stand-ins."""
    for what in ("image", "builder"):
        subprocess.run([dockerd.DOCKER, what, "prune", "-f"], capture_output=True, timeout=600,
                       check=False)


def free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / 2**30


class Unavailable(Exception):
    """This machine cannot run the check (no root, no dockerd, too little disk, no daemon or no
    networks): a reason to skip it, not a failure of the demo."""


def machine_problem() -> str | None:
    """Why the check cannot run here, before anything is started or built; None where it can."""
    problem = dockerd.why_not_here()
    if problem:
        return problem
    docker_root = Path("/var/lib/docker")
    for place in (DEPLOY, docker_root if docker_root.exists() else Path("/var/lib")):
        if free_gb(place) < MIN_FREE_GB:
            return (f"only {free_gb(place):.1f} GB free on {place}; it needs {MIN_FREE_GB} GB "
                    "(a 7 GB image, 3 GB of wheels, build cache)")
    return None


def start_engine(workdir: Path) -> dockerd.OwnDockerd:
    """A Docker engine that answers and can make networks, else Unavailable (ours stopped)."""
    engine = dockerd.OwnDockerd(workdir / "dockerd.log")
    try:
        print(f"[compose-check] {engine.start()}", flush=True)
        problem = dockerd.network_problem()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # TimeoutError is an OSError
        problem = f"cannot start a Docker daemon: {str(exc).strip().splitlines()[0][:300]}"
    if problem:
        engine.stop()
        raise Unavailable(problem)
    return engine


def run_check(workdir: Path) -> str:
    where.checkout("python -m adaptfl.deploy.compose_check")
    problem = machine_problem()
    if problem:
        raise Unavailable(problem)
    started = time.perf_counter()
    engine = start_engine(workdir)
    made_certs = not CERTS.exists()
    env = {**os.environ, "COMPOSE": compose_command(), "FLWR_HOME": str(workdir / "flwr-home"),
           "PATH": f"/usr/bin:{os.environ.get('PATH', '')}", "PYTHONPATH": str(PROJECT),
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0"}
    runner = Runner(env, workdir)
    summary: dict[str, str] = {}
    try:
        images_log = runner.phase("images")
        summary["flower-images"] = next((line for line in images_log.splitlines()
                                         if line.startswith(stand_in.OUTCOMES)), "Flower images ?")
        try:
            runner.phase("insecure")
            summary["insecure"] = results_in_volume(runner, INSECURE_FILES, "compose-insecure")
            summary["superlink-port"] = superlink_unreachable_from_host(runner, INSECURE_FILES)
        finally:
            runner.keep_logs(INSECURE_FILES, "insecure")
            runner.phase("insecure-down")
        try:
            runner.phase("tls")
            summary["tls"] = results_in_volume(runner, TLS_FILES, "compose-tls")
            summary["intruder"] = intruder_refused(runner, workdir)
            summary["outsider"] = outsider_refused(runner)
            superlink_unreachable_from_host(runner, TLS_FILES, str(CERTS / "ca.crt"))
        finally:
            runner.keep_logs(TLS_FILES, "tls")
            runner.phase("tls-down")
    finally:
        release_build_cache()
        engine.stop()
        if made_certs:
            shutil.rmtree(CERTS, ignore_errors=True)
    seconds = ", ".join(f"{k} {v:.0f}s" for k, v in runner.seconds.items())
    return (f"compose-check OK: insecure {summary['insecure']}; tls {summary['tls']}; SuperLink's port "
            f"{summary['superlink-port']}; unregistered "
            f"SuperNode {summary['intruder']}; outsider via proxy {summary['outsider']}; "
            f"{summary['flower-images']}; times: {seconds}, total {time.perf_counter() - started:.0f}s; "
            f"peak disk +{runner.disk_peak / 2**30:.1f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--print-readme", action="store_true", help="print the block of docs/deployment.md")
    parser.add_argument("--if-possible", action="store_true",
                        help="where the machine cannot run it, say why in one line and exit 0 (CI)")
    args = parser.parse_args()
    if args.print_readme:
        print(readme_block())
        return
    workdir = Path(tempfile.mkdtemp(prefix="adaptfl-compose-check-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` still stops dockerd
    try:
        print(run_check(workdir))
        subprocess.run(["rm", "-rf", str(workdir)], check=False)  # logs are kept on failure only
    except Unavailable as why:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
        if args.if_possible:
            print(f"compose-check skipped: {why}")
            return
        print(f"compose-check cannot run here: {why}", file=sys.stderr)
        sys.exit(2)
    except CheckFailed as failed:
        print(f"compose-check FAILED: {failed} (logs in {workdir})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
