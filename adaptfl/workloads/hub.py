"""Data sets by name or path, through Hugging Face `datasets`: a `Task` without writing code.

    task='hf:<name>'           datasets.load_dataset(name): a Hugging Face hub data set (network,
                               or HF's cache when offline) or a local folder of data files
    task='imagefolder:<dir>'   datasets.load_dataset("imagefolder", data_dir=dir): <dir>/<class>/*
                               or <dir>/train/<class>/* and <dir>/test/<class>/*
    task='csv:<path>'          a CSV file, or a folder with train*.csv (and test*.csv)
    task='parquet:<path>'      the same for Parquet

Options follow a '?', as in a URL, because a task is ONE string in the run config: Flower's
config values are scalars and adaptfl refuses keys it does not declare, so a per-data-set
setting cannot be a key of its own. `&` separates options:

    label=<column>       the class column (default: label)
    features=a,b,c       tabular: the feature columns (default: every other column)
    size=<px>            images: resize to size×size (default: keep; all must share one square size)
    subset=<name>        hf: the data set's configuration (load_dataset's `name`)
    test-fraction=<f>    held-out share when there is no test (or validation) split; default 0.2,
                         drawn with a fixed seed, so the server and every node hold out the same rows

e.g. `task='csv:patients.csv?label=outcome'`. A relative path is read under the data dir: the
run config's `data-dir`, or a SuperNode's own from its node config, so one run config points
every organisation at its own folder. A column with images makes an image task (uint8
`ImageData`, any built-in image model), otherwise every feature column must be numeric
(`TabularData`, standardised; `model='mlp'`). Labels: a `ClassLabel` column keeps its ids; other
values (ints, strings) are numbered in sorted order over both splits.

Clients are partitioned by flwr-datasets' partitioners on the labels (workloads/partitioning.py),
so a `FederatedDataset` is not needed here: it is `load_dataset` plus those partitioners.
"""

from __future__ import annotations

import math
import os
from typing import Any, cast
from urllib.parse import parse_qsl

import datasets
import numpy as np
import torch

from .image_data import ImageData
from .tabular import TabularData, standardize
from .task import Task

PREFIXES = ("hf:", "imagefolder:", "csv:", "parquet:")
OPTIONS = {"label", "features", "size", "subset", "test-fraction"}
ONLY_FOR = {"subset": ("hf:",), "features": ("hf:", "csv:", "parquet:")}
GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}  # PIL modes with one intensity channel
HELD_OUT_SEED = 0
NUMERIC_DTYPES = ("bool", "int", "uint", "float")  # prefixes of datasets.Value dtypes


def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """'csv:data/x.csv?label=y' -> ('csv:', 'data/x.csv', {'label': 'y'}); bad options raise."""
    prefix = next((p for p in PREFIXES if spec.startswith(p)), None)
    if prefix is None:
        raise ValueError(f"task={spec!r}: expected one of the prefixes {', '.join(PREFIXES)}")
    location, _, query = spec[len(prefix):].partition("?")
    if not location:
        raise ValueError(f"task={spec!r}: nothing after {prefix!r} (a name or a path)")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"task={spec!r}: options after '?' must be key=value pairs joined by '&'") from None
    options: dict[str, str] = {}
    for key, value in pairs:
        if key not in OPTIONS:
            raise ValueError(f"task={spec!r}: unknown option {key!r}; known: {', '.join(sorted(OPTIONS))}")
        if prefix not in ONLY_FOR.get(key, PREFIXES):
            raise ValueError(f"task={spec!r}: option {key!r} applies to {', '.join(ONLY_FOR[key])} only")
        options[key] = value
    return prefix, location, options


def _number(spec: str, options: dict[str, str], key: str, kind: type, default: Any,
            ok: Any, why: str) -> Any:
    if key not in options:
        return default
    try:
        value = kind(options[key])
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise ValueError(f"task={spec!r}: option {key}={options[key]!r} is not {noun}") from None
    if not ok(value):
        raise ValueError(f"task={spec!r}: option {key}={options[key]!r} {why}")
    return value


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def relative_note(location: str, data_dir: str) -> str:
    """Where a relative path was looked for: the folder it was joined to and, where that is
    relative too, this process's working directory (the ServerApp's is the SuperLink's)."""
    base = data_dir or "."
    where = "" if os.path.isabs(base) else f" in the working directory {os.getcwd()} of this process"
    return (f" ({location!r} is relative: resolved against data-dir {data_dir!r}{where}; give an "
            "absolute path, or a data-dir, as the ServerApp and each node read it where they run)")


