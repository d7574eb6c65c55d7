#!/usr/bin/env bash
# Set up adaptfl and run the main job: FedACT on Fashion-MNIST, 10 simulated clients,
# Dirichlet α=0.3. Extra arguments go to `flwr run`, e.g.
#   scripts/main_job.sh --run-config "algorithm='fedadamw'"
# ADAPTFL_SKIP_SETUP=1 skips the apt/pip set-up (tests, repeated runs); ADAPTFL_FLOWER_HOMES
# moves the per-invocation Flower homes (default .flwr/runs). RAY_ADDRESS=<head>:<port> runs the
# simulation on that running Ray cluster (`ray start --head` / `ray start --address=...`) instead
# of a Ray of its own, e.g. (docs/scale.md):
#   RAY_ADDRESS=10.0.0.1:6379 scripts/main_job.sh \
#     --federation-config "num-supernodes=1000 client-resources-num-cpus=2 client-resources-num-gpus=0.5" \
#     --run-config "fraction-train=0.05 client-state-dir='/shared/adaptfl-state'"
#
# Each invocation starts its own Flower SuperLink (private FLWR_HOME under .flwr/runs/<id>/,
# a free port), so concurrent main jobs never share one, and stops exactly that SuperLink by
# PID. `flwr run --stream` exits 0 even when the run fails, so the run's status is asked from
# the SuperLink (`flwr ls --run-id`) and becomes this script's exit status.
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."
checkout=$(pwd -P)

say() { echo "main_job: $*"; }
die() { echo "main_job: error: $*" >&2; exit 1; }

# ---- set-up: what the main job and the README's test command need ----------------------------
apt_packages=(dataset-fashion-mnist                       # the main job's data
              fortunes fortunes-de fortunes-es fortunes-it  # the offline text corpus (tests)
              openssl openssh-client)                       # TLS and SuperNode keys (deploy tests)

install_apt_packages() {
  local missing=() p
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && { say "Debian packages present: ${apt_packages[*]}"; return; }
  command -v apt-get >/dev/null || die "apt-get not found; install these Debian packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "need root or sudo to apt-get install ${missing[*]}"
    sudo=(sudo)
  fi
  say "installing Debian packages: ${missing[*]} (apt-get update + install, about a minute)"
  "${sudo[@]}" apt-get update -qq || die "apt-get update failed (see above)"
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" \
    || die "apt-get install ${missing[*]} failed (see above)"
}

install_python_packages() {
  if python -c "import importlib.util as u; exit(u.find_spec('torch') is None)"; then
    say "pip install -e '.[test]' (torch already installed: usually under 30 s)"
  else
    # Linux wheels of torch pull NVIDIA's CUDA libraries even on machines without a GPU.
    say "pip install -e '.[test]': first install downloads torch with ~3.2 GB of CUDA libraries;" \
        "this can take many minutes (CPU-only machine: stop, run scripts/install_cpu_torch.sh, start again)"
  fi
  # pip's download and install lines show progress; the ~60 'already satisfied' lines do not.
  python -m pip install -e ".[test]" --config-settings editable_mode=compat 2>&1 | { grep -v '^Requirement already satisfied' || true; } \
    || die "pip install -e '.[test]' failed (see above)"
}

if [ "${ADAPTFL_SKIP_SETUP:-0}" = 1 ]; then
  say "ADAPTFL_SKIP_SETUP=1: skipping apt and pip"
else
  install_apt_packages
  install_python_packages
fi

