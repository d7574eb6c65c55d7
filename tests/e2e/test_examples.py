"""The examples in examples/, run as their READMEs say, on tiny settings.

(a) own-data-model: your task and model by `package.module:function`, 2 rounds under `flwr run`
    from the example's own Flower app whose pyproject lists only the keys it sets;
(b) flower-app-fedact: a stock Flower app (epochs, federated evaluation) on `FedACT(...).start(...)`
    with `ClientSession`, 2 rounds under `flwr run`; its FedAvg original still works, the switch
    leaves the loop and the evaluate function alone, and its README shows the real diff;
(c) torch-optimizer: `LocalUpdate` with a torch LR scheduler and a state_dict round trip;
(d) advanced-pytorch-fedact: Flower's advanced-pytorch habits (stateful clients, a custom `start`
    loop, the lr halved at round 5 through the train config) on FedACT, 5 rounds under
    `python -m adaptfl.flwr_run` (the honest exit status) with the app's own run-config keys.

The Flower runs use a private managed SuperLink (stopped by PID) and this checkout's adaptfl
(PYTHONPATH), so another installed adaptfl cannot answer for it.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict

from adaptfl.algorithms.config import RunConfig, declared_keys
from adaptfl.client_app.session import ClientSession
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies.base import AdaptiveStrategy
from tests.conftest import FASHION_MNIST_DIR, needs_fashion_mnist
from tests.support.flower_processes import ONE_ACTOR, PROJECT, flower_env, stop_local_superlink
from tests.support.run_outputs import final_model, metric_rows

EXAMPLES = PROJECT / "examples"
OWN = EXAMPLES / "own-data-model"
STOCK = EXAMPLES / "flower-app-fedact"
TORCH = EXAMPLES / "torch-optimizer"
ADVANCED = EXAMPLES / "advanced-pytorch-fedact"
needs_flwr = pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed")


def example_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(extra or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH", "")) if p)
    env["HF_HUB_OFFLINE"] = "1"  # nothing here may reach for the network
    return env


def flwr_run_app(app: Path, flwr_home: Path, num_supernodes: int, run_config: str,
                 honest: bool = False) -> subprocess.CompletedProcess[str]:
    """`flwr run <app> --stream` in simulation, as the example's README says (`honest`: through
    `python -m adaptfl.flwr_run`, whose exit status says how the run ended); the SuperLink that
    `flwr run` starts is stopped by its PID afterwards."""
    federation = f"num-supernodes={num_supernodes} {ONE_ACTOR}"
    command = [sys.executable, "-m", "adaptfl.flwr_run"] if honest else ["flwr", "run"]
    try:
        return subprocess.run(
            [*command, str(app), "--stream", "--federation-config", federation,
             "--run-config", run_config],
            env=example_env(flower_env(flwr_home)), capture_output=True, text=True, timeout=600,
            check=False, cwd=flwr_home.parent)
    finally:
        stop_local_superlink(flwr_home)


def app_config(app: Path) -> dict:
    with open(app / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


def tail(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout[-3000:] + done.stderr[-3000:]


def example_run_settings() -> dict[str, tuple[Path, int, str, bool]]:
    """The three examples' `flwr run`s of the tests below, as (app, nodes, run config, through
    the honest-exit wrapper); {out} is the run's own folder."""
    stock = " ".join(f"{k}={v}" for k, v in STOCK_RUN.items())
    return {"own": (OWN, 3, "num-server-rounds=2 results-dir='{out}/results' run-name='digits'", False),
            "stock": (STOCK, 3, stock + " out-dir='{out}/out'", True),
            "advanced": (ADVANCED, 3, "num-server-rounds=5 num-train-examples=1200 num-test-examples=500 "
                         "fraction-train=0.5 out-dir='{out}/out'", True)}
