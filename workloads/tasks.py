"""Dispatch from a task name (as written in run configs) to its loader and its models."""

from __future__ import annotations

from torch import nn

from .cifar import load_cifar
from .fashion_mnist import default_cache_dir, load_fashion_mnist
from .image_data import ImageData
from .llama import LlamaConfig, LlamaDecoder
from .models import LANGUAGE_MODELS, build_model
from .text_corpora import load_c4, load_fortunes
from .text_data import TextData
from .tiny_imagenet import load_tiny_imagenet

TaskData = ImageData | TextData
KNOWN_TASKS = ("fashion-mnist", "cifar10", "cifar100", "tiny-imagenet", "fortunes",
               "fortunes-topics", "c4")


def load_task(task: str, data_dir: str) -> tuple[TaskData, TaskData]:
    """Return the (train, test) splits for ``task``.

    An empty ``data_dir`` means the loader's default search: for Fashion-MNIST the system
    folder or a download, for CIFAR and Tiny-ImageNet ``~/.cache/adaptfl`` (Tiny-ImageNet is
    downloaded there when missing, CIFAR through torchvision likewise), for fortunes Debian's
    folder. C4 always streams from the Hugging Face hub.
    """
    if task == "fashion-mnist":
        return load_fashion_mnist(data_dir)
    if task in ("cifar10", "cifar100"):
        root = data_dir or str(default_cache_dir())
        return load_cifar(root, num_classes=int(task.removeprefix("cifar")), download=not data_dir)
    if task == "tiny-imagenet":
        return load_tiny_imagenet(data_dir or str(default_cache_dir()), download=not data_dir)
    if task in ("fortunes", "fortunes-topics"):
        return load_fortunes(data_dir, by="language" if task == "fortunes" else "topic")
    if task == "c4":
        return load_c4()
    raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(KNOWN_TASKS)}")


def build_task_model(name: str, data: TaskData) -> nn.Module:
    """A fresh model sized for `data`: image models by channels and side, language models by
    vocabulary. A language model on images (or the reverse) is refused by name."""
    if isinstance(data, TextData):
        if name not in LANGUAGE_MODELS:
            raise ValueError(f"model {name!r} cannot read text; text tasks take one of "
                             f"{', '.join(LANGUAGE_MODELS)}")
        return LlamaDecoder(LlamaConfig(vocab_size=data.vocab_size, **LANGUAGE_MODELS[name]))
    return build_model(name, data.num_classes, data.in_channels, data.image_size)
