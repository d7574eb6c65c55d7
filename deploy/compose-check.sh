#!/usr/bin/env bash
# The docker-compose demo, built and run for real on this machine (Debian 12, root):
#   bash deploy/compose-check.sh [--if-possible]
# Installs what it needs (Debian's docker.io, docker-compose v1, debootstrap, iptables; adaptfl
# itself if `flwr` is missing), then adaptfl/deploy/compose_check.py does the rest: its own
# dockerd (stopped by PID, also on failure), images, the insecure and the TLS demo, `down -v`, and
# one summary line. Needs 16 GB of free disk and 10-25 minutes; exits 0 only if every check held.
# --if-possible (CI): where the machine cannot run it (not root, no dockerd, no daemon, no
# network namespaces, too little disk) it says why in one line and exits 0; a demo that fails
# still exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

skip() {
  if [ "${1:-}" = "--if-possible" ]; then echo "compose-check skipped: $2"; exit 0; fi
  echo "compose-check cannot run here: $2" >&2; exit 2
}
[ "$(id -u)" = 0 ] || skip "${1:-}" "not root (dockerd and apt-get need root)"

need=()
command -v dockerd >/dev/null || [ -x /usr/sbin/dockerd ] || need+=(docker.io)
command -v docker-compose >/dev/null || /usr/bin/docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v iptables >/dev/null || need+=(iptables)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  log=${TMPDIR:-/tmp}/adaptfl-compose-check-apt.log
  { apt-get update -qq && apt-get install -y -qq "${need[@]}"; } > "$log" 2>&1 \
    || skip "${1:-}" "apt-get could not install ${need[*]} (see $log)"
fi
command -v flwr >/dev/null || python -m pip install -q -e .

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python -m adaptfl.deploy.compose_check "$@"
