"""From a task name (as written in run configs) to its `Task`, and from a model name to a model.

Built-in tasks are named (`fashion-mnist`, `cifar10`, `fortunes`, …); your own are
`package.module:function` (workloads/task.py); data sets from Hugging Face or local files are
`hf:<name>`, `csv:<path>`, `parquet:<path>`, `imagefolder:<dir>` (workloads/hub.py); instruction
SFT for a pretrained causal LM is `sft:…` with `model='hf:…'` (workloads/instructions.py).
"""

from __future__ import annotations

from functools import lru_cache

from torch import nn

from adaptfl.algorithms.settings import LanguageModel
from adaptfl.core.suggest import did_you_mean

from .cifar import load_cifar
from .fashion_mnist import default_cache_dir, load_fashion_mnist
from .image_data import ImageData
from .llama import LlamaConfig, LlamaDecoder
from .models import LANGUAGE_MODELS, build_model
from .task import Task, is_reference, load_object
from .text_corpora import load_c4, load_fortunes
from .text_data import TextData
from .tiny_imagenet import load_tiny_imagenet

# The built-in tasks: input, outputs and where the data comes from (docs/workloads.md's table).
TASKS = {
    "fashion-mnist": ("1×28×28 grey images", "10 classes", "60,000 / 10,000; Debian's "
                      "dataset-fashion-mnist, offline: the main job"),
    "cifar10": ("3×32×32 colour images", "10 classes", "50,000 / 10,000; downloaded to "
                "~/.cache/adaptfl unless data-dir holds it"),
    "cifar100": ("3×32×32 colour images", "100 classes", "50,000 / 10,000; as cifar10"),
    "tiny-imagenet": ("3×64×64 colour images", "200 classes", "100,000 / 10,000; as cifar10"),
    "fortunes": ("token windows", "next token", "Debian's fortunes (en, de, es, it; offline), "
                 "each window labelled by its language for the partitioning: the LM workload"),
    "fortunes-topics": ("token windows", "next token", "the same corpus, labelled by its topic file"),
    "c4": ("token windows", "next token", "C4 streamed from the Hugging Face hub (network)"),
}
KNOWN_TASKS = tuple(TASKS)
HUB_PREFIXES = ("hf:", "csv:", "parquet:", "imagefolder:")


def _builtin(task: str, data_dir: str) -> tuple[ImageData | TextData, ImageData | TextData]:
    """An empty ``data_dir`` means the loader's default search: for Fashion-MNIST the system
    folder or a download, for CIFAR and Tiny-ImageNet ``~/.cache/adaptfl`` (downloaded there
    when missing), for fortunes Debian's folder. C4 always streams from the Hugging Face hub."""
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
    raise ValueError(f"unknown task {task!r}{did_you_mean(task, KNOWN_TASKS)}; known tasks: "
                     f"{', '.join(KNOWN_TASKS)}, or your own "
                     "'package.module:function', or hf:/csv:/parquet:/imagefolder:")


def as_task(train: ImageData | TextData, test: ImageData | TextData, name: str) -> Task:
    if isinstance(train, TextData):
        return Task(train, test, train.vocab_size, (train.seq_len,), name)
    return Task(train, test, train.num_classes, tuple(train.images.shape[1:]), name)


@lru_cache(maxsize=4)
def load_task(task: str, data_dir: str = "", model: str = "", llm: LanguageModel | None = None) -> Task:
    """The task named in a run config (cached: a client process loads it once). `model` and
    `llm` (algorithms.settings.LanguageModel) are read by sft: tasks only: the model's tokenizer
    and the max-length and prompt-template keys."""
    if task.startswith("sft:"):
        from .instructions import load_sft_task

        return load_sft_task(task, data_dir, model, llm if llm is not None else _default_llm())
    if task.startswith(HUB_PREFIXES):
        from .hub import load_hub_task

        return load_hub_task(task, data_dir)
    if is_reference(task):
        loaded = load_object(task, "task")(data_dir)
        if not isinstance(loaded, Task):
            raise ValueError(f"task={task!r} returned {type(loaded).__name__}, expected "
                             "adaptfl.workloads.Task")
        return loaded
    return as_task(*_builtin(task, data_dir), task)


def _default_llm() -> LanguageModel:
    return LanguageModel()


def build_task_model(name: str, task: Task, llm: LanguageModel | None = None,
                     data_dir: str = "") -> nn.Module:
    """A fresh model sized for the task: built-in image models by channels and side, language
    models by vocabulary, your own `package.module:function(task)`, a pretrained causal LM with
    LoRA adapters `hf:<folder|file.gguf|package>` (workloads/causal_lm.py; `llm` sets them)."""
    if name.startswith("hf:"):
        from .causal_lm import build_causal_lm

        if not task.name.startswith("sft:"):
            raise ValueError(f"model={name!r} (a causal LM) trains on an instruction task "
                             f"task='sft:…', not {task.name!r}")
        return build_causal_lm(name, llm if llm is not None else _default_llm(), data_dir)
    if task.name.startswith("sft:"):
        raise ValueError(f"task={task.name!r} needs a pretrained causal LM, model='hf:…'; got "
                         f"model={name!r}")
    if is_reference(name):
        model = load_object(name, "model")(task)
        if not isinstance(model, nn.Module):
            raise ValueError(f"model={name!r} returned {type(model).__name__}, expected a torch.nn.Module")
        return model
    data = task.train
    if isinstance(data, TextData):
        if name not in LANGUAGE_MODELS:
            raise ValueError(f"model {name!r} cannot read text; text tasks take one of "
                             f"{', '.join(LANGUAGE_MODELS)}")
        return LlamaDecoder(LlamaConfig(vocab_size=data.vocab_size, **LANGUAGE_MODELS[name]))
    if isinstance(data, ImageData):
        return build_model(name, data.num_classes, data.in_channels, data.image_size)
    if name == "mlp" and len(task.input_shape) == 1:  # tabular data
        return nn.Sequential(nn.Linear(task.input_shape[0], 64), nn.ReLU(), nn.Linear(64, task.num_outputs))
    raise ValueError(f"model {name!r} does not fit task {task.name!r} (inputs {task.input_shape}); "
                     "use model='mlp' for tabular data or your own 'package.module:function'")
