#!/usr/bin/env bash
# The CPU-only build of torch and torchvision (about 200 MB instead of PyPI's ~3.2 GB of CUDA
# libraries), from PyTorch's own index; then `pip install -e ".[test]"` keeps it. Extra
# arguments go to pip (e.g. --dry-run). ADAPTFL_TORCH_CPU_INDEX names a mirror of the index.
#
# Where the index cannot be reached, pip says only `No matching distribution found` (or, with
# other indexes configured, falls back to PyPI's CUDA build and fails on one of its CUDA
# dependencies, e.g. `cuda-bindings`): this script asks the index first and says what happened
# and what to do. The `+cpu` versions exist only on that index, so nothing else can stand in.
set -euo pipefail
TORCH=2.14.1 TORCHVISION=0.29.1  # pyproject.toml's caps (tests/project/test_install_cpu_torch.py)
index=${ADAPTFL_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

say() { echo "install_cpu_torch: $*" >&2; }
alternatives() {
  say "what to do instead, any one of:"
  say "  pip install -e \".[test]\"   # torch from PyPI: works on CPU too, but downloads ~3.2 GB of CUDA libraries"
  say "  ADAPTFL_TORCH_CPU_INDEX=<a mirror of $index> $0"
  say "  pip install <torch-$TORCH+cpu wheel> <torchvision-$TORCHVISION+cpu wheel>   # wheels copied from elsewhere"
}

# Ask the index for torch's page (15 s): unreachable, refused, proxy error... named here.
if ! why=$(python - "$index/torch/" <<'PY' 2>&1
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=15).close()
except Exception as err:  # noqa: BLE001 - any failure is the answer
    print(" ".join(str(getattr(err, "reason", err)).split()))
    sys.exit(1)
PY
); then
  say "PyTorch's CPU-only index $index cannot be reached from this machine ($why);" \
      "nothing was installed."
  alternatives
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
say "pip install torch==$TORCH+cpu torchvision==$TORCHVISION+cpu --index-url $index"
if ! python -m pip install "torch==$TORCH+cpu" "torchvision==$TORCHVISION+cpu" --index-url "$index" "$@" \
     2>&1 | tee "$log"; then
  error=$(grep -E '^ERROR: ' "$log" | head -1 || true)
  say "pip could not install the CPU build from $index (${error:-see the output above}):" \
      "the index answers but does not offer torch $TORCH+cpu for this Python and platform" \
      "(python $(python -c 'import platform; print(platform.python_version(), platform.machine())'))."
  alternatives
  exit 1
fi
say "done: torch $TORCH+cpu; now: pip install -e \".[test]\" (pip keeps this torch)"