def _load(spec: str, prefix: str, location: str, options: dict[str, str], data_dir: str
          ) -> datasets.DatasetDict:
    """The data set's splits, by `datasets.load_dataset` (its own builders for local files)."""
    path = location if os.path.isabs(location) else os.path.join(data_dir, location)
    if prefix == "hf:":
        # A hub name unless that path exists (a local folder or a saved data set).
        target, kwargs = (path, {}) if os.path.exists(path) else (location, {})
        if "subset" in options:
            kwargs["name"] = options["subset"]
        args: tuple[str, ...] = (target,)
    else:
        if not os.path.exists(path):
            raise ValueError(f"task={spec!r}: {os.path.abspath(path)} does not exist"
                             + ("" if os.path.isabs(location) else relative_note(location, data_dir)))
        builder = prefix[:-1]
        if prefix == "imagefolder:" and not os.path.isdir(path):
            raise ValueError(f"task={spec!r}: {path} is not a folder")
        args = (builder,)
        kwargs = {"data_dir": path} if os.path.isdir(path) else {"data_files": path}
    datasets.disable_progress_bars()  # one bar per split and process would flood the clients' logs
    try:
        loaded = datasets.load_dataset(*args, **kwargs)
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as err:
        raise ValueError(f"task={spec!r}: cannot load it ({_first_line(err)})") from None
    if not isinstance(loaded, datasets.DatasetDict) or "train" not in loaded:
        raise ValueError(f"task={spec!r}: the data set has no 'train' split "
                         f"(splits: {sorted(loaded) if isinstance(loaded, dict) else 'none'})")
    return loaded


def _image_column(features: datasets.Features) -> str | None:
    return next((name for name, f in features.items() if isinstance(f, datasets.Image)), None)


def _images(spec: str, ds: datasets.Dataset, column: str, size: int | None) -> tuple[np.ndarray, set[str]]:
    """uint8 [N, H, W, 3] and the PIL modes met (to tell grey from colour)."""
    arrays, modes = [], set()
    for rows in ds.select_columns([column]).iter(batch_size=256):
        for image in rows[column]:
            modes.add(image.mode)
            rgb = image.convert("RGB")
            if size is not None:
                rgb = rgb.resize((size, size))
            arrays.append(np.asarray(rgb, dtype=np.uint8))
    shapes = sorted({a.shape[:2] for a in arrays})
    if len(shapes) > 1:
        raise ValueError(f"task={spec!r}: images differ in size ({shapes[0]} and {shapes[-1]}); "
                         "add ?size=<px> to resize them")
    if shapes and shapes[0][0] != shapes[0][1]:
        raise ValueError(f"task={spec!r}: images are {shapes[0][0]}x{shapes[0][1]}, not square; "
                         "add ?size=<px> to resize them")
    return np.stack(arrays), modes


def _tabular(spec: str, ds: datasets.Dataset, columns: list[str]) -> np.ndarray:
    for name in columns:
        feature = ds.features.get(name)
        if feature is None:
            raise ValueError(f"task={spec!r}: no column {name!r} (columns: {sorted(ds.column_names)})")
        dtype = getattr(feature, "dtype", "")
        if not (isinstance(feature, datasets.Value) and dtype.startswith(NUMERIC_DTYPES)):
            raise ValueError(f"task={spec!r}: column {name!r} is {feature!r}, not numeric; leave it out "
                             "with ?features=<the numeric columns>")
    table = ds.select_columns(columns).with_format("numpy")
    matrix = np.stack([np.asarray(table[name], dtype=np.float32) for name in columns], axis=1)
    if not np.isfinite(matrix).all():
        finite = cast(np.ndarray, np.isfinite(matrix).all(axis=0))  # of a 2-D array: 1-D, per column
        bad = [c for c, ok in zip(columns, finite, strict=True) if not ok]
        raise ValueError(f"task={spec!r}: column{'s' if len(bad) > 1 else ''} {bad} "
                         f"{'have' if len(bad) > 1 else 'has'} missing or infinite values")
    return matrix


