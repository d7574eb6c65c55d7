"""The SuperLink's own port, reachable by the operator's processes only: a network namespace.

Flower 1.42 serves the Control API (`flwr run`: code on every SuperNode, `flwr supernode
register`, `flwr ls`) on the SuperLink's one port, beside the Fleet and Runtime APIs, and has no
option that authenticates its users. On the host's 127.0.0.1 every local process holding
`ca.crt` reaches it. The loopback kit therefore starts the SuperLink, its SuperExec and the
operator's `flwr` inside a network namespace of their own: its 127.0.0.1 is not the host's, so
nothing outside reaches the port. The Fleet proxy runs in it too, on a socket bound on the
host's 127.0.0.1 before it starts (`--listen fd:N`): the one way in from the host.

Who can enter: with root (CAP_SYS_ADMIN), only root; without, where the OS allows unprivileged
user namespaces, processes of the kit's own user. Every other user's processes cannot. Where
neither works (not Linux, no util-linux `unshare`/`nsenter`, both refused), the kit runs on the
host's 127.0.0.1 as before and prints FALLBACK, one line (docs/deployment.md).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from adaptfl.deploy.processes import ProcessGroup

FALLBACK = ("warning: no network namespace ({why}): the SuperLink's port {address} is reachable "
            "by every local process on this host (fallback, docs/deployment.md)")
# unshare's flags per mode: a network namespace (root), or a user namespace owning one.
MODES = {"root": ["--net"], "user": ["--user", "--map-root-user", "--net"]}
ENTER = {"root": ["--net"], "user": ["--user", "--net", "--preserve-credentials"]}
PROBE = ("import socket, sys\nwith socket.socket() as s:\n"
         "    sys.exit(s.connect_ex(('127.0.0.1', int(sys.argv[1]))))")


def choose_mode() -> tuple[str, str]:
    """(mode, '') for the first mode this OS allows, or ('', why none does)."""
    if not sys.platform.startswith("linux"):
        return "", f"{sys.platform} has no network namespaces"
    tools = [t for t in ("unshare", "nsenter") if shutil.which(t) is None]
    if tools:
        return "", f"{' and '.join(tools)} not found (util-linux)"
    refused = []
    for mode, flags in MODES.items():
        done = subprocess.run(["unshare", *flags, "true"], capture_output=True, text=True,
                              timeout=30, check=False)
        if done.returncode == 0:
            return mode, ""
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        refused.append(f"unshare {' '.join(flags)}: {last}")
    return "", "; ".join(refused)


@dataclass
class Namespace:
    """Where the SuperLink side runs: a namespace held by `holder`, or the host ('' mode)."""

    mode: str
    holder_pid: int = 0

    def enter(self, argv: list[str]) -> list[str]:
        """argv run inside the namespace (nsenter execs it: the PID stays the program's)."""
        if not self.mode:
            return argv
        return ["nsenter", "--target", str(self.holder_pid), *ENTER[self.mode], "--", *argv]

    def reaches(self, port: int) -> bool:
        """Whether something listens on 127.0.0.1:port inside the namespace."""
        done = subprocess.run(self.enter([sys.executable, "-I", "-S", "-c", PROBE, str(port)]),
                              capture_output=True, timeout=30, check=False)
        return done.returncode == 0


def start(group: ProcessGroup, cwd: Path, address: str, mode: str | None = None,
          limit: float = 30) -> tuple[Namespace, str]:
    """A namespace held by the process `netns` of `group` (stopped with the others), or the
    host; the second value is FALLBACK's line when the host it is ('' otherwise)."""
    why = ""
    if mode is None:
        mode, why = choose_mode()
    if not mode:
        return Namespace(""), FALLBACK.format(why=why, address=address)
    holder = group.start("netns", ["unshare", *MODES[mode], sys.executable, "-m",
                                   "adaptfl.deploy.netns", "--hold"], cwd)
    deadline = time.monotonic() + limit
    while "ready" not in group.log_of("netns").read_text():
        if holder.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the network namespace did not come up ({mode}): "
                               f"{group.log_of('netns').read_text()[-2000:]}")
        time.sleep(0.1)
    return Namespace(mode, holder.pid), ""


def hold() -> None:
    """Inside the new namespace: bring its loopback up (it starts down), then wait for SIGTERM."""
    import fcntl
    import signal
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1  # <linux/sockios.h>, <net/if.h>
    ifreq = "16sH22x"  # struct ifreq: the name, then ifr_flags in its 24-byte union
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(ifreq, fcntl.ioctl(s, siocgifflags, struct.pack(ifreq, b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack(ifreq, b"lo", flags | iff_up))
    print("ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    if sys.argv[1:] != ["--hold"]:
        sys.exit("usage: python -m adaptfl.deploy.netns --hold (started by adaptfl/deploy/loopback.py)")
    hold()
