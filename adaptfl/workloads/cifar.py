"""CIFAR-10 / CIFAR-100 through torchvision's on-disk python format."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .image_data import ImageData

# Per-channel pixel statistics of each training set on the [0, 1] scale.
CIFAR_STATS: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {
    10: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    100: ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def load_cifar(root: str, num_classes: int = 10, download: bool = False) -> tuple[ImageData, ImageData]:
    """Return the (train, test) splits of CIFAR-10 or CIFAR-100.

    ``root`` is the folder holding ``cifar-10-batches-py`` or
    ``cifar-100-python`` as torchvision extracts them. Nothing is downloaded
    unless ``download`` is set (needs a network; torchvision checks the md5).
    Results are cached per process, resolved root and class count.
    The cached tensors are shared between callers: treat them as read-only.
    """
    if num_classes not in CIFAR_STATS:
        raise ValueError(f"num_classes must be 10 or 100, got {num_classes!r}")
    if not root:
        raise ValueError("load_cifar needs a root folder, got an empty string")
    if download:
        from torchvision.datasets import CIFAR10, CIFAR100

        (CIFAR10 if num_classes == 10 else CIFAR100)(root, train=True, download=True)
    return _load_cifar_cached(str(Path(root).expanduser().resolve()), num_classes)


@lru_cache(maxsize=4)
def _load_cifar_cached(resolved_root: str, num_classes: int) -> tuple[ImageData, ImageData]:
    return (
        _load_split(resolved_root, num_classes, train=True),
        _load_split(resolved_root, num_classes, train=False),
    )


def _load_split(root: str, num_classes: int, train: bool) -> ImageData:
    from torchvision.datasets import CIFAR10, CIFAR100  # heavy import, load lazily

    dataset_class = CIFAR10 if num_classes == 10 else CIFAR100
    try:
        dataset = dataset_class(root, train=train, download=False)
    except RuntimeError as err:  # torchvision's "not found or corrupted"
        raise ValueError(
            f"CIFAR-{num_classes} files missing or corrupted under "
            f"{str(Path(root) / dataset_class.base_folder)!r}; extract "
            f"{dataset_class.filename} into {root!r} (or run with an empty data-dir where a network exists)"
        ) from err
    mean, std = CIFAR_STATS[num_classes]
    return ImageData(
        # torchvision keeps HWC uint8; models want CHW.
        images=torch.from_numpy(np.ascontiguousarray(dataset.data.transpose(0, 3, 1, 2))),
        labels=torch.as_tensor(np.asarray(dataset.targets, dtype=np.int64)),
        num_classes=num_classes,
        mean=mean,
        std=std,
    )
