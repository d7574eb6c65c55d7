"""Build the wheelhouse that deploy/Dockerfile installs from, so image builds dial nothing.

    python -m adaptfl.deploy.wheelhouse deploy/wheelhouse [--torch-index URL]

Writes every wheel that adaptfl needs in a deployment (its dependencies, and the build backend
that `pip install .` needs) into one folder, plus `requirements.txt` naming the top-level ones.
The image then runs `pip install --no-index --find-links <wheelhouse>`: an air-gapped site, or
a network that intercepts TLS, builds the same image as everyone else.

Which torch: whatever this machine's pip resolves for the pinned range (its own index and
find-links settings apply), unless `--torch-index` (Flower's `TORCH_INDEX` convention) names a
wheel index such as https://download.pytorch.org/whl/cpu for a small CPU-only image.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

from adaptfl import source as where

# adaptfl's source checkout: the kit builds images from its tree and `flwr run`s its pyproject.toml.
# An installed wheel has neither; its entry points then stop in one line (adaptfl/source.py: checkout).
PROJECT = where.source_checkout() or Path(__file__).resolve().parents[2]
TORCH_PACKAGES = ("torch", "torchvision")
# The image's C compiler, for FedACT's native CPU loops (adaptfl/local_update/native.py compiles
# them on first use for the node's own CPU): Flower's images have none and apt would dial out,
# while zig's clang comes as a wheel like any other (docs/deployment.md: the step path).
IMAGE_COMPILER = "ziglang>=0.13"


def deployment_requirements(pyproject: Path = PROJECT / "pyproject.toml") -> list[str]:
    """pyproject's dependencies and build backend, without the simulation extra of flwr, and the
    image's C compiler.

    A deployment runs no simulation, and the extra pulls Ray (hundreds of MB) into the image.
    """
    data = tomllib.loads(pyproject.read_text())
    deps = [d.replace("flwr[simulation]", "flwr") for d in data["project"]["dependencies"]]
    return [*deps, *data["build-system"]["requires"], IMAGE_COMPILER]


def _is_torch(requirement: str) -> bool:
    name = requirement.split(";")[0].strip()
    return any(name.startswith(p) and not name[len(p):][:1].isalnum() for p in TORCH_PACKAGES)


def build(out: Path, torch_index: str = "") -> list[str]:
    """pip wheel every requirement into `out`; returns the requirements written."""
    where.checkout("python -m adaptfl.deploy.wheelhouse")
    out.mkdir(parents=True, exist_ok=True)
    requirements = deployment_requirements()
    torch_reqs = [r for r in requirements if _is_torch(r)]
    if torch_index:  # torch from its own index first, so the main resolve finds it in `out`
        _pip_wheel(out, torch_reqs, ["--index-url", torch_index])
    _pip_wheel(out, requirements, ["--find-links", str(out)])
    (out / "requirements.txt").write_text("\n".join(requirements) + "\n")
    return requirements


def _pip_wheel(out: Path, requirements: list[str], extra: list[str]) -> None:
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(out), *extra,
            *requirements]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel failed ({done.returncode}): {done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for the wheels, e.g. deploy/wheelhouse")
    parser.add_argument("--torch-index", default="", help="wheel index for torch/torchvision")
    args = parser.parse_args()
    build(args.out, args.torch_index)
    size = sum(f.stat().st_size for f in args.out.glob("*.whl")) / 2**30
    print(f"wheelhouse {args.out}: {len(list(args.out.glob('*.whl')))} wheels, {size:.1f} GiB")


if __name__ == "__main__":
    main()
