"""Tests for workloads/: data loading, partitioning, batching and models."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import adaptfl.workloads as workloads
from adaptfl.workloads import (
    ImageData,
    build_model,
    load_cifar,
    load_fashion_mnist,
    load_task,
    parse_idx,
    partition_indices,
    read_idx_file,
    sample_batches,
)
from adaptfl.workloads.fashion_mnist import FASHION_MNIST_FILES, SYSTEM_FASHION_MNIST_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- IDX files

# Written independently of workloads.idx so the round trip checks the parser
# against the published format rather than against itself.
IDX_TYPE_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D}


def write_idx(path: Path, array: np.ndarray, gzipped: bool) -> Path:
    header = bytes([0, 0, IDX_TYPE_CODES[array.dtype], array.ndim])
    header += struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    if gzipped:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


@pytest.mark.parametrize("gzipped", [False, True])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([[-5, 70000], [3, 0]], dtype=np.int32),
        np.linspace(-1, 1, 7, dtype=np.float32),
    ],
    ids=["uint8-3d", "int32-2d", "float32-1d"],
)
def test_idx_round_trip(tmp_path: Path, array: np.ndarray, gzipped: bool) -> None:
    path = write_idx(tmp_path / "data-idx", array, gzipped)
    parsed = read_idx_file(path)
    assert parsed.shape == array.shape
    assert parsed.dtype == array.dtype
    np.testing.assert_array_equal(parsed, array)


def test_idx_bad_magic_raises(tmp_path: Path) -> None:
    path = tmp_path / "bad-idx"
    path.write_bytes(b"\x12\x34\x08\x01" + struct.pack(">I", 2) + b"\x00\x01")
    with pytest.raises(ValueError, match="magic"):
        read_idx_file(path)
    with pytest.raises(ValueError, match="magic"):
        parse_idx(b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00")  # unknown type


def test_idx_length_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="data bytes"):
        parse_idx(b"\x00\x00\x08\x02" + struct.pack(">II", 2, 2) + b"\x00\x01\x02")
    with pytest.raises(ValueError, match="dimensions"):
        parse_idx(b"\x00\x00\x08\x03" + struct.pack(">I", 2))


# ------------------------------------------------------------ Fashion-MNIST


def write_fake_fashion_mnist(directory: Path, train_size: int = 12, test_size: int = 5) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (train_size, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": np.arange(train_size, dtype=np.uint8) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (test_size, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": np.arange(test_size, dtype=np.uint8) % 10,
    }
    for position, (stem, array) in enumerate(arrays.items()):
        write_idx(directory / stem, array, gzipped=position % 2 == 0)  # mix both kinds


def test_fashion_mnist_from_data_dir(tmp_path: Path) -> None:
    write_fake_fashion_mnist(tmp_path)
    train, test = load_fashion_mnist(str(tmp_path))
    assert train.images.shape == (12, 1, 28, 28) and train.images.dtype == torch.uint8
    assert test.images.shape == (5, 1, 28, 28)
    assert train.labels.dtype == torch.int64
    assert train.labels.tolist() == [i % 10 for i in range(12)]
    assert train.num_classes == 10 and train.in_channels == 1 and train.image_size == 28
    # Cached per resolved folder: a second call returns the same objects.
    assert load_fashion_mnist(str(tmp_path))[0] is train


def test_batch_normalizes_with_dataset_stats(tmp_path: Path) -> None:
    write_fake_fashion_mnist(tmp_path)
    train, _ = load_fashion_mnist(str(tmp_path))
    images, labels = train.batch(torch.tensor([3, 1]))
    expected = (train.images[[3, 1]].float() / 255 - train.mean[0]) / train.std[0]
    assert images.dtype == torch.float32 and images.shape == (2, 1, 28, 28)
    torch.testing.assert_close(images, expected)
    assert labels.tolist() == [3, 1]


def test_data_dir_missing_file_names_it(tmp_path: Path) -> None:
    write_fake_fashion_mnist(tmp_path)
    missing = next(tmp_path.glob("t10k-labels-idx1-ubyte*"))
    missing.unlink()
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte") as excinfo:
        load_fashion_mnist(str(tmp_path))
    assert str(tmp_path) in str(excinfo.value)


def test_data_dir_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        load_fashion_mnist(str(tmp_path / "nowhere"))


@pytest.mark.skipif(
    any(
        not (SYSTEM_FASHION_MNIST_DIR / f"{stem}.gz").is_file()
        and not (SYSTEM_FASHION_MNIST_DIR / stem).is_file()
        for stem in FASHION_MNIST_FILES
    ),
    reason=f"real Fashion-MNIST not installed in {SYSTEM_FASHION_MNIST_DIR} "
    "(apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist() -> None:
    task = load_task("fashion-mnist", "")
    train, test = task.train, task.test
    assert train.images.shape == (60000, 1, 28, 28)
    assert test.images.shape == (10000, 1, 28, 28)
    assert train.num_classes == 10
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    images, _ = train.batch(torch.arange(2000))
    assert abs(images.mean().item()) < 0.1 and abs(images.std().item() - 1) < 0.1


# -------------------------------------------------------------------- CIFAR


@pytest.fixture
def skip_cifar_md5(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let torchvision accept fake CIFAR files.

    torchvision 0.29 calls ``check_integrity(path, md5)`` (imported into
    torchvision.datasets.cifar) for every batch file and the meta file, and
    that compares against the md5 of the real archives, which a fake cannot
    match. We keep its file-existence check and drop only the md5 part.
    """
    from torchvision.datasets import cifar, utils

    monkeypatch.setattr(
        cifar, "check_integrity", lambda fpath, md5=None: utils.check_integrity(fpath)
    )


