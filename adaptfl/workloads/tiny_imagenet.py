"""Tiny-ImageNet (200 classes, 64x64 RGB) from the layout of the official zip.

    tiny-imagenet-200/wnids.txt                      one WordNet id per line = the class order
    tiny-imagenet-200/train/<wnid>/images/*.JPEG     500 per class
    tiny-imagenet-200/val/images/*.JPEG              10 000 images
    tiny-imagenet-200/val/val_annotations.txt        <file>\t<wnid>\t<box...> per line

The val split serves as the test split (the official test labels are not public). JPEG
decoding of 110k files takes a few minutes; results are cached per process.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .image_data import ImageData

TINY_IMAGENET_FOLDER = "tiny-imagenet-200"
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_IMAGENET_SIZE = 64
# ImageNet's per-channel statistics on the [0, 1] scale (Tiny-ImageNet is a subset).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_tiny_imagenet(root: str, download: bool = False) -> tuple[ImageData, ImageData]:
    """(train, val-as-test) from `root`/tiny-imagenet-200; `download` fetches the zip first
    when the folder is missing (needs a network)."""
    if not root:
        raise ValueError("load_tiny_imagenet needs a root folder, got an empty string")
    folder = Path(root).expanduser().resolve() / TINY_IMAGENET_FOLDER
    if not (folder / "wnids.txt").is_file() and download:
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(TINY_IMAGENET_URL, download_root=str(folder.parent))
    if not (folder / "wnids.txt").is_file():
        raise ValueError(f"Tiny-ImageNet not found: {str(folder / 'wnids.txt')!r} is missing; "
                         f"extract {TINY_IMAGENET_URL} into {root!r}")
    return _load_cached(str(folder))


@lru_cache(maxsize=2)
def _load_cached(folder: str) -> tuple[ImageData, ImageData]:
    root = Path(folder)
    wnids = [line.strip() for line in (root / "wnids.txt").read_text().splitlines() if line.strip()]
    class_of = {wnid: i for i, wnid in enumerate(wnids)}
    train_files = [(path, class_of[wnid]) for wnid in wnids
                   for path in sorted((root / "train" / wnid / "images").glob("*.JPEG"))]
    val_files = []
    for line in (root / "val" / "val_annotations.txt").read_text().splitlines():
        fields = line.split("\t")
        if len(fields) < 2:
            continue
        if fields[1] not in class_of:
            raise ValueError(f"val_annotations.txt names class {fields[1]!r} absent from wnids.txt")
        val_files.append((root / "val" / "images" / fields[0], class_of[fields[1]]))
    return _to_image_data(train_files, len(wnids)), _to_image_data(val_files, len(wnids))


def _to_image_data(files: list[tuple[Path, int]], num_classes: int) -> ImageData:
    from PIL import Image  # torchvision's dependency

    images = np.empty((len(files), TINY_IMAGENET_SIZE, TINY_IMAGENET_SIZE, 3), dtype=np.uint8)
    for row, (path, _) in enumerate(files):
        with Image.open(path) as image:  # a few files are greyscale: convert all to RGB
            pixels = np.asarray(image.convert("RGB"))
        if pixels.shape != images.shape[1:]:
            raise ValueError(f"{path}: {pixels.shape} pixels, expected {images.shape[1:]}")
        images[row] = pixels
    return ImageData(images=torch.from_numpy(images.transpose(0, 3, 1, 2).copy()),
                     labels=torch.tensor([label for _, label in files], dtype=torch.int64),
                     num_classes=num_classes, mean=IMAGENET_MEAN, std=IMAGENET_STD)
