"""In-memory image classification data shared by every workload."""

from __future__ import annotations

from dataclasses import dataclass

import torch


# eq=False: tensors do not support a boolean ``==``, and identity equality is
# what callers of a cached, immutable dataset expect anyway.
@dataclass(frozen=True, eq=False)
class ImageData:
    """A labelled image set kept as compact uint8 tensors.

    Images stay uint8 in memory (Fashion-MNIST train is 47 MB this way, 188 MB
    as float32); :meth:`batch` converts only the rows a training step needs.
    """

    deterministic_batches = True  # batch() is a pure function of its rows: preloads may be kept

    images: torch.Tensor  # uint8 [N, C, H, W]
    labels: torch.Tensor  # int64 [N]
    num_classes: int
    mean: tuple[float, ...]  # per channel, on the [0, 1] scale
    std: tuple[float, ...]  # per channel, on the [0, 1] scale

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(
                f"images must be uint8 [N, C, H, W], got {self.images.dtype} "
                f"with shape {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            raise ValueError(
                f"labels must be int64 [N], got {self.labels.dtype} "
                f"with shape {tuple(self.labels.shape)}"
            )
        if len(self.labels) != len(self.images):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        self._check_label_range()
        self._check_channel_stats()

    def _check_label_range(self) -> None:
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if len(self.labels) == 0:
            return
        low, high = int(self.labels.min()), int(self.labels.max())
        if low < 0 or high >= self.num_classes:
            raise ValueError(f"labels span [{low}, {high}], outside [0, {self.num_classes - 1}]")

    def _check_channel_stats(self) -> None:
        channels = self.in_channels
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(
                f"mean {self.mean} and std {self.std} need one value per channel ({channels})"
            )
        if min(self.std) <= 0:
            raise ValueError(f"std values must be > 0, got {self.std}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def in_channels(self) -> int:
        """Number of colour channels (1 for Fashion-MNIST, 3 for CIFAR)."""
        return int(self.images.shape[1])

    @property
    def image_size(self) -> int:
        """Side length of the (square) images in pixels."""
        return int(self.images.shape[2])

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return normalized float32 images and int64 labels for rows ``idx``.

        Pixels are scaled to [0, 1], then standardized with this dataset's
        per-channel ``mean`` and ``std``.
        """
        rows = torch.as_tensor(idx, dtype=torch.int64)
        images = self.images[rows].to(torch.float32).div_(255.0)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
        return images.sub_(mean).div_(std), self.labels[rows]
