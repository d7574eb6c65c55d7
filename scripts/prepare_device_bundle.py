"""Make what `scripts/device_check.sh` needs on the GPU machine and that machine lacks
(../shared/notes/device.md): run it here, where the network, Fashion-MNIST and ssh-keygen are.

    python scripts/prepare_device_bundle.py [--train-images 40000] [--skip-wheels]

- `.whl/`: the wheels of flwr 1.42, flwr-datasets, pytorch-optimizer, sophia-opt, pytest and
  those of their dependencies the GPU machine lacks (CPython 3.12, manylinux x86_64; ~30 MB);
- `.device-data/fashion-mnist/`: the first N training images and the whole test split, as the
  IDX files `data-dir` reads (40,000 images: about 21 MB);
- `.device-certs/`: deploy/generate-certs.sh's certificates and keys for 2 SuperNodes.
All three are git-ignored; carry them with the command (the device tool's `carry`, 64 MiB in all):
    carry: [".whl", ".device-data", ".device-certs"]
    command: bash scripts/device_check.sh --out $OUT
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ["flwr==1.42.0", "flwr-datasets==0.6.1", "pytorch-optimizer==4.1.0", "sophia-opt==0.2.2",
                "pytest>=8"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
# the distributions the GPU machine lacks (device.md); the rest of the download is there already
NEEDED = """flwr flwr_datasets pytorch_optimizer sophia_opt alembic certifi click cryptography
datasets fastapi grpcio grpcio_health_checking iterators packaging pathspec prompt_toolkit
protobuf pycryptodome rich starlette tomli tomli_w typer annotated_doc anyio cffi dill greenlet
h11 multiprocess pydantic pydantic_core pycparser shellingham sqlalchemy typing_extensions
typing_inspection wcwidth mako uvicorn annotated_types markdown_it_py mdurl
pytest pluggy iniconfig pygments""".split()  # pytest: not known to be there; the check's tests need it
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
GENERATE_CERTS = ROOT / "deploy" / "generate-certs.sh"
# What it makes, where scripts/device_check.sh looks for them (tests/deploy/test_deploy_paths.py)
WHEELS, DATA, CERTS = ROOT / ".whl", ROOT / ".device-data" / "fashion-mnist", ROOT / ".device-certs"


def wheels(target: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        # cp312 wheels: the GPU machine's Python, whatever this one runs (needs PyPI or a mirror
        # that has them; a cp311-only mirror fails here, naming the first missing wheel)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                        "--timeout", "30", "--retries", "1",
                        "--python-version", "3.12", "--implementation", "cp", *platforms,
                        "-d", tmp, *REQUIREMENTS], check=True)
        target.mkdir(exist_ok=True)
        kept = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            if wheel.name.split("-")[0].lower() in NEEDED:
                shutil.copy2(wheel, target / wheel.name)
                kept.append(wheel.name)
    missing = sorted(set(NEEDED) - {w.split("-")[0].lower() for w in kept})
    if missing:
        raise SystemExit(f"pip download gave no wheel for {missing}")
    size = sum(f.stat().st_size for f in target.glob("*.whl")) / 2**20
    print(f"{target}: {len(kept)} wheels, {size:.1f} MiB")


def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + np.ascontiguousarray(array).tobytes())


def data(target: Path, train_images: int) -> None:
    if not FASHION_MNIST.is_dir():
        raise SystemExit(f"{FASHION_MNIST} missing (apt-get install dataset-fashion-mnist)")
    target.mkdir(parents=True, exist_ok=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        array = _idx(FASHION_MNIST / f"{name}.gz")
        _write_idx(target / f"{name}.gz", array[:train_images] if name.startswith("train") else array)
    size = sum(f.stat().st_size for f in target.iterdir()) / 2**20
    print(f"{target}: {train_images} training images and the test split, {size:.1f} MiB")


def certs(target: Path) -> None:
    subprocess.run(["bash", str(GENERATE_CERTS), str(target), "2"], check=True, capture_output=True,
                   timeout=180)
    print(f"{target}: certificates and keys for a SuperLink, the Fleet proxy and 2 SuperNodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-images", type=int, default=40_000)
    parser.add_argument("--skip-wheels", action="store_true", help="no download (offline)")
    args = parser.parse_args()
    if not args.skip_wheels:
        wheels(WHEELS)
    data(DATA, args.train_images)
    certs(CERTS)
    carry = [str(p.relative_to(ROOT).parts[0]) for p in (WHEELS, DATA, CERTS)]
    print(f"carry: {json.dumps(carry)}; command: bash scripts/device_check.sh --out $OUT")


if __name__ == "__main__":
    main()
