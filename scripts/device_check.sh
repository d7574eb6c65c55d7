#!/usr/bin/env bash
# The CUDA check of adaptfl, in one go on a machine with one NVIDIA GPU (docs/speed.md):
#   bash scripts/device_check.sh [--out DIR] [--data FASHION-MNIST-DIR] [--dry-run]
# From a bare Python with torch: installs the wheels carried in .whl/ when flwr is missing
# (scripts/prepare_device_bundle.py makes .whl/, .device-data/ and .device-certs/), then runs
# every stage under its own timeout, its output in DIR/<stage>.log, and prints one summary
# table (also DIR/summary.md). Stages: the CUDA tests (sync-free step under
# torch.cuda.set_sync_debug_mode("error"), every algorithm's round CUDA vs CPU, the fused
# kernel's device step count, the cohort engine against one client at a time on CUDA), the five
# benchmarks with --device cuda (bench_cohort: 100 clients of the CNN one at a time and as one
# cohort), one `flwr run` simulation round with client-resources-num-gpus=0.25 and one
# loopback-deployment round with device='cuda'. The timeouts add up to 590 s (the device tool's
# limit per command: 600 s);
# measured: 289 s on an H200 (2026-12-04; README, docs/speed.md).
# --dry-run: the same stages on the CPU with small sizes, the two Flower rounds in the background
# beside the others (CI: tests/project/test_device_check.py).
# Exit status: 0 when no stage failed (a stage skipped for a missing dependency is not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)
out=$root/results/device-check
dry=0
data=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --data) data=$(cd "$2" && pwd -P) || exit 2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "device_check: unknown argument $1 (use --out DIR, --data DIR, --dry-run)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd -P)
rows=()
failed=0
started=$SECONDS

# ---- set-up: what the GPU machine lacks (../shared/notes/device.md) -------------------------
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
if ! python3 -c "import flwr, flwr_datasets, pytest" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    site=${TMPDIR:-/tmp}/adaptfl-site
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl \
      > "$out/setup.log" 2>&1 || { echo "device_check: installing .whl/ failed (see $out/setup.log)"; exit 1; }
    export PYTHONPATH=$site:$PYTHONPATH PATH=$site/bin:$PATH
  else
    echo "device_check: flwr is not installed and there is no .whl/ (scripts/prepare_device_bundle.py)" >&2
    exit 1
  fi
fi
if [ -z "$data" ] && [ -d .device-data/fashion-mnist ]; then
  data=$root/.device-data/fashion-mnist
fi
data=${data:-/usr/share/datasets/fashion-mnist}
export ADAPTFL_FASHION_MNIST=$data  # tests/local_update/test_device_paths.py cuts its tiny subset from it

scale=1  # the stages' timeouts are the GPU machine's; a dry run on a shared CPU gets 3 times them
if [ $dry = 1 ]; then
  scale=3; dev=cpu; gpus=0; nodes=2; fedact=(--model cnn --batch 8 --repeats 3 --warmup 1 --round-steps 2 --diagnostics-every 1)
  big=(--model cnn --repeats 3 --warmup 1 --only update); muon=(--model mlp --muon-routing all-2d --steps 2 --threads 1)
  round=(--model mlp --clients 2 --steps 2 --rounds 2 --batch 16); topk=(--numel 100000 --repeats 3)
  cohort=(--model mlp --clients 4 --nodes 4 --steps 3 --rounds 2 --repeats 1)
  tests=(tests/local_update/test_sync_free_step.py tests/local_update/test_device_paths.py -k "fedact and not a_local_step and not fedact-local")
  rounds="local-steps=2 batch-size=16 model='mlp'"
else
  dev=cuda; gpus=0.25; nodes=4; fedact=(--model vit-tiny); big=(--model vit-s --only update)
  muon=(--model vit-tiny --steps 10); round=(--model vit-tiny --clients 10 --steps 50 --rounds 2)
  topk=(); tests=(tests/local_update/test_topk_sync_free.py tests/local_update/test_sync_free_step.py tests/local_update/test_device_paths.py
                  tests/engine/test_cohort_cuda.py)
  cohort=(--model cnn --clients 100 --nodes 100 --steps 10 --rounds 3 --repeats 1)
  rounds="local-steps=10 batch-size=64 model='cnn'"
fi