ON_EXAMPLE_RUNS = pytest.mark.xdist_group("flower-example-runs")  # the fixture's runs, built once


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """The examples' Flower runs, started together (each its own SuperLink and Ray, as each
    README's command does), so their start-ups overlap: {name: (its folder, how it ended)}. A run
    whose dependency is missing here (scikit-learn, Fashion-MNIST) is left out; its test skips."""
    if shutil.which("flwr") is None:
        pytest.skip("the flwr CLI is not installed")
    settings = example_run_settings()
    wanted = [name for name in settings
              if (importlib.util.find_spec("sklearn") is not None if name == "own"
                  else os.path.isdir(FASHION_MNIST_DIR))]
    folders = {name: tmp_path_factory.mktemp(name) for name in wanted}
    with ThreadPoolExecutor(max(1, len(wanted))) as pool:
        running = {name: pool.submit(flwr_run_app, app, folders[name] / "flwr-home", nodes,
                                     config.format(out=folders[name]), honest)
                   for name, (app, nodes, config, honest) in settings.items() if name in wanted}
        return {name: (folders[name], run.result()) for name, run in running.items()}


@pytest.mark.parametrize("app", [OWN, STOCK, TORCH, ADVANCED], ids=lambda p: p.name)
def test_each_example_is_a_project_that_depends_on_adaptfl(app: Path) -> None:
    with open(app / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    assert any(re.match(r"adaptfl\b", d) for d in project["dependencies"]), project["dependencies"]
    assert (app / "README.md").is_file()


# --- (a) your own data and model --------------------------------------------------------------
def test_own_data_app_sets_only_its_own_keys() -> None:
    config = app_config(OWN)
    assert set(config) <= set(declared_keys())  # adaptfl's keys, no copies of the rest
    assert len(config) < 15 < len(declared_keys())
    assert config["task"] == "digits_app.task:load" and config["model"] == "digits_app.task:build"


@pytest.mark.flower
@ON_EXAMPLE_RUNS
@needs_flwr
def test_own_data_and_model_train_two_rounds_under_flwr_run(
        example_runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sklearn", reason="pip install -e examples/own-data-model (scikit-learn)")
    folder, done = example_runs["own"]
    results = folder / "results"
    assert done.returncode == 0, tail(done)
    rows = metric_rows(results / "digits")
    assert [r["replies-accepted"] for r in rows] == [3, 3], tail(done)
    assert rows[-1]["test-accuracy"] > 0.4, rows  # 10 digits: chance is 0.1
    # The global model is the user's `build(task)`, not a built-in one.
    monkeypatch.syspath_prepend(str(OWN))
    task_module = importlib.import_module("digits_app.task")
    expected = task_module.build(task_module.load("")).state_dict()
    model = final_model(results / "digits")
    assert {k: v.shape for k, v in model.items()} == {k: v.shape for k, v in expected.items()}


# --- (b) a stock Flower app switched to FedACT -------------------------------------------------
SWITCHED = {STOCK: ("stock_app", ("server_app.py", "client_app.py")),
            ADVANCED: ("pytorch_example", ("strategy.py", "server_app.py", "client_app.py"))}


def switch_diff(app: Path = STOCK) -> str:
    """What the example's README shows: the FedAvg app -> the FedACT app."""
    package, files = SWITCHED[app]
    out = []
    for name in files:
        before = (app / package / "fedavg" / name).read_text().splitlines(keepends=True)
        after = (app / package / name).read_text().splitlines(keepends=True)
        out += difflib.unified_diff(before, after, f"{package}/fedavg/{name}", f"{package}/{name}")
    return "".join(out)


@pytest.mark.parametrize("app", [STOCK, ADVANCED], ids=lambda p: p.name)
def test_the_readme_shows_the_real_switch_diff(app: Path) -> None:
    shown = re.search(r"```diff\n(.*?)```", (app / "README.md").read_text(), re.S)
    assert shown is not None, f"{app}/README.md has no ```diff block"
    assert shown.group(1) == switch_diff(app), \
        f"stale diff: paste `python -m tests.e2e.test_examples {app.name}`"


# The run the tests take: 1925 rows over 3 nodes are IID shards of 642, 642, 641 (flwr-datasets:
# contiguous shards, the first ones one row larger); each node holds out ⌈0.2·n⌉ = 129 of its rows
# (Hugging Face's train_test_split rounds the test share up), so it trains on 513, 513, 512 rows:
# one epoch at batch 32 is K = ⌈513/32⌉ = 17, 17 and ⌈512/32⌉ = 16 steps.
STOCK_RUN = {"num-server-rounds": 2, "num-train-examples": 1925}
STOCK_ROWS, STOCK_STEPS = [513, 513, 512], [17, 17, 16]


def run_stock_app_in_process(package: str, out_dir: Path, **overrides: object) -> dict:
    """The example's own ServerApp main and its ClientApp (Flower's dispatch to `train` and
    `evaluate`), with adaptfl's in-process grid as the transport (no Flower processes): what
    the ServerApp saved, by file and round."""
    server = importlib.import_module(f"{package}.server_app")
    client = importlib.import_module(f"{package}.client_app")
    run_config = {**app_config(STOCK), **STOCK_RUN, "out-dir": str(out_dir), **overrides}
    grid = InProcessGrid(3, run_config, handler=client.app)
    torch.manual_seed(0)
    server.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                              run_config=run_config))
    return stock_results(out_dir)


