"""The paper workloads: text, Tiny-ImageNet, the new models and partitioners, the generic loss."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaptfl.workloads import (
    ImageData,
    TextData,
    build_task_model,
    count_correct,
    load_fortunes,
    load_task,
    load_tiny_imagenet,
    partition_indices,
    task_loss,
)
from adaptfl.workloads.llama import apply_rotary, rotary_angles
from adaptfl.workloads.task import Task
from adaptfl.workloads.tasks import as_task
from adaptfl.workloads.text_data import BOS_ID, decode_bytes, token_windows


def test_task_loss_flattens_tokens_like_images() -> None:
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    by_hand = sum(F.cross_entropy(logits[b, t][None], targets[b, t][None])
                  for b in range(2) for t in range(3)) / 6
    torch.testing.assert_close(task_loss(logits, targets), by_hand)
    torch.testing.assert_close(task_loss(logits[:, 0], targets[:, 0]),
                               F.cross_entropy(logits[:, 0], targets[:, 0]))
    assert count_correct(logits, logits.argmax(-1)) == (6, 6)
    with pytest.raises(ValueError, match="do not match"):
        task_loss(logits, targets[:, :2])


def test_token_windows_are_bos_joined_utf8_bytes() -> None:
    windows = token_windows(["ab", "é"], seq_len=2)  # BOS a b BOS 0xC3 0xA9 -> two windows of 3
    assert windows.tolist() == [[BOS_ID, 97, 98], [BOS_ID, 0xC3, 0xA9]]
    assert decode_bytes(windows[1]) == "é"
    data = TextData(tokens=torch.from_numpy(windows.astype(np.int16)), labels=torch.tensor([0, 0]),
                    source_names=("x",))
    x, y = data.batch(torch.tensor([1]))
    assert x.tolist() == [[BOS_ID, 0xC3]] and y.tolist() == [[0xC3, 0xA9]]


def write_fake_fortunes(root: Path) -> None:
    """Debian's layout: English at the top, a folder per language, .dat indexes, .u8 links."""
    (root / "de").mkdir(parents=True)
    (root / "it").mkdir()
    (root / "cookie").write_text("one fortune\n%\ntwo\n" * 30)
    (root / "cookie.dat").write_bytes(b"\0" * 40)  # binary index: must be skipped
    os.symlink("cookie", root / "cookie.u8")
    (root / "de" / "witze").write_text("Ein Witz über Äpfel\n%\n" * 20)
    (root / "it" / "leggi").write_text("la legge\n%\n" * 25)
    os.symlink("it/leggi", root / "leggi")  # the top folder links Italian topics in


def test_fortunes_from_local_files(tmp_path: Path) -> None:
    write_fake_fortunes(tmp_path)
    train, test = load_fortunes(str(tmp_path), by="language", seq_len=8)
    assert train.source_names == ("en", "de", "it")
    assert set(train.labels.tolist()) == {0, 1, 2} and train.seq_len == 8
    english = train.tokens[train.labels == 0]
    assert decode_bytes(english[0].tolist()).startswith("one fort")
    # The .dat index is no text: every English window is BOS or printable bytes.
    assert all(t == BOS_ID or 9 <= t < 128 for t in english.flatten().tolist())
    # The linked Italian topic is read once, from its own folder.
    total_it = len(token_windows(["la legge"] * 25, 8))
    assert int((train.labels == 2).sum() + (test.labels == 2).sum()) == total_it
    topics, _ = load_fortunes(str(tmp_path), by="topic", seq_len=8)
    assert topics.source_names == ("en/cookie", "de/witze", "it/leggi")


def test_real_fortunes_corpus_is_four_languages() -> None:
    task = load_task("fortunes", "")
    train, test = task.train, task.test
    assert train.source_names == ("en", "de", "es", "it") and len(train) > 50_000
    assert 500 < len(test) < len(train) // 50  # ~1% held out for a cheap evaluation


def write_fake_tiny_imagenet(root: Path) -> dict[str, int]:
    from PIL import Image

    folder = root / "tiny-imagenet-200"
    wnids = ["n01443537", "n01629819"]
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    rng = np.random.default_rng(0)
    for wnid in wnids:
        (folder / "train" / wnid / "images").mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / "train" / wnid / "images" / f"{wnid}_{i}.JPEG")
    Image.fromarray(np.zeros((64, 64), dtype=np.uint8)).save(folder / "val" / "images" / "val_0.JPEG")
    Image.fromarray(np.full((64, 64, 3), 255, np.uint8)).save(folder / "val" / "images" / "val_1.JPEG")
    (folder / "val" / "val_annotations.txt").write_text(
        f"val_0.JPEG\t{wnids[1]}\t0\t0\t63\t63\nval_1.JPEG\t{wnids[0]}\t1\t1\t60\t60\n")
    return {wnid: i for i, wnid in enumerate(wnids)}


def test_tiny_imagenet_from_local_files(tmp_path: Path) -> None:
    write_fake_tiny_imagenet(tmp_path)
    train, test = load_tiny_imagenet(str(tmp_path))
    assert train.images.shape == (6, 3, 64, 64) and train.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert test.labels.tolist() == [1, 0] and train.num_classes == 2
    assert int(test.images[0].max()) < 8  # the greyscale file became three dark channels
    assert int(test.images[1].min()) > 247
    with pytest.raises(ValueError, match="wnids.txt"):
        load_tiny_imagenet(str(tmp_path / "nowhere"))


