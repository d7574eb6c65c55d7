#!/usr/bin/env bash
# Set up adaptfl and run the main job: FedACT on Fashion-MNIST, 10 simulated clients,
# Dirichlet α=0.3. Extra arguments go to `flwr run`, e.g.
#   scripts/main_job.sh --run-config "algorithm='fedadamw'"
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq dataset-fashion-mnist
  fi
fi
python -m pip install -q -e ".[test]"

# Flower's CLI state (the managed local SuperLink, run history) stays inside the project.
export FLWR_HOME="${FLWR_HOME:-$PWD/.flwr}"
export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1  # deps are installed above; offline-safe

status=0
flwr run . --stream \
  --federation-config "num-supernodes=10 client-resources-num-cpus=1" "$@" || status=$?

# `flwr run` leaves its managed local SuperLink running; stop the one this script started.
pkill -f -- "$FLWR_HOME/local-superlink" 2>/dev/null || true
echo "results: $(ls -td "$PWD"/results/*/ 2>/dev/null | head -1)"
exit "$status"