def stock_results(out_dir: Path) -> dict[str, dict[int, dict]]:
    return {name: {int(r): m for r, m in json.loads((out_dir / f"{name}.json").read_text()).items()}
            for name in ("central", "train", "federated")}


def check_learned(central: dict[int, dict]) -> None:
    accuracy = {r: m["accuracy"] for r, m in central.items()}
    assert sorted(accuracy) == [0, 1, 2] and accuracy[2] > max(0.4, accuracy[0] + 0.2), accuracy


def check_federated(federated: dict[int, dict], accuracy: str, loss: str) -> None:
    """Federated evaluation arrived for each round: the clients' held-out accuracy and loss."""
    assert sorted(federated) == [1, 2], federated
    assert all(0.3 < m[accuracy] <= 1.0 and 0.0 < m[loss] < 2.5 for m in federated.values()), federated


def functions(path: Path) -> dict[str, str]:
    """A module's top-level functions, by name: their source text."""
    text = path.read_text()
    return {f.name: ast.get_source_segment(text, f) or "" for f in ast.parse(text).body
            if isinstance(f, ast.FunctionDef)}


def test_the_fedact_app_keeps_the_epochs_loop_and_the_evaluate_function() -> None:
    """The switch touches the strategy and the session, never the user's loop or evaluation."""
    before, after = (functions(STOCK / "stock_app" / sub / "client_app.py") for sub in ("fedavg", "."))
    assert before["evaluate"] == after["evaluate"] and before["node_data"] == after["node_data"]
    loop = [f["train"].split("    losses = []")[1].split("    metrics =")[0] for f in (before, after)]
    assert loop[0] == loop[1] and 'range(context.run_config["local-epochs"])' in loop[0], loop


@pytest.mark.slow
@needs_fashion_mnist
def test_stock_app_works_before_and_after_the_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    monkeypatch.syspath_prepend(str(STOCK))
    fedavg = run_stock_app_in_process("stock_app.fedavg", tmp_path / "fedavg", lr=0.02)  # SGD's lr
    check_learned(fedavg["central"])
    check_federated(fedavg["federated"], "eval_acc", "eval_loss")  # Flower's FedAvg aggregated them
    # Each FedACT client ran its own epoch: the steps its optimizer took, by its rows.
    client = importlib.import_module("stock_app.client_app")
    ran: list[tuple[int, int]] = []

    class Counted(ClientSession):
        def reply(self, num_examples: int, metrics=None, batched=None):  # noqa: ANN001, ANN202
            ran.append((num_examples, self.optimizer.steps))
            return super().reply(num_examples, metrics, batched)

    monkeypatch.setattr(client, "ClientSession", Counted)
    fedact = run_stock_app_in_process("stock_app", tmp_path / "fedact")
    check_learned(fedact["central"])
    check_federated(fedact["federated"], "fed-eval-accuracy", "fed-eval-loss")
    assert sorted(ran) == sorted([*zip(STOCK_ROWS, STOCK_STEPS, strict=True)] * 2), ran  # 2 rounds
    # ACT's diagnostics come back from the clients: FedACT's optimizer ran in the user's loop.
    assert all("pos-ratio" in m and m["replies-accepted"] == 3 for m in fedact["train"].values())