# stage NAME SECONDS FIGURE-PATTERN COMMAND...: run it under `timeout`, log to $out/NAME.log, and
# keep a summary row: status, seconds, the log's last line matching FIGURE-PATTERN
stage() {
  local name=$1 limit=$2 pattern=$3 t0=$SECONDS status figure
  shift 3
  limit=$((limit * scale))
  echo "device_check: $name (timeout ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  case $? in
    0) status=ok ;;
    124|137) status="TIMEOUT"; failed=1 ;;
    *) status=FAILED; failed=1 ;;
  esac
  figure=$(grep -E "$pattern" "$out/$name.log" | tail -1 | tr '|' '/' | cut -c1-160)
  [ "$status" = ok ] || figure="${figure:-$(tail -1 "$out/$name.log" | tr '|' '/' | cut -c1-160)}"
  rows+=("| $name | $status | $((SECONDS - t0)) | ${figure} |")
}

skip() { rows+=("| $1 | skipped | 0 | $2 |"); }

# beside NAME ...: in a dry run, `stage NAME ...` in the background while the stages after it run
# (the Flower rounds wait on polls and process starts, not on the CPU: the dry run checks that
# each stage passes, its figures mean nothing); on the GPU machine, as `stage`, one at a time.
beside_names=()
beside_pids=()
beside() {
  if [ $dry = 0 ]; then stage "$@"; return; fi
  ( rows=(); stage "$@"; printf '%s\n' "${rows[0]}" > "$out/$1.row"; exit $failed ) &
  beside_names+=("$1")
  beside_pids+=($!)
}

# the rows of the stages run beside the others, in the order they were started
collect_beside() {
  local i
  for i in ${beside_pids[@]+"${!beside_pids[@]}"}; do
    wait "${beside_pids[$i]}" || failed=1
    rows+=("$(cat "$out/${beside_names[$i]}.row" 2>/dev/null || echo "| ${beside_names[$i]} | FAILED | 0 | no row |")")
  done
}

# two nodes in the dry run: rounds of two replies, accepted by name (docs/robustness.md)
# figures=false: the check reads the rounds' times and exit statuses, not their plots
run_config="num-server-rounds=1 $rounds device='$dev' data-dir='$data' accept-small-rounds=true figures=false"  # + results-dir
# one `flwr run` simulation round and one loopback-deployment round: on the GPU machine after
# the others (their timeouts last), in a dry run first, beside the others
flower_stages() {
  if python3 -c "import ray" 2>/dev/null; then
    beside simulation-round 80 "done in|FAILED" \
      env ADAPTFL_SKIP_SETUP=1 ADAPTFL_FLOWER_HOMES="$out/flwr-homes" bash scripts/main_job.sh --federation-config \
      "num-supernodes=$nodes client-resources-num-cpus=2 client-resources-num-gpus=$gpus" \
      --run-config "$run_config results-dir='$out/runs/simulation'"
  else
    skip simulation-round "ray is not installed (flwr[simulation]'s Ray wheel is over what a device call carries)"
  fi
  # certificates made where ssh-keygen exists (the script makes only what is missing)
  mkdir -p "$out/loopback"
  [ -d .device-certs ] && cp -r .device-certs "$out/loopback/certs"
  beside deployment-round 80 "flwr-run-exit" python3 -m adaptfl.deploy.loopback --num-nodes 2 \
    --workdir "$out/loopback" --run-config "$run_config results-dir='$out/runs/deployment'"
}
[ $dry = 1 ] && flower_stages

stage tests 100 "passed|failed" python3 -m pytest -q -p no:cacheprovider -rs "${tests[@]}"
stage bench-fedact-5m 60 "^summary" python3 benchmarks/bench_fedact.py --device $dev "${fedact[@]}"
stage bench-fedact-21m 40 "^summary" python3 benchmarks/bench_fedact.py --device $dev "${big[@]}"
stage bench-muon 40 "^muon" python3 benchmarks/bench_second_order.py --device $dev --only muon "${muon[@]}"
stage bench-round 100 "ratio without" python3 benchmarks/bench_round.py --device $dev "${round[@]}" \
  --data-dir "$data"
stage bench-topk 30 "this device's path|radix \(accel" python3 benchmarks/bench_topk.py --device $dev "${topk[@]}"
stage bench-cohort 60 "^  cohort" python3 benchmarks/bench_cohort.py --device $dev "${cohort[@]}" \
  --forms auto vmap --data-dir "$data"

[ $dry = 0 ] && flower_stages
collect_beside

# ---- the summary ---------------------------------------------------------------------------
{
  echo "device check $(date -u +%Y-%m-%dT%H:%MZ), $([ $dry = 1 ] && echo "dry run on the CPU" || echo "$dev")," \
       "$(python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'),"\
       "$((SECONDS - started)) s"
  echo
  echo "| stage | status | seconds | figure |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
exit $failed
