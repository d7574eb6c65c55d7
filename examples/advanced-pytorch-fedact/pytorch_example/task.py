"""What both versions share: the model, the local data, training and testing, the run folder.

Data: Fashion-MNIST from local IDX files (Debian's `dataset-fashion-mnist` puts them in
/usr/share/datasets/fashion-mnist; Flower's example downloads it from the Hugging Face hub), the
first `num-train-examples` train images split across the nodes by flwr-datasets' Dirichlet
partitioner (α = 1 over the labels), 80/20 within each node; augmented for training.
"""

from __future__ import annotations

import gzip
import json
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from datasets import ClassLabel, Dataset, Features, Image
from flwr_datasets.partitioner import DirichletPartitioner
from torch import nn
from torch.utils.data import DataLoader
from torchvision import transforms as T

NORMALIZE = T.Normalize((0.1307,), (0.3081,))
EVAL_TRANSFORMS = T.Compose([T.ToTensor(), NORMALIZE])
TRAIN_TRANSFORMS = T.Compose([T.RandomCrop(28, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                              NORMALIZE])


class Net(nn.Module):
    """Two 5×5 conv layers (16, 32 channels) and two linear ones; `fc2` is the classification
    head each client keeps for itself (client_app.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 16, 5), nn.Conv2d(16, 32, 5)
        self.fc1, self.fc2 = nn.Linear(32 * 4 * 4, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def train(net: nn.Module, loader: DataLoader, epochs: int, lr: float, device: str,
          optimizer: torch.optim.Optimizer | None = None) -> float:
    """`epochs` passes over the loader (SGD with momentum unless an optimizer is given); the
    mean loss over the batches."""
    net.to(device).train()
    optimizer = optimizer or torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    total, batches = 0.0, 0
    for _ in range(epochs):
        for batch in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(batch["image"].to(device)), batch["label"].to(device))
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
    return total / batches


@torch.no_grad()
def test(net: nn.Module, loader: DataLoader, device: str) -> tuple[float, float]:
    """Mean batch loss and accuracy over the loader."""
    net.to(device).eval()
    loss, correct = 0.0, 0
    for batch in loader:
        logits = net(batch["image"].to(device))
        labels = batch["label"].to(device)
        loss += F.cross_entropy(logits, labels).item()
        correct += int((logits.argmax(1) == labels).sum())
    return loss / len(loader), correct / len(loader.dataset)


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip): magic (its last byte the number of axes), the sizes, uint8 values."""
    raw = gzip.decompress(path.read_bytes())
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(raw[3]))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).reshape(shape)


def local_fashion_mnist(data_dir: str, split: str, size: int) -> Dataset:
    """The first `size` images of a split ("train" or "t10k") as a Hugging Face dataset of PIL
    images and labels, as Flower's example gets them from the hub."""
    images = read_idx(Path(data_dir) / f"{split}-images-idx3-ubyte.gz")[:size]
    labels = read_idx(Path(data_dir) / f"{split}-labels-idx1-ubyte.gz")[:size]
    features = Features({"image": Image(), "label": ClassLabel(num_classes=10)})
    return Dataset.from_dict({"image": list(images), "label": labels.tolist()}, features=features)


def with_transforms(transforms: T.Compose):  # noqa: ANN201 - a datasets transform
    def apply(batch: dict) -> dict:
        batch["image"] = [transforms(image) for image in batch["image"]]
        return batch

    return apply


_partitioner: DirichletPartitioner | None = None  # one per process, as Flower caches its dataset


def load_data(partition_id: int, num_partitions: int, data_dir: str, size: int
              ) -> tuple[DataLoader, DataLoader]:
    """This node's Dirichlet share, 80% to train (augmented, batch 32), 20% held out."""
    global _partitioner
    if _partitioner is None:
        _partitioner = DirichletPartitioner(num_partitions=num_partitions, partition_by="label",
                                            alpha=1.0, seed=42)
        _partitioner.dataset = local_fashion_mnist(data_dir, "train", size)
    split = _partitioner.load_partition(partition_id).train_test_split(test_size=0.2, seed=42)
    train_set = split["train"].with_transform(with_transforms(TRAIN_TRANSFORMS))
    test_set = split["test"].with_transform(with_transforms(EVAL_TRANSFORMS))
    return DataLoader(train_set, batch_size=32, shuffle=True), DataLoader(test_set, batch_size=32)


def central_test_loader(data_dir: str, size: int) -> DataLoader:
    """The server's test images (the first `size` of the test split)."""
    return DataLoader(local_fashion_mnist(data_dir, "t10k", size).with_transform(
        with_transforms(EVAL_TRANSFORMS)), batch_size=32)


def create_run_dir(config: dict, out_dir: str) -> Path:
    """outputs/<date>/<time> under `out_dir` (empty: the working directory), with the run config."""
    path = Path(out_dir or Path.cwd()) / "outputs" / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    path.mkdir(parents=True, exist_ok=False)
    (path / "run_config.json").write_text(json.dumps(config))
    return path