@pytest.mark.flower
@ON_EXAMPLE_RUNS
@needs_flwr
@needs_fashion_mnist
def test_stock_flower_app_runs_fedact_two_rounds_under_flwr_run(
        example_runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]) -> None:
    """The Done-when bullet: the ported quickstart on `FedACT(...)` in a stock Flower ServerApp
    with `strategy.start`, 2 rounds of one epoch per client, federated evaluation on half the
    nodes after each round (the app's pyproject as shipped)."""
    folder, done = example_runs["stock"]
    out = folder / "out"
    assert done.returncode == 0, tail(done)  # the wrapper's: the SuperLink says it completed
    assert (out / "central.json").is_file(), tail(done)
    assert "Starting FedACT strategy" in done.stdout + done.stderr
    results = stock_results(out)
    check_learned(results["central"])
    check_federated(results["federated"], "fed-eval-accuracy", "fed-eval-loss")
    assert all(0.3 < m["fed-eval-accuracy-p10"] <= m["fed-eval-accuracy"]
               for m in results["federated"].values()), results["federated"]
    train = results["train"]
    assert [m["replies-accepted"] for m in train.values()] == [3, 3]
    # The clients' own K, each by its rows: 17, 17 and 16, averaged by their rows as Flower does.
    steps = sum(r * k for r, k in zip(STOCK_ROWS, STOCK_STEPS, strict=True)) / sum(STOCK_ROWS)
    assert all(m["local-steps"] == pytest.approx(steps) for m in train.values()), train
    assert all("pos-ratio" in m and "train_loss" in m for m in train.values())
    assert "local steps, the run's local-steps is" not in done.stdout + done.stderr
    assert (out / "model.pt").is_file()


