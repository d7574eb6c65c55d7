"""A float64 task and model (`task='tests.support.float64_task:load'`, `model=…:build`): the
engines' equality tests compare final models to 1e-10, which float32 round-off would hide."""

from __future__ import annotations

import torch

from adaptfl.workloads import Task


class Rows:
    """In-memory rows: what a Split needs (labels, len, batch)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.labels = x, y

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.labels[idx]


def load(data_dir: str) -> Task:
    """4 classes from the signs of the first four of 12 Gaussian features; 480 train rows."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(600, 12, generator=gen, dtype=torch.float64)
    y = (x[:, 0] + x[:, 1] > 0).long() + 2 * (x[:, 2] * x[:, 3] > 0).long()
    return Task(train=Rows(x[:480], y[:480]), test=Rows(x[480:], y[480:]), num_outputs=4,
                input_shape=(12,), name="quadrants64")


def build(task: Task) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()


def build_cnn(task: Task) -> torch.nn.Module:
    """The same rows read as a 1×3×4 image: a convolution, for the loop form of the gradients."""
    return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 3, 4)), torch.nn.Conv2d(1, 3, 2),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(18, 4)).double()
