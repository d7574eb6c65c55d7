"""Your own data and model for adaptfl: scikit-learn's 8×8 handwritten digits and a small CNN.

adaptfl imports these by name from the run config, on the server and on every node:

    task = "digits_app.task:load"     load(data_dir) -> adaptfl.workloads.Task
    model = "digits_app.task:build"   build(task) -> torch.nn.Module

`flwr run` ships this package inside the app bundle, so the nodes need only adaptfl and
scikit-learn installed, not this example.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from adaptfl.workloads import Task

TEST_SHARE = 0.2  # held out for the server's central evaluation


@dataclass(frozen=True, eq=False)
class Digits:
    """One split. adaptfl needs three things of it: `labels` (int64 [N], what the clients are
    partitioned by), `len()`, and `batch(idx)` -> (inputs, targets) ready for the model."""

    images: torch.Tensor  # float32 [N, 1, 8, 8] in [0, 1]
    labels: torch.Tensor  # int64 [N], 0..9

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[idx], self.labels[idx]


def load(data_dir: str) -> Task:
    """All 1,797 digits, 80 % train / 20 % test. `data_dir` is the run's (or a SuperNode's own)
    data-dir; this data set ships inside scikit-learn, so it is not read."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn: nothing is downloaded

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).div(16.0).unsqueeze(1)  # pixels 0..16
    labels = torch.tensor(digits.target, dtype=torch.int64)
    # A fixed seed: the server and every node must cut the same split.
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    held_out = int(TEST_SHARE * len(labels))
    test, train = order[:held_out], order[held_out:]
    return Task(train=Digits(images[train], labels[train]), test=Digits(images[test], labels[test]),
                num_outputs=10, input_shape=(1, 8, 8), name="sklearn-digits")


def build(task: Task) -> nn.Module:
    """A small CNN sized from the task (about 6k parameters)."""
    channels, side, _ = task.input_shape
    return nn.Sequential(
        nn.Conv2d(channels, 16, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8 -> 4
        nn.Conv2d(16, 32, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4 -> 2
        nn.Flatten(), nn.Linear(32 * (side // 4) ** 2, task.num_outputs),
    )