# Flower's simulation imports the app from its bundle, but a ClientApp imported while the
# ServerApp's thread is still inside adaptfl/__init__.py can come from the installed checkout.
# (-I: look at the installed package, not at this folder's own adaptfl.egg-info.)
installed=$(python -I -c 'import json
from importlib import metadata
try:
    print(json.loads(metadata.distribution("adaptfl").read_text("direct_url.json") or "{}")["url"][7:])
except Exception:
    print("")')
[ "$installed" = "$checkout" ] || say "warning: adaptfl is installed from ${installed:-elsewhere}," \
  "not from $checkout: Flower may run parts of that copy (run without ADAPTFL_SKIP_SETUP=1)"

# ---- the arguments: check the user's run config before Flower sees it ------------------------
user_configs=()  # the --run-config values, TOML paths made absolute (we cd'ed to the checkout)
other_args=()    # everything else goes to `flwr run` unchanged
while [ $# -gt 0 ]; do
  case $1 in
    --run-config|-c) [ $# -ge 2 ] || die "$1 needs a value"; value=$2; shift 2 ;;
    --run-config=*) value=${1#*=}; shift ;;
    *) other_args+=("$1"); shift; continue ;;
  esac
  if [[ $value == *.toml ]]; then
    [[ $value == /* ]] || value=$caller_dir/$value
    [ -f "$value" ] || die "--run-config file not found: $value"
  fi
  user_configs+=("$value")
done

# The simulated nodes (the last num-supernodes of a --federation-config, else our 10): the
# preflight's checks that need the population (dp's planned ε, its count noise) run with them.
supernodes=10
for ((i = 0; i < ${#other_args[@]}; i++)); do
  case ${other_args[i]} in
    --federation-config) value=${other_args[i + 1]:-} ;;
    --federation-config=*) value=${other_args[i]#*=} ;;
    *) continue ;;
  esac
  [[ $value =~ num-supernodes=([0-9]+) ]] && supernodes=${BASH_REMATCH[1]}
done

check_args=(--nodes "$supernodes")
for value in ${user_configs[@]+"${user_configs[@]}"}; do check_args+=(--run-config "$value"); done
# One line naming the key and what is allowed (Flower itself says "Invalid run configuration"),
# then the ServerApp's own preflight (load the task, build the model, one client step), so a
# missing data file or a model that does not fit is one line in seconds, before any Flower
# process or run folder exists. Exit 2: refused; 1: the check itself crashed (core/exit_codes.py).
start=$SECONDS  # "done in N s" counts from here: the check, the SuperLink and the run
say "checking the run config, the task and the model (the ServerApp's preflight)"
merged=$(python -m adaptfl.server_app.check_overrides ${check_args[@]+"${check_args[@]}"} \
           --preflight --get algorithm --get run-name --get results-dir) || exit $?
mapfile -t got <<<"$merged"  # one value a line; $(...) dropped the trailing empty ones
algorithm=${got[0]} run_name=${got[1]:-} results_dir=${got[2]:-}

# ---- this invocation's id, Flower home and results folder -----------------------------------
id="$(date +%Y%m%d-%H%M%S)-$$"
home="${ADAPTFL_FLOWER_HOMES:-$checkout/.flwr/runs}/$id"
mkdir -p "$home"
# Name the run unless the user did, so the folder printed at the end is this run's.
extra=()
if [ -z "$run_name" ]; then run_name="$algorithm-$id"; extra+=("run-name='$run_name'"); fi
if [ -z "$results_dir" ]; then
  results_dir="$checkout/results"
  [[ $results_dir != *"'"* ]] || die "the checkout path contains a quote; pass results-dir yourself"
  extra+=("results-dir='$results_dir'")
fi
run_dir="$results_dir/$run_name"

run_configs=()
for value in ${user_configs[@]+"${user_configs[@]}"}; do
  if [[ $value == *.toml ]] && [ ${#extra[@]} -gt 0 ]; then
    # Flower takes a TOML file only on its own: give it a copy with our keys appended.
    cp "$value" "$home/run-config.toml"
    printf '\n%s\n' "${extra[@]}" >>"$home/run-config.toml"
    value=$home/run-config.toml extra=()
  fi
  run_configs+=(--run-config "$value")
done
[ ${#extra[@]} -eq 0 ] || run_configs+=(--run-config "${extra[*]}")

# ---- a private SuperLink, stopped by PID whatever happens ------------------------------------
export FLWR_HOME="$home" FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1  # deps are installed above; offline-safe
export PYTHONUNBUFFERED=1  # Flower's streamed lines appear as they come, through `tee`
port=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
# An explicit address (not ":local:"): `flwr` then never starts a SuperLink of its own.
printf '[superlink]\ndefault = "main-job"\n\n[superlink.main-job]\naddress = "127.0.0.1:%s"\ninsecure = true\n' \
  "$port" >"$home/config.toml"

superlink_pid="" flwr_pid="" superexec_groups=""
stop_all() {
  # `flwr run --stream` holds a connection the SuperLink waits for on shutdown: end it first.
  [ -z "$flwr_pid" ] || kill -TERM "$flwr_pid" 2>/dev/null || true
  # The SuperLink's SuperExec leads its own process group, where the simulation and Ray run. Cut
  # short, they outlive the SuperLink; stopped while it still answers, they exit cleanly.
  local groups="$superexec_groups ${superlink_pid:+$(pgrep -P "$superlink_pid" || true)}" group
  for group in $groups; do kill -TERM -- "-$group" 2>/dev/null || true; done
  [ -n "$superlink_pid" ] && kill -TERM "$superlink_pid" 2>/dev/null || true
  for _ in $(seq 60); do
    kill -0 "$superlink_pid" 2>/dev/null || break
    sleep 0.25
  done
  kill -KILL "$superlink_pid" 2>/dev/null || true  # ignored SIGTERM for 15 s
  for group in $groups; do
    for _ in $(seq 40); do kill -0 -- "-$group" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$group" 2>/dev/null || true  # its graceful exit hung on the gone SuperLink
  done
}
trap stop_all EXIT
trap 'say "interrupted: stopping the Flower processes this job started"; exit 130' INT
trap 'say "terminated: stopping the Flower processes this job started"; exit 143' TERM

say "starting a private Flower SuperLink on 127.0.0.1:$port (its logs: ${home#"$checkout"/}/)"
flower-superlink --insecure --simulation --isolation subprocess --host 127.0.0.1 --port "$port" \
  --database "$home/state.db" --log-file "$home/superlink.log" \
  --disable-runtime-dependency-installation >"$home/superlink.out" 2>&1 &
superlink_pid=$!
ready=""
for _ in $(seq 120); do
  kill -0 "$superlink_pid" 2>/dev/null \
    || die "the SuperLink exited at start; see $home/superlink.out and superlink.log"
  python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
    2>/dev/null && { ready=1; break; }
  sleep 0.5
done
[ -n "$ready" ] || die "the SuperLink did not answer on port $port within a minute; see $home/superlink.log"
# Its SuperExec, known now: a Ctrl-C can stop the SuperLink before the trap asks for its children.
superexec_groups=$(pgrep -P "$superlink_pid" || true)

# ---- the run -------------------------------------------------------------------------------
say "flwr run . --stream ($supernodes simulated clients, set here with num-supernodes: Flower's" \
  "warning that its default changed from 10 to 2 is printed for every simulation)"
[ -z "${RAY_ADDRESS:-}" ] || say "the simulation attaches to the Ray cluster at RAY_ADDRESS=$RAY_ADDRESS"
say "results will go to $run_dir"
say "Flower's log follows (also in ${home#"$checkout"/}/flwr-run.log); round 1 waits ~20 s for Ray and torch"
exec {log_fd}> >(tee "$home/flwr-run.log")  # the screen and a file
tee_pid=$!
# In the background, so that a signal to this script reaches the trap at once.
flwr run . --stream --federation-config "num-supernodes=10 client-resources-num-cpus=1" \
  ${other_args[@]+"${other_args[@]}"} "${run_configs[@]}" >&"$log_fd" 2>&1 &
flwr_pid=$!
flwr_status=0
wait "$flwr_pid" || flwr_status=$?
flwr_pid=""
exec {log_fd}>&-
while kill -0 "$tee_pid" 2>/dev/null; do sleep 0.1; done  # Flower's last lines come first

run_id=$(sed -n 's/.*Successfully started run \([0-9][0-9]*\).*/\1/p' "$home/flwr-run.log" | head -1)
[ -n "$run_id" ] || die "Flower did not start the run (flwr run exited $flwr_status; its message is above)"

# `flwr run` exits 0 however the run ended: ask the SuperLink. The stream normally ends with the
# run; if it ended early, wait for the run as long as the SuperLink lives.
run_status() {
  flwr ls --run-id "$run_id" --format json 2>/dev/null | python -c '
import json, sys
run = json.load(sys.stdin)["runs"][0]
print(run["status"] + "\t" + " ".join(run["status-details"].split()))' 2>/dev/null
}
waiting=""
while :; do
  kill -0 "$superlink_pid" 2>/dev/null \
    || die "the SuperLink stopped before Flower run $run_id ended; see $home/superlink.log"
  IFS=$'\t' read -r status details < <(run_status) \
    || die "could not ask the SuperLink about Flower run $run_id; see $home/superlink.log"
  [[ $status == finished:* ]] && break
  [ -n "$waiting" ] || say "Flower's stream ended before run $run_id did ($status): waiting for it"
  waiting=1
  sleep 2
done
printf 'flower-run-id=%s\nstatus=%s\nresults=%s\n' "$run_id" "$status" "$run_dir" >"$home/run.txt"

if [ "$status" != finished:completed ]; then
  # Under load the SuperLink can mark the run failed ("No heartbeat received") before the
  # ServerApp reports its exception; the exception is still in the streamed log: name it.
  raised=$(grep -E '^[A-Za-z_][A-Za-z0-9_.]*(Error|Exception|Aborted): ' "$home/flwr-run.log" | tail -1 || true)
  [ -z "$raised" ] || [[ $details == *"${raised#*: }"* ]] || details="${details:+$details; }the ServerApp raised $raised"
  echo "main_job: FAILED: Flower run $run_id ${status#finished:}: ${details:-no details}" \
       "(log: $home/flwr-run.log)" >&2
  exit 1
fi
[ -d "$run_dir" ] || die "Flower run $run_id completed but $run_dir does not exist"
say "done in $((SECONDS - start)) s: Flower run $run_id completed; results: $run_dir"
# the ServerApp's warning that the final model tests worse than the initial one, last
worse=$(grep -F "is below the initial model's" "$home/flwr-run.log" | tail -1 || true)
[ -z "$worse" ] || echo "main_job: warning: ${worse#*: }" >&2
