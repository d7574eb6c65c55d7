"""A user's own task and model by name (`task='pkg.mod:load' model='pkg.mod:build'`), from a
package outside the project, in-process: two rounds train, and each way of getting it wrong is
one line naming the problem, before round 1. (examples/own-data-model does the same under
`flwr run`, in the slower `flower` tests.)"""

from __future__ import annotations

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run, run_federated
from tests.support.run_outputs import metric_rows
from tests.support.user_package import write_user_package

MODULE = '''
def load(data_dir):
    return quadrants(400, 300)

def build(task):
    return torch.nn.Sequential(torch.nn.Linear(task.input_shape[0], 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, task.num_outputs))

def too_wide(task):
    return torch.nn.Linear(task.input_shape[0], task.num_outputs + 1)

def too_narrow(task):
    return torch.nn.Linear(task.input_shape[0], task.num_outputs - 2)

def wrong_input(task):
    return torch.nn.Linear(5, task.num_outputs)

def not_a_task(data_dir):
    return [1, 2, 3]

def not_a_model(task):
    return "a string"
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch) -> str:
    return write_user_package(tmp_path, monkeypatch, "quadrants_pkg", MODULE)


def _cfg(tmp_path, **kw) -> RunConfig:
    values = dict(algorithm="fedact", num_server_rounds=2, local_steps=10, batch_size=16, lr=0.01,
                  partitioning="iid", figures=False, results_dir=str(tmp_path / "out"), run_name="own")
    return RunConfig.of(**{**values, **kw})


def test_own_task_and_model_train_two_rounds(user_package, tmp_path) -> None:
    cfg = _cfg(tmp_path, task=f"{user_package}:load", model=f"{user_package}:build")
    rows = metric_rows(run_federated(InProcessGrid(3, cfg.to_flower()), cfg), initial=True)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(r["replies-accepted"] == 3 for r in rows[1:])
    assert rows[-1]["test-accuracy"] > max(0.4, rows[0]["test-accuracy"] + 0.1)  # chance: 0.25


@pytest.mark.parametrize("task,model,message", [
    ("no_such_pkg.mod:load", "mlp", "task='no_such_pkg.mod:load': cannot import 'no_such_pkg.mod'"),
    ("{pkg}:missing", "mlp", "'quadrants_pkg.mod' has no 'missing'"),
    ("{pkg}:not_a_task", "mlp", "returned list, expected adaptfl.workloads.Task"),
    ("{pkg}:load", "{pkg}:not_a_model", "returned str, expected a torch.nn.Module"),
    # issue 20 §1b: too wide used to train and report accuracy, too narrow to end in a 28-line
    # IndexError from the loss naming neither the model nor the width
    ("{pkg}:load", "{pkg}:too_wide", "model='quadrants_pkg.mod:too_wide' gives 5 outputs per "
     "prediction but task 'quadrants' has num_outputs=4"),
    ("{pkg}:load", "{pkg}:too_narrow", "model='quadrants_pkg.mod:too_narrow' gives 2 outputs per "
     "prediction but task 'quadrants' has num_outputs=4"),
    ("{pkg}:load", "{pkg}:wrong_input", "model='quadrants_pkg.mod:wrong_input' cannot read task "
     "'quadrants''s inputs (one example: (6,)): mat1 and mat2 shapes cannot be multiplied"),
])
def test_a_wrong_reference_is_one_line_before_round_1(user_package, tmp_path, task, model, message) -> None:
    cfg = _cfg(tmp_path, task=task.format(pkg=user_package), model=model.format(pkg=user_package))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        build_run(cfg)
    assert "\n" not in str(err.value)
