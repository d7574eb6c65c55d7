"""Fashion-MNIST from IDX files, found locally or downloaded once."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .idx import read_idx_file
from .image_data import ImageData

FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# Where the Debian package dataset-fashion-mnist installs the files.
SYSTEM_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = 10
# Pixel statistics of the training set on the [0, 1] scale.
FASHION_MNIST_MEAN = (0.2860,)
FASHION_MNIST_STD = (0.3530,)


def default_cache_dir() -> Path:
    """Folder that adaptfl may download datasets into."""
    return Path("~/.cache/adaptfl").expanduser()


def load_fashion_mnist(data_dir: str = "") -> tuple[ImageData, ImageData]:
    """Return the (train, test) splits of Fashion-MNIST.

    Search order: ``data_dir`` when given (it must hold the four IDX files,
    gzipped or not), then the Debian package folder, then a torchvision
    download into ``~/.cache/adaptfl``. Results are cached per process and
    per resolved folder, so simulated clients can call this every round.
    The cached tensors are shared between callers: treat them as read-only.
    """
    directory = _locate_fashion_mnist(data_dir)
    return _load_fashion_mnist_dir(str(directory.resolve()))


def find_idx_file(directory: Path, stem: str) -> Path | None:
    """Return ``directory/stem`` or ``directory/stem.gz``, whichever exists."""
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _missing_files(directory: Path) -> list[str]:
    return [stem for stem in FASHION_MNIST_FILES if find_idx_file(directory, stem) is None]


def _locate_fashion_mnist(data_dir: str) -> Path:
    if data_dir:
        directory = Path(data_dir).expanduser()
        if not directory.is_dir():
            raise ValueError(f"data_dir {str(directory)!r} is not a directory")
        missing = _missing_files(directory)
        if missing:
            raise ValueError(
                f"data_dir {str(directory)!r} lacks Fashion-MNIST file(s) {missing} (plain or .gz)"
            )
        return directory
    if not _missing_files(SYSTEM_FASHION_MNIST_DIR):
        return SYSTEM_FASHION_MNIST_DIR
    return _download_fashion_mnist(default_cache_dir())


def _download_fashion_mnist(cache_dir: Path) -> Path:
    # torchvision stores the IDX files under <root>/FashionMNIST/raw.
    raw_dir = cache_dir / "FashionMNIST" / "raw"
    if not _missing_files(raw_dir):
        return raw_dir
    try:
        from torchvision.datasets import FashionMNIST

        FashionMNIST(root=str(cache_dir), train=True, download=True)
    except Exception as err:  # any network or extraction failure
        raise RuntimeError(
            "Fashion-MNIST not found locally and the download failed. "
            "Install it with `apt-get install dataset-fashion-mnist` or pass "
            "data-dir pointing at a folder with the four IDX files."
        ) from err
    if _missing_files(raw_dir):
        raise RuntimeError(f"download finished but {raw_dir} is incomplete")
    return raw_dir


@lru_cache(maxsize=4)
def _load_fashion_mnist_dir(resolved_dir: str) -> tuple[ImageData, ImageData]:
    directory = Path(resolved_dir)
    arrays = {}
    for stem in FASHION_MNIST_FILES:
        path = find_idx_file(directory, stem)
        if path is None:  # removed since it was located
            raise ValueError(f"{resolved_dir!r} lacks Fashion-MNIST file {stem!r}")
        arrays[stem] = read_idx_file(path)
    train = _to_image_data(arrays["train-images-idx3-ubyte"], arrays["train-labels-idx1-ubyte"])
    test = _to_image_data(arrays["t10k-images-idx3-ubyte"], arrays["t10k-labels-idx1-ubyte"])
    return train, test


def _to_image_data(images: np.ndarray, labels: np.ndarray) -> ImageData:
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"Fashion-MNIST images must be uint8 [N, H, W], got {images.dtype} "
            f"with shape {images.shape}"
        )
    if labels.ndim != 1:
        raise ValueError(f"Fashion-MNIST labels must be 1-D, got shape {labels.shape}")
    return ImageData(
        images=torch.from_numpy(images).unsqueeze(1),  # add the channel axis
        labels=torch.from_numpy(labels.astype(np.int64)),
        num_classes=FASHION_MNIST_CLASSES,
        mean=FASHION_MNIST_MEAN,
        std=FASHION_MNIST_STD,
    )
