#!/usr/bin/env bash
# The docker-compose demo, built and run for real on this machine (Debian 12, root):
#   bash deploy/compose-check.sh
# Installs what it needs (Debian's docker.io, docker-compose v1, debootstrap, iptables; adaptfl
# itself if `flwr` is missing), then deploy/compose_check.py does the rest: its own dockerd
# (stopped by PID, also on failure), images, the insecure and the TLS demo, `down -v`, and one
# summary line. Needs 16 GB of free disk and about 10 minutes; exits 0 only if every check held.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || /usr/bin/docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v iptables >/dev/null || need+=(iptables)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}"
fi
command -v flwr >/dev/null || python -m pip install -q -e .

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python -m adaptfl.deploy.compose_check "$@"