def _labels(spec: str, splits: list[datasets.Dataset], column: str) -> tuple[list[torch.Tensor], int]:
    """int64 labels per split and the number of classes (see the module docstring)."""
    feature = splits[0].features.get(column)
    if feature is None or any(column not in ds.column_names for ds in splits):
        raise ValueError(f"task={spec!r}: no label column {column!r} (columns: "
                         f"{sorted(splits[0].column_names)}); name it with ?label=<column>")
    raw = [list(ds[column]) for ds in splits]
    if isinstance(feature, datasets.ClassLabel):
        return [torch.tensor(r, dtype=torch.int64) for r in raw], feature.num_classes
    values = {v for r in raw for v in r}
    if None in values:
        raise ValueError(f"task={spec!r}: label column {column!r} has missing values")
    if any(isinstance(v, float) and not v.is_integer() for v in values):
        raise ValueError(f"task={spec!r}: label column {column!r} holds fractional numbers; "
                         "adaptfl's tasks are classification")
    ids = {v: i for i, v in enumerate(sorted(values))}
    return [torch.tensor([ids[v] for v in r], dtype=torch.int64) for r in raw], len(ids)


def _held_out(n: int, fraction: float, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    count = math.ceil(fraction * n)
    if not 0 < count < n:
        raise ValueError(f"task={spec!r}: {n} rows cannot be split with test-fraction={fraction}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    return order[count:].sort().values, order[:count].sort().values


def load_hub_task(spec: str, data_dir: str = "") -> Task:
    """The `Task` of an `hf:` / `imagefolder:` / `csv:` / `parquet:` spec (module docstring)."""
    prefix, location, options = parse_spec(spec)
    size = _number(spec, options, "size", int, None, lambda v: v >= 1, "must be >= 1")
    fraction = _number(spec, options, "test-fraction", float, 0.2, lambda v: 0 < v < 1,
                       "must be in (0, 1)")
    loaded = _load(spec, prefix, location, options, data_dir)
    test_name = next((s for s in ("test", "validation") if s in loaded), None)
    splits = [loaded["train"]] + ([loaded[test_name]] if test_name else [])
    label = options.get("label", "label")
    labels, num_classes = _labels(spec, splits, label)
    image_column = _image_column(splits[0].features)
    if image_column is not None:
        if "features" in options:
            raise ValueError(f"task={spec!r}: option 'features' is for tabular data; this one has "
                             f"images in column {image_column!r}")
        converted = [_images(spec, ds, image_column, size) for ds in splits]
        channels = 1 if set().union(*(m for _, m in converted)) <= GRAY_MODES else 3
        inputs = [torch.from_numpy(a[..., :channels]).permute(0, 3, 1, 2).contiguous() for a, _ in converted]
        if len({tuple(x.shape[1:]) for x in inputs}) > 1:
            raise ValueError(f"task={spec!r}: train and test images differ in size; add ?size=<px>")
    else:
        if size is not None:
            raise ValueError(f"task={spec!r}: option 'size' is for images; this data set has none")
        chosen = options["features"].split(",") if "features" in options else \
            [c for c in splits[0].column_names if c != label]
        if not chosen or label in chosen:
            raise ValueError(f"task={spec!r}: features {chosen} must be named columns other than the "
                             f"label {label!r}")
        inputs = [torch.from_numpy(_tabular(spec, ds, chosen)) for ds in splits]
    if test_name is None:  # hold out a fixed share of train
        keep, held = _held_out(len(labels[0]), fraction, spec)
        inputs, labels = [inputs[0][keep], inputs[0][held]], [labels[0][keep], labels[0][held]]
    if image_column is not None:
        return _image_task(spec, inputs, labels, num_classes)
    train_x, test_x = standardize(inputs[0], inputs[1])
    train = TabularData(train_x.contiguous(), labels[0], num_classes, tuple(chosen))
    test = TabularData(test_x.contiguous(), labels[1], num_classes, tuple(chosen))
    return Task(train, test, num_classes, (len(chosen),), spec)


def _image_task(spec: str, images: list[torch.Tensor], labels: list[torch.Tensor], num_classes: int) -> Task:
    """uint8 ImageData normalised with the train split's per-channel mean and std."""
    pixels = images[0].to(torch.float64).div(255.0)
    mean = tuple(float(m) for m in pixels.mean(dim=(0, 2, 3)))
    std = tuple(float(s) if s > 0 else 1.0 for s in pixels.std(dim=(0, 2, 3), unbiased=False))
    train, test = (ImageData(images=x, labels=y, num_classes=num_classes, mean=mean, std=std)
                   for x, y in zip(images, labels, strict=True))
    return Task(train, test, num_classes, tuple(train.images.shape[1:]), spec)