def fixed_image_batch(channels: int, side: int, classes: int) -> ImageData:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, channels, side, side), generator=gen, dtype=torch.uint8)
    return ImageData(images=images, labels=torch.arange(8) % classes, num_classes=classes,
                     mean=(0.5,) * channels, std=(0.25,) * channels)


def fixed_text_batch() -> TextData:
    text = "the quick brown fox jumps over the lazy dog. " * 8
    windows = token_windows([text], seq_len=32)[:4]
    return TextData(tokens=torch.from_numpy(windows.astype(np.int16)),
                    labels=torch.zeros(len(windows), dtype=torch.int64), source_names=("en",))


@pytest.mark.parametrize("model_name, data", [
    pytest.param("resnet18", fixed_image_batch(3, 32, 10), marks=pytest.mark.slow),  # CIFAR
    ("swin-lite", fixed_image_batch(3, 32, 100)),  # CIFAR-100
    ("swin-lite", fixed_image_batch(1, 28, 10)),   # Fashion-MNIST (28 px: windows pad)
    pytest.param("resnet18", fixed_image_batch(3, 64, 200), marks=pytest.mark.slow),  # Tiny-ImageNet
    ("llama-tiny", fixed_text_batch()),            # fortunes / C4
], ids=["resnet18-cifar", "swin-cifar100", "swin-fmnist", "resnet18-tiny", "llama-text"])
def test_model_trains_on_a_fixed_batch(model_name: str, data: ImageData | TextData) -> None:
    torch.manual_seed(0)
    model = build_task_model(model_name, as_task(data, data, model_name))
    x, y = data.batch(torch.arange(len(data)))
    logits = model(x)
    assert logits.shape == (*y.shape, data.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(6):
        loss = task_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses


def test_resnet18_has_the_cifar_stem() -> None:
    model = build_task_model("resnet18", _task(fixed_image_batch(3, 32, 10)))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)


def test_llama_is_causal_and_rotary_is_relative() -> None:
    torch.manual_seed(0)
    model = build_task_model("llama-tiny", _task(fixed_text_batch())).eval()
    tokens = torch.randint(0, 256, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 256
    with torch.no_grad():  # the future must not change the past's predictions
        torch.testing.assert_close(model(tokens)[0, :8], model(changed)[0, :8])
        assert not torch.allclose(model(tokens)[0, 8:], model(changed)[0, 8:])
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    angles = rotary_angles(10, 8, 10000.0, torch.device("cpu"))
    dot = [float((apply_rotary(q, angles[[i]]) * apply_rotary(k, angles[[i + 3]])).sum()) for i in (0, 5)]
    assert dot[0] == pytest.approx(dot[1], abs=1e-5)  # q·k depends on the offset (3) only


@pytest.mark.slow
def test_language_model_runs_through_client_and_server(tmp_path: Path) -> None:
    """The LM task goes through the same ClientApp and evaluation: per-token loss, one client
    per language (natural-id)."""
    from adaptfl.algorithms.config import RunConfig
    from adaptfl.engine.inprocess import run_inprocess

    cfg = RunConfig.of(task="fortunes", model="llama-tiny", partitioning="natural-id",
                    num_server_rounds=1, local_steps=3, batch_size=8, num_threads=1,
                    figures=False, results_dir=str(tmp_path), run_name="lm", algorithm="fedadamw")
    out = run_inprocess(cfg, num_nodes=4)
    row = [line.split(",") for line in (out / "metrics.csv").read_text().splitlines()]
    metrics = dict(zip(row[0], row[2], strict=False))  # row[1] is round 0, the initial model
    assert float(metrics["replies-accepted"]) == 4
    # Below the uniform guess over 257 byte tokens, so the clients' steps reached the server.
    assert 0 < float(metrics["test-loss"]) < np.log(257) and 0 < float(metrics["test-accuracy"]) < 1


def test_models_and_tasks_must_match() -> None:
    with pytest.raises(ValueError, match="cannot read text"):
        build_task_model("cnn", _task(fixed_text_batch()))
    with pytest.raises(ValueError, match="language model"):
        build_task_model("llama-tiny", _task(fixed_image_batch(1, 28, 10)))


def _task(data: ImageData | TextData) -> Task:
    return as_task(data, data, "fixed")


LABELS = np.repeat(np.arange(5), 20)  # 5 classes x 20 examples


def test_pathological_partitions_hold_k_classes_and_cover_all() -> None:
    parts = [partition_indices(LABELS, 5, i, "pathological", 0.3, 0, classes_per_client=2)
             for i in range(5)]
    assert all(len(set(LABELS[p])) <= 2 for p in parts)
    assert sorted(np.concatenate(parts).tolist()) == list(range(100))
    with pytest.raises(ValueError, match="classes_per_client"):
        partition_indices(LABELS, 5, 0, "pathological", 0.3, 0, classes_per_client=0)


def test_natural_id_gives_one_partition_per_label() -> None:
    shuffled = np.random.default_rng(1).permutation(LABELS)
    for i in range(5):
        idx = partition_indices(shuffled, 5, i, "natural-id", 0.3, 0)
        assert sorted(idx.tolist()) == np.flatnonzero(shuffled == i).tolist()
    with pytest.raises(ValueError, match="5 distinct labels but num_partitions=4"):
        partition_indices(LABELS, 4, 0, "natural-id", 0.3, 0)
