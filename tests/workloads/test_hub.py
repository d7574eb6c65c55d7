"""Data sets by name or path (workloads/hub.py), on local files made here, with the Hugging Face
hub switched to offline: image folders, CSV, Parquet, `hf:` on a local folder; and a SuperNode
that trains on its own `data-dir` (node config) in the in-process engine."""

from __future__ import annotations

import re
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from adaptfl.workloads import ImageData, build_task_model, load_task
from adaptfl.workloads.hub import load_hub_task, parse_spec
from adaptfl.workloads.tabular import TabularData
from tests.support.run_outputs import metric_rows


@pytest.fixture(autouse=True)
def _offline_private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach the network or the user's HF cache."""
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def write_images(folder: Path, per_class: dict[str, list[np.ndarray]]) -> None:
    for name, arrays in per_class.items():
        (folder / name).mkdir(parents=True)
        for i, pixels in enumerate(arrays):
            Image.fromarray(pixels).save(folder / name / f"{i}.png")


def grey(value: int, side: int = 6) -> np.ndarray:
    return np.full((side, side), value, dtype=np.uint8)


def test_imagefolder_with_train_and_test_folders_keeps_pixels_and_class_ids(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    write_images(root / "train", {"cat": [grey(10), grey(20)], "dog": [grey(200), grey(210), grey(220)]})
    write_images(root / "test", {"cat": [grey(30)], "dog": [grey(230)]})
    task = load_task(f"imagefolder:{root}")
    assert isinstance(task.train, ImageData) and isinstance(task.test, ImageData)
    assert task.input_shape == (1, 6, 6) and task.num_outputs == 2  # grey PNGs: one channel
    # Pixels arrive unchanged (uint8), labels by class folder (cat=0, dog=1).
    train = zip(task.train.images, task.train.labels, strict=True)
    by_value = {int(img[0, 0, 0]): int(y) for img, y in train}
    assert by_value == {10: 0, 20: 0, 200: 1, 210: 1, 220: 1}
    assert sorted(int(i[0, 0, 0]) for i in task.test.images) == [30, 230]
    assert task.train.mean[0] == pytest.approx(np.mean([10, 20, 200, 210, 220]) / 255)  # train stats
    model = build_task_model("cnn", load_task(f"imagefolder:{root}?size=16"))
    assert model(torch.zeros(2, 1, 16, 16)).shape == (2, 2)


def test_imagefolder_without_test_folder_holds_out_a_fixed_share(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    colours = {c: [rng.integers(0, 256, (4, 4, 3), dtype=np.uint8) for _ in range(5)] for c in ("a", "b")}
    write_images(tmp_path / "flat", colours)
    task = load_task("imagefolder:flat?test-fraction=0.3", str(tmp_path))  # relative to data-dir
    assert task.input_shape == (3, 4, 4)  # colour stays three channels
    assert (len(task.train), len(task.test)) == (7, 3)  # ceil(0.3 * 10) held out
    seen = sorted(bytes(x.numpy()) for x in torch.cat([task.train.images, task.test.images]))
    written = sorted(bytes(torch.from_numpy(a).permute(2, 0, 1).contiguous().numpy())
                     for arrays in colours.values() for a in arrays)
    assert seen == written  # disjoint, nothing lost
    again = load_hub_task("imagefolder:flat?test-fraction=0.3", str(tmp_path))  # uncached: same rows
    assert torch.equal(again.test.images, task.test.images)


def test_images_of_different_sizes_need_the_size_option(tmp_path: Path) -> None:
    write_images(tmp_path / "mixed", {"a": [grey(1, 4)], "b": [grey(2, 8)]})
    with pytest.raises(ValueError, match=r"differ in size .*\?size=<px>"):
        load_hub_task(f"imagefolder:{tmp_path / 'mixed'}")
    task = load_hub_task(f"imagefolder:{tmp_path / 'mixed'}?size=5&test-fraction=0.5")
    assert task.input_shape == (1, 5, 5)


def clinic_frame(n: int, seed: int) -> pd.DataFrame:
    """Three well separated classes in two numeric columns, plus a string id and a string label."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, n)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    xy = centres[label] + rng.normal(size=(n, 2))
    return pd.DataFrame({"id": [f"p{i}" for i in range(n)], "age": 40 + 10 * xy[:, 0],
                         "dose": 100 * xy[:, 1], "outcome": np.array(["high", "low", "mid"])[label]})


def test_csv_with_a_named_label_column_and_chosen_features(tmp_path: Path) -> None:
    frame = clinic_frame(50, seed=1)
    frame.to_csv(tmp_path / "clinic.csv", index=False)
    task = load_task(f"csv:{tmp_path / 'clinic.csv'}?label=outcome&features=age,dose")
    assert isinstance(task.train, TabularData) and task.input_shape == (2,) and task.num_outputs == 3
    assert (len(task.train), len(task.test)) == (40, 10) and task.train.columns == ("age", "dose")
    # String labels are numbered in sorted order: high=0, low=1, mid=2.
    all_labels = torch.cat([task.train.labels, task.test.labels]).sort().values
    expected = torch.tensor(frame["outcome"].map({"high": 0, "low": 1, "mid": 2}).to_numpy()).sort().values
    assert torch.equal(all_labels, expected)
    # Standardised with the train split's statistics.
    torch.testing.assert_close(task.train.features.mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(task.train.features.std(0, unbiased=False), torch.ones(2), atol=1e-5, rtol=0)
    x, y = task.train.batch(torch.tensor([0, 3]))
    assert x.shape == (2, 2) and y.dtype == torch.int64
    assert build_task_model("mlp", task)(x).shape == (2, 3)
    with pytest.raises(ValueError, match=r"column 'id' is .*not numeric; leave it out with \?features="):
        load_hub_task(f"csv:{tmp_path / 'clinic.csv'}?label=outcome")


def test_parquet_folder_with_train_and_test_files_and_the_default_label(tmp_path: Path) -> None:
    folder = tmp_path / "pq"
    folder.mkdir()
    pd.DataFrame({"f1": [0.0, 1.0, 2.0, 3.0], "f2": [1, 1, 0, 0], "label": [3, 5, 3, 5]}).to_parquet(
        folder / "train.parquet")
    pd.DataFrame({"f1": [9.0], "f2": [1], "label": [5]}).to_parquet(folder / "test.parquet")
    task = load_task(f"parquet:{folder}")
    assert (len(task.train), len(task.test)) == (4, 1)  # the files' own splits, nothing held out
    assert task.train.labels.tolist() == [0, 1, 0, 1] and task.test.labels.tolist() == [1]  # 3->0, 5->1
    assert task.num_outputs == 2 and task.train.columns == ("f1", "f2")


def test_hf_name_of_a_local_folder_loads_offline(tmp_path: Path) -> None:
    folder = tmp_path / "my-hub-copy"
    write_images(folder / "train", {"x": [grey(1)], "y": [grey(2)]})
    write_images(folder / "test", {"x": [grey(3)], "y": [grey(4)]})
    task = load_task("hf:my-hub-copy", str(tmp_path))
    assert task.input_shape == (1, 6, 6) and task.test.labels.tolist() == [0, 1]


def test_hf_name_that_cannot_be_reached_is_one_clear_line() -> None:
    with pytest.raises(ValueError, match=r"^task='hf:no-such-org/no-such-set': cannot load it \(") as err:
        load_hub_task("hf:no-such-org/no-such-set")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec, message", [
    ("csv:", "nothing after 'csv:'"),
    ("csv:x.csv?lable=y", "unknown option 'lable'; known: features, label, size, subset, test-fraction"),
    ("csv:x.csv?label", "key=value pairs"),
    ("csv:x.csv?subset=a", "option 'subset' applies to hf: only"),
    ("imagefolder:d?features=a", "option 'features' applies to hf:, csv:, parquet: only"),
])
def test_malformed_specs_are_refused_before_reading(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_spec(spec)


@pytest.mark.parametrize("spec, message", [
    ("csv:missing.csv", "missing.csv does not exist ('missing.csv' is relative: resolved against data-dir"),
    ("csv:t.csv?test-fraction=1", "option test-fraction='1' must be in (0, 1)"),
    ("csv:t.csv?label=kind&size=8", "option 'size' is for images"),
    ("csv:t.csv?label=score", "label column 'score' holds fractional numbers"),
    ("csv:t.csv?label=kind&features=gap", "column ['gap'] has missing or infinite values"),
    ("csv:t.csv?label=kind&features=nope", "no column 'nope'"),
])
def test_bad_data_is_one_line_naming_the_problem(tmp_path: Path, spec: str, message: str) -> None:
    pd.DataFrame({"v": [1.0, 2.0, 3.0], "gap": [1.0, None, 2.0], "score": [0.5, 1.5, 2.0],
                  "kind": [0, 1, 0]}).to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_hub_task(spec, str(tmp_path))


def test_a_relative_path_says_where_it_was_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """data-dir '' leaves a relative path to the process's working directory (the ServerApp's is
    the SuperLink's): the line names the absolute path tried and that directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as refused:
        load_hub_task("csv:data/patients.csv", "")
    why = str(refused.value)
    assert f"{tmp_path / 'data' / 'patients.csv'} does not exist" in why, why
    assert f"resolved against data-dir '' in the working directory {tmp_path} of this process" in why, why


@pytest.mark.slow
def test_nodes_with_their_own_data_dir_train_on_all_of_it(tmp_path: Path) -> None:
    """Two organisations, each a SuperNode whose node config sets `data-dir` (no partition id):
    the same task string reads each one's own file, and each trains on all of its rows."""
    sizes = {1: 150, 2: 90}  # rows per node; 80 % of them are its train split
    dirs = {}
    for node, rows in sizes.items():
        dirs[node] = tmp_path / f"org-{node}"
        dirs[node].mkdir()
        clinic_frame(rows, seed=node).to_csv(dirs[node] / "clinic.csv", index=False)
    server_dir = tmp_path / "server"  # the server's own copy, for central evaluation
    server_dir.mkdir()
    clinic_frame(200, seed=9).to_csv(server_dir / "clinic.csv", index=False)

    cfg = RunConfig.of(algorithm="fedact", task="csv:clinic.csv?label=outcome&features=age,dose",
                       model="mlp", data_dir=str(server_dir), num_server_rounds=2, local_steps=10,
                       batch_size=16, lr=0.01,
                       figures=False, results_dir=str(tmp_path / "results"), run_name="own",
                       accept_small_rounds=True)
    seen: dict[int, int] = {}

    def recording(msg, context):  # noqa: ANN001, ANN202 - the ClientApp's handler, observed
        reply = train_or_refuse(msg, context)
        assert not reply.has_error(), reply.error.reason
        seen[context.node_id] = int(reply.content[wire.METRICS][wire.NUM_EXAMPLES])
        return reply

    grid = InProcessGrid(2, cfg.to_flower(), handler=recording)
    for node, folder in dirs.items():
        grid.contexts[node].node_config = {wire.NODE_DATA_DIR: str(folder)}
    out = run_federated(grid, cfg)
    assert seen == {node: len(load_task(cfg.data.task, str(dirs[node])).train) for node in sizes}
    assert seen == {1: 120, 2: 72}
    rows = metric_rows(out)
    assert [r["replies-accepted"] for r in rows] == [2, 2]
    assert rows[-1]["test-accuracy"] > 0.8  # three separable classes; chance is 1/3


def test_a_node_with_neither_data_dir_nor_partition_is_refused_in_one_line(tmp_path: Path) -> None:
    clinic_frame(30, seed=0).to_csv(tmp_path / "clinic.csv", index=False)
    cfg = RunConfig.of(task="csv:clinic.csv?label=outcome&features=age,dose", model="mlp",
                       data_dir=str(tmp_path), num_server_rounds=1, local_steps=1,

                       figures=False,
                       results_dir=str(tmp_path / "results"), run_name="none", accept_small_rounds=True)
    grid = InProcessGrid(1, cfg.to_flower())
    grid.contexts[1].node_config = {}
    reply = train_or_refuse(grid.create_message(_first_instruction(cfg), "train", 1, ""), grid.contexts[1])
    assert reply.has_error() and "neither data-dir" in reply.error.reason


def _first_instruction(cfg: RunConfig):  # noqa: ANN202
    from adaptfl.server_app.loop import build_run

    strategy, _, _ = build_run(cfg)
    return strategy.instruction(1)
