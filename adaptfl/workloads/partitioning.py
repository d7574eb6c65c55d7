"""Splitting a training set across clients and drawing local mini-batches."""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # imported where a partition is drawn: flwr-datasets brings seaborn and scipy
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner, NaturalIdPartitioner, Partitioner

# iid: equal random shards; dirichlet: label shares ~ Dir(α) per client; pathological: each
# client holds `classes_per_client` labels; natural-id: one client per label value (for text,
# the label is the source: a language or a topic file).
PARTITION_SCHEMES = ("iid", "dirichlet", "pathological", "natural-id")
# Smallest Dirichlet partition we ask flwr-datasets for. It re-draws up to 10
# times when a partition is smaller and then gives up; a larger minimum would
# make small or very skewed setups fail, so we only insist on non-empty ones.
NONEMPTY_PARTITION_SIZE = 1


def partition_indices(
    labels: torch.Tensor | np.ndarray,
    num_partitions: int,
    partition_id: int,
    scheme: str,
    dirichlet_alpha: float,
    seed: int,
    classes_per_client: int = 2,
) -> np.ndarray:
    """Return the example indices (int64) that client ``partition_id`` owns.

    The same arguments give the same indices in every process. Partitions are
    disjoint and together cover every example. ``dirichlet_alpha`` is only
    used (and checked) by the "dirichlet" scheme; a Dirichlet partition is
    non-empty unless the draw makes that impossible after flwr-datasets'
    retries, in which case empty partitions are accepted rather than failing.
    """
    label_array = _as_label_array(labels)
    _check_partition_args(len(label_array), num_partitions, partition_id, scheme, seed)
    alpha = 0.0  # the scheme's one parameter; a constant where unused keeps one cache entry
    if scheme == "dirichlet":
        if not dirichlet_alpha > 0:
            raise ValueError(f"dirichlet_alpha must be > 0, got {dirichlet_alpha!r}")
        alpha = float(dirichlet_alpha)
    if scheme == "pathological":
        if classes_per_client < 1:
            raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client!r}")
        alpha = float(classes_per_client)
    if scheme == "natural-id":
        distinct = len(np.unique(label_array))
        if distinct != num_partitions:
            raise ValueError(f"natural-id gives one partition per label: the data has {distinct} "
                             f"distinct labels but num_partitions={num_partitions}")
    # Keyed by the label bytes (not just their count) so that two label sets
    # of equal length can never share a cached partitioner.
    partitioner = _cached_partitioner(label_array.tobytes(), num_partitions, scheme, alpha, seed)
    partition = partitioner.load_partition(partition_id)
    rows = partition["idx"] if isinstance(partition, dict) else partition[:]["idx"]
    return np.asarray(rows, dtype=np.int64)


def _as_label_array(labels: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.ndim != 1 or len(array) == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"labels must be a non-empty 1-D integer array, got dtype "
            f"{array.dtype} with shape {array.shape}"
        )
    return array.astype(np.int64)


def _check_partition_args(
    num_examples: int, num_partitions: int, partition_id: int, scheme: str, seed: int
) -> None:
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(
            f"unknown scheme {scheme!r}; known schemes: {', '.join(PARTITION_SCHEMES)}"
        )
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions!r}")
    if num_partitions > num_examples:
        raise ValueError(f"num_partitions {num_partitions} exceeds the {num_examples} examples")
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must be in [0, {num_partitions - 1}], got {partition_id!r}")
    if seed < 0:  # numpy and datasets both reject negative seeds
        raise ValueError(f"seed must be >= 0, got {seed!r}")


class IidShards:
    """flwr-datasets' `IidPartitioner` without importing `datasets`: the contiguous shards
    of `datasets.Dataset.shard(contiguous=True)` (the first `len % N` shards one row longer,
    which is `np.array_split`) of the rows in their seeded order. A deployed ClientApp is a
    fresh process per message, and `datasets` + Arrow cost it ~130 MB of its own memory and a
    second (docs/scale.md); tests/workloads/test_workloads.py checks equality with `IidPartitioner`."""

    def __init__(self, order: np.ndarray, num_partitions: int) -> None:
        self.order, self.num_partitions = order, num_partitions

    def load_partition(self, partition_id: int) -> dict[str, np.ndarray]:
        return {"idx": np.array_split(self.order, self.num_partitions)[partition_id]}


@lru_cache(maxsize=8)
def _cached_partitioner(
    label_bytes: bytes, num_partitions: int, scheme: str, alpha: float, seed: int
) -> Partitioner | IidShards:
    labels = np.frombuffer(label_bytes, dtype=np.int64)
    if scheme == "natural-id":
        return _natural_id(labels)
    # IID shards are contiguous, so the rows are stored in a seeded random order to make them
    # random; harmless for the other schemes.
    order = np.random.default_rng(seed).permutation(len(labels))
    if scheme == "iid":
        return IidShards(order, num_partitions)
    import datasets
    from flwr_datasets.partitioner import PathologicalPartitioner

    table = datasets.Dataset.from_dict({"label": labels[order], "idx": order})
    # Arrow format: columns come back as Arrow arrays, which numpy converts
    # without a Python-level loop (the default format takes ~0.5 s on 60k).
    table = table.with_format("arrow")
    if scheme == "pathological":
        pathological = PathologicalPartitioner(
            num_partitions=num_partitions, partition_by="label",
            num_classes_per_partition=int(alpha), class_assignment_mode="first-deterministic",
            seed=seed)
        pathological.dataset = table
        return pathological
    try:
        return _assigned_dirichlet(table, num_partitions, alpha, seed, NONEMPTY_PARTITION_SIZE)
    except ValueError:  # flwr-datasets gave up after its re-draws
        return _assigned_dirichlet(table, num_partitions, alpha, seed, 0)


def _natural_id(labels: np.ndarray) -> NaturalIdPartitioner:
    # Rows sorted by label (stable): the partitioner numbers ids in order of first appearance,
    # so partition i is the i-th smallest label whatever order the data came in.
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    order = np.argsort(labels, kind="stable")
    table = datasets.Dataset.from_dict({"label": labels[order], "idx": order}).with_format("arrow")
    partitioner = NaturalIdPartitioner(partition_by="label")
    partitioner.dataset = table
    return partitioner


def _assigned_dirichlet(
    table: datasets.Dataset, num_partitions: int, alpha: float, seed: int, min_size: int
) -> DirichletPartitioner:
    from flwr_datasets.partitioner import DirichletPartitioner

    partitioner = DirichletPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        alpha=alpha,
        min_partition_size=min_size,
        self_balancing=False,
        seed=seed,
    )
    partitioner.dataset = table
    with warnings.catch_warnings():
        # Each re-draw warns; the fallback above already handles failure.
        warnings.simplefilter("ignore")
        partitioner.load_partition(0)  # forces the assignment of all partitions
    return partitioner


def sample_batches(
    num_examples: int, batch_size: int, num_steps: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Draw ``num_steps`` batches of positions in ``range(num_examples)``.

    Positions come from shuffled epochs: each epoch is a fresh permutation cut
    into full batches (the remainder is dropped), and a new epoch starts when
    one runs out. A partition smaller than ``batch_size`` is used whole for
    every batch. The result depends only on the arguments and ``generator``.
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps!r}")
    size = min(batch_size, num_examples)
    batches_per_epoch = num_examples // size
    batches: list[torch.Tensor] = []
    while len(batches) < num_steps:
        order = torch.randperm(num_examples, generator=generator)
        batches.extend(torch.split(order[: batches_per_epoch * size], size))
    return batches[:num_steps]
