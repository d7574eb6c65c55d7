"""Tabular classification data: float features and int64 labels, kept in memory.

Features are standardised with the TRAIN split's mean and std (both splits alike), so an MLP
trains at the presets' learning rates whatever the columns' units are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


# eq=False: tensors have no boolean ``==``; a loaded split is compared by identity.
@dataclass(frozen=True, eq=False)
class TabularData:
    """One split: `features` float32 [N, F], `labels` int64 [N] in [0, num_classes)."""

    deterministic_batches = True  # batch() is a pure function of its rows: preloads may be kept

    features: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    columns: tuple[str, ...]  # the feature columns, in order (what a model's inputs mean)

    def __post_init__(self) -> None:
        if self.features.dtype != torch.float32 or self.features.dim() != 2:
            raise ValueError(f"features must be float32 [N, F], got {self.features.dtype} "
                             f"{tuple(self.features.shape)}")
        if self.labels.dtype != torch.int64 or self.labels.shape != (len(self.features),):
            raise ValueError(f"labels must be int64 [{len(self.features)}], got {self.labels.dtype} "
                             f"{tuple(self.labels.shape)}")
        if len(self.columns) != self.features.shape[1]:
            raise ValueError(f"{len(self.columns)} column names for {self.features.shape[1]} features")
        if len(self.labels) and not 0 <= int(self.labels.min()) <= int(self.labels.max()) < self.num_classes:
            raise ValueError(f"labels outside [0, {self.num_classes - 1}]")

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.as_tensor(idx, dtype=torch.int64)
        return self.features[rows], self.labels[rows]


def standardize(train: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, test) scaled by the train split's per-column mean and std; a constant column
    keeps std 1 (it carries no information, and dividing by 0 would make it NaN)."""
    mean = train.mean(dim=0)
    std = train.std(dim=0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return (train - mean) / std, (test - mean) / std
