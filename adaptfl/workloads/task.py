"""What a task is, for adaptfl and for a user who brings their own data and model.

A task function returns a `Task`: two splits and the loss. A split needs only

    labels   int64 [N]   what the partitioners split on (the class; for text, the source)
    len()                its number of examples
    batch(idx)           (inputs, targets) of those rows, ready for the model

and the Task says how wide the model's output must be (`num_outputs`: classes, or the
vocabulary) and what one example looks like (`input_shape`). The loss is one value per
prediction, averaged: logits [..., C] against targets [...] (images and tokens alike).

Your own, without editing adaptfl (run config `task=` / `model=`):

    # mypkg/mod.py
    def load(data_dir: str) -> adaptfl.workloads.Task: ...
    def build(task: adaptfl.workloads.Task) -> torch.nn.Module: ...

    flwr run . --run-config "task='mypkg.mod:load' model='mypkg.mod:build'"
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from adaptfl.workloads.losses import count_correct, task_loss

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@runtime_checkable
class Split(Protocol):
    @property  # read-only: the splits are frozen dataclasses
    def labels(self) -> torch.Tensor: ...

    def __len__(self) -> int: ...

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True, eq=False)
class Task:
    """A task: train and test splits, the loss, and what the model must read and write."""

    train: Split
    test: Split
    num_outputs: int  # classes, or vocabulary size: the width of the model's last layer
    input_shape: tuple[int, ...]  # one example's input (without the batch axis)
    name: str = "task"
    loss: Loss = field(default=task_loss)
    accuracy: Callable[[torch.Tensor, torch.Tensor], tuple[int, int]] = field(default=count_correct)
    # sequence tasks (SFT): logits, targets -> [B] each example's mean NLL (its response NLL)
    example_nll: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    eval_batch_size: int = 1000  # examples per evaluation forward pass (an LLM's logits are large)

    def __post_init__(self) -> None:
        for which in ("train", "test"):
            split = getattr(self, which)
            if not isinstance(split, Split):
                raise TypeError(f"task {self.name!r}: {which} split needs `labels`, `__len__` and "
                                f"`batch(idx)`, got {type(split).__name__}")
            labels = split.labels
            if not (torch.is_tensor(labels) and labels.dtype == torch.int64 and labels.ndim == 1
                    and len(labels) == len(split)):
                raise ValueError(f"task {self.name!r}: {which}.labels must be int64 [N] with N = "
                                 f"len({which})")
        if len(self.train) == 0:
            raise ValueError(f"task {self.name!r}: the train split is empty")
        if self.num_outputs < 1:
            raise ValueError(f"task {self.name!r}: num_outputs must be >= 1, got {self.num_outputs}")

    # the split of the task is what the clients partition
    @property
    def labels(self) -> torch.Tensor:
        return self.train.labels


def load_object(spec: str, what: str) -> Any:
    """`package.module:attribute` -> the attribute (a user's task or model function)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"invalid {what}={spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"invalid {what}={spec!r}: cannot import {module_name!r} ({err}); is it "
                         "installed or inside the Flower app?") from err
    if not hasattr(module, attribute):
        raise ValueError(f"invalid {what}={spec!r}: {module_name!r} has no {attribute!r}")
    return getattr(module, attribute)


def is_reference(spec: str) -> bool:
    return ":" in spec and "/" not in spec.split(":", 1)[0] and not spec.startswith(
        ("hf:", "csv:", "parquet:", "imagefolder:", "sft:"))
