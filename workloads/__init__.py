"""Datasets, client partitions and models for adaptfl's experiments."""

from .cifar import load_cifar
from .fashion_mnist import load_fashion_mnist
from .idx import parse_idx, read_idx_file
from .image_data import ImageData
from .models import KNOWN_MODELS, build_model
from .partitioning import PARTITION_SCHEMES, partition_indices, sample_batches
from .tasks import KNOWN_TASKS, load_task

__all__ = [
    "KNOWN_MODELS",
    "KNOWN_TASKS",
    "PARTITION_SCHEMES",
    "ImageData",
    "build_model",
    "load_cifar",
    "load_fashion_mnist",
    "load_task",
    "parse_idx",
    "partition_indices",
    "read_idx_file",
    "sample_batches",
]
