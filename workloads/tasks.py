"""Dispatch from a task name (as written in run configs) to its loader."""

from __future__ import annotations

from .cifar import load_cifar
from .fashion_mnist import default_cache_dir, load_fashion_mnist
from .image_data import ImageData

KNOWN_TASKS = ("fashion-mnist", "cifar10", "cifar100")


def load_task(task: str, data_dir: str) -> tuple[ImageData, ImageData]:
    """Return the (train, test) splits for ``task``.

    An empty ``data_dir`` means the loader's default search: for
    Fashion-MNIST the system folder or a download, for CIFAR the
    ``~/.cache/adaptfl`` folder (CIFAR is never downloaded).
    """
    if task == "fashion-mnist":
        return load_fashion_mnist(data_dir)
    if task in ("cifar10", "cifar100"):
        root = data_dir or str(default_cache_dir())
        return load_cifar(root, num_classes=int(task.removeprefix("cifar")))
    raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(KNOWN_TASKS)}")