def pickle_to(path: Path, payload: dict) -> None:
    path.write_bytes(pickle.dumps(payload))


def fake_cifar_rows(count: int, seed: int) -> np.ndarray:
    # On disk each row is 3072 bytes: the red, green and blue 32x32 planes.
    return np.random.default_rng(seed).integers(0, 256, (count, 3072), dtype=np.uint8)


def write_fake_cifar10(root: Path, per_batch: int = 2) -> dict[str, np.ndarray]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    train_rows = []
    for batch_number in range(1, 6):
        rows = fake_cifar_rows(per_batch, seed=batch_number)
        labels = [(batch_number + i) % 10 for i in range(per_batch)]
        pickle_to(folder / f"data_batch_{batch_number}", {"data": rows, "labels": labels})
        train_rows.append(rows)
    test_rows = fake_cifar_rows(3, seed=99)
    pickle_to(folder / "test_batch", {"data": test_rows, "labels": [9, 0, 4]})
    pickle_to(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    return {"train": np.concatenate(train_rows), "test": test_rows}


def write_fake_cifar100(root: Path) -> None:
    folder = root / "cifar-100-python"
    folder.mkdir()
    pickle_to(folder / "train", {"data": fake_cifar_rows(4, 1), "fine_labels": [0, 99, 50, 7]})
    pickle_to(folder / "test", {"data": fake_cifar_rows(2, 2), "fine_labels": [98, 1]})
    pickle_to(folder / "meta", {"fine_label_names": [f"class{i}" for i in range(100)]})


def test_cifar10_from_fake_files(tmp_path: Path, skip_cifar_md5: None) -> None:
    raw = write_fake_cifar10(tmp_path)
    train, test = load_cifar(str(tmp_path), num_classes=10)
    assert train.images.shape == (10, 3, 32, 32) and train.images.dtype == torch.uint8
    assert test.images.shape == (3, 3, 32, 32)
    assert test.labels.tolist() == [9, 0, 4]
    assert train.num_classes == 10 and train.in_channels == 3 and train.image_size == 32
    # Channels-first and pixel-exact with respect to the files.
    np.testing.assert_array_equal(train.images.numpy(), raw["train"].reshape(-1, 3, 32, 32))
    images, _ = train.batch(torch.arange(2))
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.float32


def test_cifar100_from_fake_files(tmp_path: Path, skip_cifar_md5: None) -> None:
    write_fake_cifar100(tmp_path)
    task = load_task("cifar100", str(tmp_path))
    train, test = task.train, task.test
    assert train.images.shape == (4, 3, 32, 32) and test.images.shape == (2, 3, 32, 32)
    assert train.labels.tolist() == [0, 99, 50, 7] and train.num_classes == 100


def test_cifar_missing_files_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cifar-10-batches-py"):
        load_cifar(str(tmp_path), num_classes=10)
    with pytest.raises(ValueError, match="cifar-100-python"):
        load_task("cifar100", str(tmp_path))


def test_cifar_rejects_other_class_counts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="20"):
        load_cifar(str(tmp_path), num_classes=20)


