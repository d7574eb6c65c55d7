"""The central evaluation on the run's device: a GPU where the server process has one (the
in-process engine, a GPU server), the CPU otherwise; the same numbers either way."""

from __future__ import annotations

import pytest
import torch

from adaptfl.server_app.evaluate import evaluate_all, evaluation_device, on_device
from adaptfl.workloads import Task, build_model
from tests.support.float64_task import Rows


def _task() -> Task:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    return Task(train=Rows(x, y), test=Rows(x, y), num_outputs=10, input_shape=(1, 28, 28), name="t")


def test_a_device_this_process_lacks_evaluates_on_the_cpu() -> None:
    assert evaluation_device("cpu") == torch.device("cpu")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert evaluation_device("auto").type == want
    assert evaluation_device("cuda").type == want  # never a reason to fail the run


def test_on_its_own_device_the_model_itself_is_evaluated() -> None:
    model = torch.nn.Linear(3, 2)
    assert on_device(model, torch.device("cpu")) is model


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_twin_follows_the_server_model_and_scores_alike() -> None:
    torch.manual_seed(0)
    model, task = build_model("mlp", 10, 1, 28), _task()
    cpu = evaluate_all(model, task)
    gpu = evaluate_all(model, task, torch.device("cuda"))
    assert gpu["test-accuracy"] == pytest.approx(cpu["test-accuracy"], abs=1 / 64)
    assert gpu["test-loss"] == pytest.approx(cpu["test-loss"], rel=1e-4)
    with torch.no_grad():  # the next round's weights: the twin must take them
        for p in model.parameters():
            p.mul_(-1)
    assert evaluate_all(model, task, torch.device("cuda"))["test-loss"] == pytest.approx(
        evaluate_all(model, task)["test-loss"], rel=1e-4)
    assert next(model.parameters()).device.type == "cpu"  # the server's model stays where it was
