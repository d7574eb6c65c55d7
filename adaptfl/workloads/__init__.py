"""Datasets, client partitions and models for adaptfl's experiments."""

from .cifar import load_cifar
from .fashion_mnist import load_fashion_mnist
from .idx import parse_idx, read_idx_file
from .image_data import ImageData
from .losses import count_correct, task_loss
from .models import KNOWN_MODELS, LANGUAGE_MODELS, build_model
from .partitioning import PARTITION_SCHEMES, partition_indices, sample_batches
from .tabular import TabularData
from .task import Split, Task
from .tasks import KNOWN_TASKS, build_task_model, load_task
from .text_corpora import load_c4, load_fortunes
from .text_data import TextData
from .tiny_imagenet import load_tiny_imagenet

__all__ = [
    "KNOWN_MODELS",
    "KNOWN_TASKS",
    "LANGUAGE_MODELS",
    "PARTITION_SCHEMES",
    "ImageData",
    "Split",
    "TabularData",
    "Task",
    "TextData",
    "build_model",
    "build_task_model",
    "count_correct",
    "load_c4",
    "load_cifar",
    "load_fashion_mnist",
    "load_fortunes",
    "load_task",
    "load_tiny_imagenet",
    "parse_idx",
    "partition_indices",
    "read_idx_file",
    "sample_batches",
    "task_loss",
]