def test_unknown_task_lists_known_names() -> None:
    with pytest.raises(ValueError, match="fashion-mnist, cifar10, cifar100"):
        load_task("mnist", "")


def test_image_data_rejects_bad_tensors() -> None:
    images = torch.zeros(2, 1, 4, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="uint8"):
        ImageData(images.float(), torch.zeros(2, dtype=torch.int64), 10, (0.5,), (0.5,))
    with pytest.raises(ValueError, match="labels span"):
        ImageData(images, torch.tensor([0, 10]), 10, (0.5,), (0.5,))
    with pytest.raises(ValueError, match="one value per channel"):
        ImageData(images, torch.tensor([0, 1]), 10, (0.5, 0.5), (0.5, 0.5))


# ------------------------------------------------------------- partitioning

SKEWED_LABELS = torch.arange(3000) % 10


def all_partitions(
    scheme: str, seed: int, num_partitions: int = 8, alpha: float = 0.1
) -> list[np.ndarray]:
    return [
        partition_indices(SKEWED_LABELS, num_partitions, pid, scheme, alpha, seed)
        for pid in range(num_partitions)
    ]


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_partitions_are_disjoint_and_cover_everything(scheme: str) -> None:
    parts = all_partitions(scheme, seed=0)
    joined = np.concatenate(parts)
    assert joined.dtype == np.int64
    assert len(joined) == len(SKEWED_LABELS)
    assert sorted(joined.tolist()) == list(range(len(SKEWED_LABELS)))
    assert all(len(part) > 0 for part in parts)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_partitions_depend_only_on_the_seed(scheme: str) -> None:
    first = all_partitions(scheme, seed=3)
    again = all_partitions(scheme, seed=3)
    other = all_partitions(scheme, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize(("rows", "num_partitions"), [(3000, 8), (600, 16), (37, 5), (10, 10), (7, 1)])
def test_iid_equals_flwr_datasets_iid_partitioner(rows: int, num_partitions: int) -> None:
    """iid shards are cut without importing `datasets` (a ClientApp process saves ~130 MB):
    the very rows flwr-datasets' IidPartitioner gives on the same seeded order, incl. uneven
    sizes (rows % N shards one longer)."""
    import datasets
    from flwr_datasets.partitioner import IidPartitioner

    labels = torch.arange(rows) % 10
    order = np.random.default_rng(5).permutation(rows)
    reference = IidPartitioner(num_partitions=num_partitions)
    reference.dataset = datasets.Dataset.from_dict({"idx": order})
    for pid in range(num_partitions):
        expected = np.asarray(reference.load_partition(pid)["idx"], dtype=np.int64)
        assert np.array_equal(partition_indices(labels, num_partitions, pid, "iid", 0.0, 5), expected)


def test_numpy_and_torch_labels_agree() -> None:
    from_numpy = partition_indices(SKEWED_LABELS.numpy(), 4, 1, "dirichlet", 0.3, 7)
    assert np.array_equal(from_numpy, partition_indices(SKEWED_LABELS, 4, 1, "dirichlet", 0.3, 7))


@pytest.mark.slow
def test_partitions_identical_in_a_fresh_process() -> None:
    script = (
        "import torch; from adaptfl.workloads import partition_indices as p;"
        "l = torch.arange(3000) % 10;"
        "print(p(l, 8, 5, 'dirichlet', 0.1, 3).tolist(), p(l, 8, 2, 'iid', 0.1, 3).tolist())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different str-hash salt
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    here = (
        partition_indices(SKEWED_LABELS, 8, 5, "dirichlet", 0.1, 3).tolist(),
        partition_indices(SKEWED_LABELS, 8, 2, "iid", 0.1, 3).tolist(),
    )
    assert result.stdout.strip() == f"{here[0]} {here[1]}"


def mean_label_entropy(parts: list[np.ndarray]) -> float:
    entropies = []
    for part in parts:
        counts = np.bincount(SKEWED_LABELS.numpy()[part], minlength=10)
        probabilities = counts[counts > 0] / counts.sum()
        entropies.append(float(-(probabilities * np.log(probabilities)).sum()))
    return float(np.mean(entropies))


def test_small_alpha_dirichlet_is_label_skewed() -> None:
    iid_entropy = mean_label_entropy(all_partitions("iid", seed=0))
    skewed_entropy = mean_label_entropy(all_partitions("dirichlet", seed=0, alpha=0.1))
    assert iid_entropy > 0.95 * np.log(10)  # close to uniform over 10 labels
    assert skewed_entropy < 0.6 * iid_entropy


def test_tiny_dataset_with_many_partitions_terminates() -> None:
    labels = np.arange(30) % 10
    parts = [partition_indices(labels, 25, pid, "dirichlet", 0.01, 1) for pid in range(25)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(30))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_partitions": 0}, "num_partitions"),
        ({"num_partitions": 5000}, "num_partitions"),
        ({"partition_id": 4}, "partition_id"),
        ({"partition_id": -1}, "partition_id"),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha"),
        ({"scheme": "shards"}, "shards"),
        ({"seed": -1}, "seed"),
        ({"labels": np.zeros((3, 2), dtype=np.int64)}, "labels"),
        ({"labels": np.zeros(5, dtype=np.float32)}, "labels"),
    ],
)
def test_partition_bad_arguments_raise(kwargs: dict, message: str) -> None:
    arguments = {
        "labels": SKEWED_LABELS,
        "num_partitions": 4,
        "partition_id": 0,
        "scheme": "dirichlet",
        "dirichlet_alpha": 0.5,
        "seed": 0,
    }
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        partition_indices(**arguments)


