"""The model: Flower's fl-dp-sa CNN, layer for layer. The data are adaptfl's built-in
`fashion-mnist` (the local IDX files, `data-dir`), split IID across the nodes; training (local
Adam, `local-steps` batches) and the server's test are adaptfl's, named in pyproject.toml.

    model = "fl_dp_sa.task:build"    build(task) -> torch.nn.Module
"""

from __future__ import annotations

from torch import nn

from adaptfl.workloads import Task


class Net(nn.Module):
    """Two convolutions (6 maps of 3×3 with padding, 16 of 5×5), each with a ReLU and a 2×2 max
    pool, then three linear layers (400 → 120 → 84 → classes): 61,610 parameters at 10 classes."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 28 -> 14
            nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),  # 14 -> 10 -> 5
            nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes))

    def forward(self, x):  # noqa: ANN001, ANN201 - torch's own signature
        return self.classifier(self.features(x))


def build(task: Task) -> nn.Module:
    """The CNN for 28×28 grey images (its sizes are fixed by the two pools), the task's classes."""
    if tuple(task.input_shape) != (1, 28, 28):
        raise ValueError(f"fl_dp_sa's CNN takes 1×28×28 images; task {task.name!r} has "
                         f"{'×'.join(map(str, task.input_shape))}")
    return Net(task.num_outputs)