# --- (c) LocalUpdate as a plain torch optimizer -------------------------------------------------
@pytest.mark.slow  # a subprocess that imports torch and reads Fashion-MNIST: ~9 s
@needs_fashion_mnist
def test_torch_optimizer_example_resumes_bit_for_bit_under_a_scheduler() -> None:
    done = subprocess.run([sys.executable, "train.py", "--steps", "40"], cwd=TORCH, env=example_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, tail(done)
    out = done.stdout
    assert "resumed from step 20: bit-identical to the uninterrupted run" in out, out
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < 0.5 * first, out
    # Cosine annealing reached the optimizer: the last step moved the weights far less.
    ratio = float(re.search(r"last step / first: ([\d.e+-]+)", out).group(1))
    assert ratio < 0.05, out


# --- (d) Flower's advanced-pytorch habits on FedACT ------------------------------------------------
def test_the_advanced_switch_leaves_the_clients_head_and_evaluation_alone() -> None:
    before, after = (functions(ADVANCED / "pytorch_example" / sub / "client_app.py")
                     for sub in ("fedavg", "."))
    for name in ("evaluate", "keep_head", "restore_head", "node_data"):
        assert before[name] == after[name], name
    # the strategy: its base class and that import, nothing else (the lr step, `start` as they were)
    texts = [(ADVANCED / "pytorch_example" / sub / "strategy.py").read_text().splitlines()
             for sub in ("fedavg", ".")]
    changed = [line[1:] for line in difflib.unified_diff(*texts, n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    allowed = ("from ", "class CustomStrategy(")
    assert changed and all(not c.strip() or c.startswith(allowed) for c in changed), changed


def test_the_advanced_app_keeps_its_own_keys_through_the_wrapper() -> None:
    """`server-device`, `num-train-examples`, `out-dir` are the app's: adaptfl's ServerApp would
    refuse them, the app's own one reads them, so `python -m adaptfl.flwr_run` lets them by."""
    from adaptfl import flwr_run

    own = set(app_config(ADVANCED)) - set(declared_keys())
    assert {"server-device", "num-train-examples", "out-dir"} <= own
    ours = "server-device='cpu' num-train-examples=900"
    assert flwr_run.refusal([str(ADVANCED), "--run-config", ours]) is None
    assert flwr_run.refusal([str(ADVANCED), "-c", "fraction-train=0"]) == \
        "invalid fraction-train=0: must be > 0.0 (range (0, 1])"


@pytest.mark.flower
@ON_EXAMPLE_RUNS
@needs_flwr
@needs_fashion_mnist
def test_advanced_app_halves_its_lr_at_round_5_under_flwr_run(
        example_runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]) -> None:
    """The app as shipped, 5 rounds on 3 nodes, through the honest-exit wrapper: exit 0; the
    train config's lr, halved by the app's own `configure_train` at round 5, is what the clients
    stepped with (the `lr` of each round's train metrics); the model learned."""
    folder, done = example_runs["advanced"]
    out = folder / "out"
    assert done.returncode == 0, tail(done)
    [run_dir] = list(out.glob("outputs/*/*"))
    rows = json.loads((run_dir / "results.json").read_text())
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5], rows
    assert [r["train_metrics"]["lr"] for r in rows] == pytest.approx([1e-3] * 4 + [5e-4]), rows
    assert all(r["train_metrics"]["replies-accepted"] == 2 for r in rows), rows
    accuracy = [r["evaluate_metrics_serverapp"]["accuracy"] for r in rows]
    assert accuracy[-1] > 0.4, accuracy  # 10 classes: chance is 0.1
    assert all("fed-eval-accuracy" in r["evaluate_metrics_clientapp"] for r in rows), rows
    assert (run_dir / "final_model.pt").is_file() and list(run_dir.glob("best_model_round_*.pt"))


if __name__ == "__main__":  # the diff for an example's README: python -m tests.e2e.test_examples [NAME]
    print(switch_diff(EXAMPLES / sys.argv[1] if len(sys.argv) > 1 else STOCK), end="")


def test_a_session_warns_when_the_loop_takes_another_number_of_steps(caplog) -> None:
    """The server scales Δ by the run's K (Δ_G = -mean Δ/(K·lr)): a user's loop that takes fewer
    steps than the strategy was told is named in the client's log."""
    model = torch.nn.Linear(3, 2)
    strategy = AdaptiveStrategy(RunConfig.of(algorithm="fedact", local_steps=5))
    strategy.initialize(model.state_dict())
    session = ClientSession(strategy.instruction(1), model)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    for _ in range(2):
        logits = model(x)
        session.backward(session.loss(x, logits, torch.nn.functional.cross_entropy(logits, y)), logits)
        session.step()
    with caplog.at_level(logging.WARNING):
        session.reply_content(4)
    assert "this client took 2 local steps, the run's local-steps is 5" in caplog.text
    assert "pass local_steps= to the strategy" in caplog.text


def test_under_local_epochs_the_warning_names_the_epochs_not_local_steps(caplog) -> None:
    """With local-epochs the run's K is this client's ceil(E·examples/batch): the warning says
    so (a user of epochs has no local_steps= to pass)."""
    from adaptfl.core.stage import ClientData

    model = torch.nn.Linear(3, 2)
    strategy = AdaptiveStrategy(RunConfig.of(algorithm="fedavg", local_epochs=1.0, batch_size=2))
    strategy.initialize(model.state_dict())
    session = ClientSession(strategy.instruction(1), model, data=ClientData(num_examples=5))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    logits = model(x)
    session.backward(session.loss(x, logits, torch.nn.functional.cross_entropy(logits, y)), logits)
    session.step()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        session.reply_content(5)
    assert "this client took 1 local steps, the run's local-steps is 3" in caplog.text
    assert "local-epochs=1 over this client's 5 examples at batch-size=2 is 3 steps" in caplog.text
    assert "local_steps=" not in caplog.text
