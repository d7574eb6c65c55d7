"""What both versions share: the model, the data, central evaluation, where results go.

Data: the first `num-train-examples` images of Fashion-MNIST from local IDX files (Debian's
`dataset-fashion-mnist` puts them in /usr/share/datasets/fashion-mnist), split IID across the
nodes with flwr-datasets and 80/20 within each node (train, held out), so the app runs offline.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result
from flwr_datasets.partitioner import IidPartitioner
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset


class Net(nn.Module):
    """A small CNN for 28×28 grey images (about 20k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=5)  # 28 -> 24, pooled to 12
        self.conv2 = nn.Conv2d(16, 32, kernel_size=5)  # 12 -> 8, pooled to 4
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip): 4 magic bytes (the last one = number of axes), the axes' sizes as
    big-endian uint32, then uint8 values."""
    raw = gzip.decompress(path.read_bytes())
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


@lru_cache(maxsize=2)
def fashion_mnist(data_dir: str, split: str, size: int) -> TensorDataset:
    """The first `size` images of a split ("train" or "t10k"), as floats in [0, 1]."""
    images = read_idx(Path(data_dir) / f"{split}-images-idx3-ubyte.gz")[:size]
    labels = read_idx(Path(data_dir) / f"{split}-labels-idx1-ubyte.gz")[:size]
    x = torch.from_numpy(images.copy()).float().div(255.0).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))


def load_data(partition_id: int, num_partitions: int, data_dir: str, size: int,
              batch_size: int) -> tuple[DataLoader, DataLoader]:
    """This node's IID share of the train images (flwr-datasets on the local data), split 80/20
    into its train loader and its own held-out loader, as Flower's quickstarts split a partition."""
    full = fashion_mnist(data_dir, "train", size)
    partitioner = IidPartitioner(num_partitions=num_partitions)
    partitioner.dataset = Dataset.from_dict({"row": list(range(len(full)))})
    split = partitioner.load_partition(partition_id).train_test_split(test_size=0.2, seed=42)
    train = DataLoader(Subset(full, split["train"]["row"]), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(partition_id))
    return train, DataLoader(Subset(full, split["test"]["row"]), batch_size=batch_size)


@torch.no_grad()
def test(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """Mean loss and accuracy of `model` over the loader's examples."""
    model.eval()
    loss, correct = 0.0, 0
    for x, y in loader:
        logits = model(x)
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    return loss / len(loader.dataset), correct / len(loader.dataset)


def central_evaluate(data_dir: str, size: int):  # noqa: ANN201 - Flower's evaluate_fn
    """`evaluate_fn` of `strategy.start`: accuracy and loss of the global model on test images."""
    test = fashion_mnist(data_dir, "t10k", size)

    @torch.no_grad()
    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        logits = model.eval()(test.tensors[0])
        loss = F.cross_entropy(logits, test.tensors[1])
        accuracy = (logits.argmax(1) == test.tensors[1]).float().mean()
        return MetricRecord({"accuracy": float(accuracy), "loss": float(loss)})

    return evaluate


def save(result: Result, out_dir: str) -> None:
    """The final model and, per round, the central evaluation, the clients' mean train metrics
    and the federated evaluation (the clients' scores on their own held-out rows), if the run
    config names a folder (absolute: the ServerApp runs in the SuperLink's directory)."""
    if not out_dir:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(result.arrays.to_torch_state_dict(), out / "model.pt")
    central = {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
    (out / "central.json").write_text(json.dumps(central, indent=1))
    train = {r: dict(m) for r, m in result.train_metrics_clientapp.items()}
    (out / "train.json").write_text(json.dumps(train, indent=1))
    federated = {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
    (out / "federated.json").write_text(json.dumps(federated, indent=1))
