"""Where a command's CPU goes, by kind of process: every process on the machine is read from
/proc every 0.5 s while COMMAND runs, and its CPU (user + system) is summed under a label from
its command line (a pytest worker, Ray's workers and daemons, Flower's SuperLink, SuperNode,
SuperExec, ClientApp and ServerApp processes, the `flwr` CLI, `python -m adaptfl.*`, ...).

    python benchmarks/cpu_by_process.py -- python -m pytest -q -n 3 --dist loadgroup

It sees what `time` does not: processes started in their own session that the command never
waits for (Ray's, Flower's). A process that lives less than 0.5 s is missed, and the CPU a
process spends in its last 0.5 s is lost; processes that ran before COMMAND started count only
what they use while it runs. Run it on an otherwise idle machine: everything is counted.
docs/tests.md has its figures for the test suite.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
# first match wins: Ray's workers name the raylet in their arguments, so they come first
KINDS = ("flwr-clientapp", "flwr-serverapp", "flwr-simulation", "flower-superlink", "flower-supernode",
         "flower-superexec", "default_worker.py", "ray::", "gcs_server", "raylet", "log_monitor",
         "dashboard", "runtime_env", "monitor.py")
LATER = ("adaptfl.engine", "adaptfl.flwr_run", "adaptfl.deploy", "adaptfl.", "benchmarks/", "scripts/",
         "/bin/flwr ", "pip", "mypy", "ruff", "gcc", "cc1", "openssl", "ssh-keygen", "docker", "bash")
Key = tuple[int, str]  # (pid, its start time): a pid reused by a new process is another key


def label(cmdline: str) -> str:
    line = cmdline.replace("\0", " ")
    for kind in KINDS:
        if kind in line:
            return kind
    if "-c import sys;exec(eval" in line:  # how pytest-xdist starts its workers
        return "pytest-worker"
    if "-m pytest" in line:
        return "pytest-main"
    for kind in LATER:
        if kind in line:
            return kind.strip()
    argv = [arg.replace("\n", " ") for arg in cmdline.split("\0") if arg]
    return "other: " + " ".join([os.path.basename(argv[0]), *argv[1:]] if argv else [])[:60]


def scan(labels: dict[Key, str], skip: int) -> dict[Key, float]:
    """CPU seconds so far of every process now alive (labels filled in for new ones)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == skip:
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            fields = stat[stat.rfind(")") + 2:].split()
            key = (int(entry), fields[19])
            if key not in labels:
                with open(f"/proc/{entry}/cmdline") as fh:
                    labels[key] = label(fh.read())
            out[key] = (int(fields[11]) + int(fields[12])) / HZ
        except (OSError, IndexError, ValueError):  # it ended while being read
            continue
    return out


def machine() -> str:
    """The CPU's model name and count, as /proc/cpuinfo gives them (the figures are this CPU's)."""
    with open("/proc/cpuinfo") as fh:
        names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
    return f"{names[0] if names else 'unknown CPU'} × {os.cpu_count()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    labels: dict[Key, str] = {}
    before = scan(labels, os.getpid())  # what ran before counts from now on only
    started = time.monotonic()
    child = subprocess.Popen(command)
    last = dict(before)
    total: collections.Counter[str] = collections.Counter()
    processes: collections.Counter[str] = collections.Counter()
    while child.poll() is None:
        time.sleep(0.5)
        now = scan(labels, os.getpid())
        for key, cpu in now.items():
            if key not in last and key not in before:
                processes[labels[key]] += 1
            total[labels[key]] += max(0.0, cpu - last.get(key, 0.0))
        last = now
    wall = time.monotonic() - started
    cpu = sum(total.values())
    print(json.dumps({"command": " ".join(command), "machine": machine(), "exit": child.returncode,
                      "wall-s": round(wall, 1),
                      "cpu-s": round(cpu, 1), "cores-busy": round(cpu / wall, 2),
                      "by-kind": {k: [round(s, 1), processes[k]] for k, s in total.most_common(25)}},
                     indent=1, ensure_ascii=False))
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
