"""Flower's images for the compose demo: pulled, or stand-ins built here when Docker Hub is out
of reach (as on this project's machines).

    python -m adaptfl.deploy.stand_in     # after `python -m adaptfl.deploy.wheelhouse deploy/wheelhouse`

A stand-in is deploy/flower-stand-in.Dockerfile on a Debian 12 root filesystem made by
`debootstrap --variant=minbase` and `docker import`, with flwr from the host-built wheelhouse.
It carries the label org.adaptfl.stand-in, so it is never mistaken for Flower's image.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from adaptfl import source as where
from adaptfl.deploy.dockerd import DOCKER
from adaptfl.deploy.layout import PROJECT, STAND_IN_DOCKERFILE, WHEELHOUSE

# Flower's tag for its Python 3.11 build; the bare `1.42.0` is its newest Python (3.13), outside
# adaptfl's requires-python. deploy/Dockerfile and the compose files name the same tag.
FLOWER_TAG = "1.42.0-py3.11-ubuntu24.04"
FLOWER_IMAGES = {name: f"flwr/{name}:{FLOWER_TAG}" for name in ("superlink", "supernode", "superexec")}
ROOTFS_IMAGE = "adaptfl-stand-in/debian:bookworm-minbase"
ROOTFS_PACKAGES = "python3,python3-venv,ca-certificates,libsqlite3-0"
OUTCOMES = ("Flower images present", "Flower images pulled", "Docker Hub unreachable")


def _docker(*args: str, timeout: float = 1800, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=env)


def have_image(name: str) -> bool:
    return _docker("image", "inspect", name, timeout=60).returncode == 0


def ensure_flower_images(workdir: Path, after_step: Callable[[], None] = lambda: None) -> str:
    """Make FLOWER_IMAGES available; say whether they were there, pulled or stood in for."""
    where.checkout("python -m adaptfl.deploy.stand_in")
    missing = [image for image in FLOWER_IMAGES.values() if not have_image(image)]
    if not missing:
        return "Flower images present"
    if all(_docker("pull", image, timeout=600).returncode == 0 for image in missing):
        return "Flower images pulled"
    wheelhouse = WHEELHOUSE / "requirements.txt"
    if not wheelhouse.exists():
        raise FileNotFoundError(f"{wheelhouse} is missing: run python -m adaptfl.deploy.wheelhouse "
                                "deploy/wheelhouse first")
    print("[stand-in] Docker Hub unreachable: building stand-ins for Flower's images", flush=True)
    if not have_image(ROOTFS_IMAGE):
        import_rootfs(workdir / "rootfs")
        after_step()
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    for target, image in FLOWER_IMAGES.items():
        done = _docker("build", "-f", str(STAND_IN_DOCKERFILE),
                       "--target", target, "-t", image, str(PROJECT), env=env)
        if done.returncode != 0:
            raise RuntimeError(f"building the stand-in {image} failed: {done.stderr[-3000:]}")
    after_step()
    return "Docker Hub unreachable, stand-in Flower images built"


def import_rootfs(rootfs: Path) -> None:
    """debootstrap a minimal Debian 12 with Python 3.11 and import it as ROOTFS_IMAGE."""
    subprocess.run(["debootstrap", "--variant=minbase", f"--include={ROOTFS_PACKAGES}", "bookworm",
                    str(rootfs)], check=True, capture_output=True, timeout=1800)  # Debian's mirror
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    done = subprocess.run([DOCKER, "import", "-", ROOTFS_IMAGE], stdin=tar.stdout,
                          capture_output=True, timeout=600, check=False)
    tar.wait()
    subprocess.run(["rm", "-rf", str(rootfs)], check=True)  # root-owned files: rm, not Python
    if done.returncode != 0 or tar.returncode != 0:
        raise RuntimeError(f"docker import failed: {done.stderr.decode()[-2000:]}")


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="adaptfl-stand-in-") as workdir:
        print(ensure_flower_images(Path(workdir)))


if __name__ == "__main__":
    main()