# ----------------------------------------------------------------- batching


def test_sample_batches_deterministic_and_sized() -> None:
    first = sample_batches(23, 5, 10, torch.Generator().manual_seed(1))
    again = sample_batches(23, 5, 10, torch.Generator().manual_seed(1))
    other = sample_batches(23, 5, 10, torch.Generator().manual_seed(2))
    assert len(first) == 10 and all(batch.shape == (5,) for batch in first)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    assert all(
        batch.dtype == torch.int64 and 0 <= batch.min() and batch.max() < 23 for batch in first
    )


def test_sample_batches_walk_shuffled_epochs() -> None:
    batches = sample_batches(20, 5, 8, torch.Generator().manual_seed(0))
    for epoch in (batches[:4], batches[4:]):  # each epoch visits all 20 once
        assert sorted(torch.cat(epoch).tolist()) == list(range(20))
    assert not torch.equal(torch.cat(batches[:4]), torch.cat(batches[4:]))


def test_small_partition_is_used_whole() -> None:
    batches = sample_batches(3, 50, 4, torch.Generator().manual_seed(0))
    assert len(batches) == 4
    assert all(sorted(batch.tolist()) == [0, 1, 2] for batch in batches)
    assert sample_batches(3, 50, 0, torch.Generator()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [((0, 5, 1), "num_examples"), ((5, 0, 1), "batch_size"), ((5, 5, -1), "num_steps")],
)
def test_sample_batches_bad_arguments_raise(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_batches(*args, generator=torch.Generator())


# ------------------------------------------------------------------- models


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m in ("vit-s", "resnet18")
                                  else m for m in workloads.KNOWN_MODELS])  # the big ones: slow
@pytest.mark.parametrize(("in_channels", "image_size", "num_classes"), [(1, 28, 10), (3, 32, 100)])
def test_model_output_shape_and_training_step(
    name: str, in_channels: int, image_size: int, num_classes: int
) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes, in_channels, image_size)
    images = torch.randn(4, in_channels, image_size, image_size)
    labels = torch.randint(0, num_classes, (4,))
    assert model(images).shape == (4, num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):  # kept tiny: vit-tiny steps dominate this file's runtime
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]


def test_models_are_deterministic_given_the_seed() -> None:
    for name in workloads.KNOWN_MODELS:
        torch.manual_seed(5)
        first = build_model(name, 10, 1, 28).state_dict()
        torch.manual_seed(5)
        second = build_model(name, 10, 1, 28).state_dict()
        assert all(torch.equal(first[key], second[key]) for key in first)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


@pytest.mark.parametrize(("in_channels", "image_size"), [(1, 28), (3, 32)])
def test_model_sizes(in_channels: int, image_size: int) -> None:
    assert (
        5_000_000
        < count_parameters(build_model("vit-tiny", 10, in_channels, image_size))
        < 5_800_000
    )
    assert count_parameters(build_model("cnn", 10, in_channels, image_size)) < 400_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("resnet", 10, 1, 28), "cnn, vit-tiny, vit-s, mlp"),
        (("cnn", 0, 1, 28), "num_classes"),
        (("cnn", 10, 1, 8), "image_size"),
        (("vit-tiny", 10, 1, 30), "divisible"),
    ],
)
def test_build_model_bad_arguments_raise(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(*args)
