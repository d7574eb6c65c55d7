"""One round of bench_cohort.py's workload under Apple's pfl-research 0.6 (PyPI `pfl`, not an adaptfl
dependency): FedAvg, simulated in this process.

    from pfl_round import pfl_round  # bench_cohort.py --pfl
    python benchmarks/pfl_round.py [--model mlp|cnn] [--clients 10] [--nodes 10] [--steps 50]
        [--batch 50] [--rounds 5] [--algorithm fedavg] [--device cpu|cuda] [--threads 1]

What pfl runs: `FederatedAveraging` on a `SimulatedBackend` (no postprocessors, so no weighting, clipping
or noise); each central iteration samples all C clients (`MinimizeReuseUserSampler` over the C user ids
with a cohort of C visits each once); each trains from the global model (local optimizer
`torch.optim.SGD` lr 0.1 for fedavg, `torch.optim.AdamW` lr 1e-3 for any other algorithm, new each user)
for K = `local_num_steps` steps of B = `local_batch_size` rows; the server sums the C model differences
(each of weight 1), `average()`s them and applies the mean through a central `torch.optim.SGD` of lr 1.0,
so the new global model is the plain mean of the clients' models.

The batches: pfl's `Dataset.iter(B)` cuts a user's rows into consecutive slices of B, in order and
without shuffling, and `PyTorchModel.do_multiple_epochs_of` stops after `local_num_steps` slices or at
the end of the rows (one epoch). So the user's dataset that `make_dataset_fn` hands pfl each round is
the K*B rows of K random batches, drawn as the engine and bench_cohort's bare contenders draw them
(`adaptfl.workloads.sample_batches`, generator seeded 1000 * round + client, shuffled epochs of the
client's rows) and gathered in order: pfl's K slices are then exactly those K batches. (A client with
fewer than B rows, where sample_batches uses the whole partition for every batch, would get
ceil(K*n/B) slices instead; the Dirichlet partitions of Fashion-MNIST here have thousands of rows.)
That gather is inside the timed round, as the engine's batch indexing is inside its.

The time: a round is one central iteration of `FederatedAveraging.run`, measured with
`time.perf_counter` (after `torch.cuda.synchronize()` on a GPU) by two callbacks: the first in the
list stops the clock in `after_central_iteration`, the last restarts it there, so a lap runs from the
end of one iteration's callbacks to the end of the next iteration's central update (the next contexts,
the cohort's datasets, K local steps per client, the sum, the average and the central step) and
leaves out whatever other callbacks do (none here; central evaluation would go there). Evaluation is
excluded: no validation cohort, no evaluation callback, no metrics sent to the platform, and
`evaluation_frequency` = R, so the only local evaluation pfl does (each user's loss before and after
training, at central iteration 0) falls in round 1, which is not timed: the result is the median of
rounds 2..R.

The given model is trained in place (wrapped in a module that adds pfl's `loss` and `metrics`, not
copied): pfl's rounds carry on from its weights and leave it at pfl's global model, as bench_cohort's
bare contenders also do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import MinimizeReuseUserSampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel

from adaptfl.workloads import build_model, load_task, partition_indices, sample_batches


class Objective(torch.nn.Module):
    """The given classifier with the `loss` and `metrics` that pfl's PyTorchModel calls."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net  # a submodule: its parameters are the ones pfl trains, not a copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Weighted]:
        was_training = self.training
        self.eval()
        total = F.cross_entropy(self.net(x), y, reduction="sum").item()
        self.train(was_training)
        return {"loss": Weighted(total, len(y))}


class RoundClock:
    """Laps of central iterations: `stop` goes first in the callbacks, `start` last."""

    def __init__(self, device: torch.device) -> None:
        self.laps: list[float] = []
        self._cuda = device.type == "cuda"
        self._since = 0.0
        clock = self

        class Stop(TrainingProcessCallback):
            def after_central_iteration(self, aggregate_metrics: Metrics, model: Any, *,
                                        central_iteration: int) -> tuple[bool, Metrics]:
                clock.laps.append(clock.now() - clock._since)
                return False, Metrics()

        class Start(TrainingProcessCallback):
            def on_train_begin(self, *, model: Any) -> Metrics:
                clock._since = clock.now()
                return Metrics()

            def after_central_iteration(self, aggregate_metrics: Metrics, model: Any, *,
                                        central_iteration: int) -> tuple[bool, Metrics]:
                clock._since = clock.now()
                return False, Metrics()

        self.stop, self.start = Stop(), Start()

    def now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def federated_dataset(parts: Sequence[tuple[torch.Tensor, torch.Tensor]], batch: int,
                      steps: int) -> FederatedDataset:
    """Each user's dataset for a round: the rows of its K batches of B, in order (see the docstring)."""
    draws = [0] * len(parts)

    def make_dataset(user: int) -> Dataset:
        x, y = parts[user]
        gen = torch.Generator().manual_seed(1000 * draws[user] + user)  # as bench_cohort's Bare.batches
        draws[user] += 1
        rows = torch.cat(sample_batches(len(y), batch, steps, gen)).to(y.device)
        return Dataset((x[rows], y[rows]), user_id=str(user))

    return FederatedDataset(make_dataset, MinimizeReuseUserSampler(list(range(len(parts)))))


def pfl_round(args: argparse.Namespace, parts: Sequence[tuple[torch.Tensor, torch.Tensor]],
              model: torch.nn.Module, callbacks: Sequence[TrainingProcessCallback] = ()) -> float:
    """Median seconds of one pfl FedAvg central iteration over rounds 2..R (`callbacks`, e.g. an
    evaluation, run untimed after each iteration)."""
    if args.rounds < 2:
        raise ValueError(f"rounds 2..R are timed: need --rounds >= 2, got {args.rounds}")
    device = torch.device(args.device)
    before = os.environ.get("PFL_PYTORCH_DEVICE")
    os.environ["PFL_PYTORCH_DEVICE"] = str(device)  # pfl's default device: cuda whenever there is one
    objective = Objective(model)
    try:
        local: Any = torch.optim.SGD if args.algorithm == "fedavg" else torch.optim.AdamW
        lr = 0.1 if args.algorithm == "fedavg" else 1e-3
        pfl_model = PyTorchModel(objective, local_optimizer_create=local,
                                 central_optimizer=torch.optim.SGD(objective.parameters(), lr=1.0))
        backend = SimulatedBackend(training_data=federated_dataset(parts, args.batch, args.steps),
                                   val_data=None)
        clock = RoundClock(device)
        FederatedAveraging().run(
            algorithm_params=NNAlgorithmParams(central_num_iterations=args.rounds,
                                               evaluation_frequency=args.rounds,
                                               train_cohort_size=len(parts), val_cohort_size=None),
            backend=backend, model=pfl_model,
            model_train_params=NNTrainHyperParams(local_batch_size=args.batch, local_num_epochs=None,
                                                  local_learning_rate=lr, local_num_steps=args.steps),
            model_eval_params=NNEvalHyperParams(local_batch_size=None),
            callbacks=[clock.stop, *callbacks, clock.start], send_metrics_to_platform=False)
    finally:
        if before is None:
            os.environ.pop("PFL_PYTORCH_DEVICE", None)
        else:
            os.environ["PFL_PYTORCH_DEVICE"] = before
        for p in model.parameters():  # pfl's central step leaves the mean update in .grad
            p.grad = None
    return statistics.median(clock.laps[1:])


def main() -> None:
    from machine import describe  # benchmarks/machine.py: benchmarks/ is sys.path[0] when run as a script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--clients", type=int, default=10, help="sampled a round (the cohort)")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = load_task("fashion-mnist", "", args.model)
    parts = []
    for pid in range(args.clients):  # the same partitions as bench_cohort.py's Bare
        rows = torch.as_tensor(partition_indices(task.train.labels, args.nodes, pid, "dirichlet", 0.3, 1))
        x, y = task.train.batch(rows)
        parts.append((x.to(args.device), y.to(args.device)))
    torch.manual_seed(0)
    model = build_model(args.model, 10, 1, 28).to(args.device)
    seconds = pfl_round(args, parts, model)
    print(describe(args.device), f"{args.threads} torch thread(s)")
    print(f"pfl {args.algorithm}, {args.model}: {args.clients} of {args.nodes} clients a round, "
          f"{args.steps} steps of batch {args.batch}: {seconds:.3f} s a round "
          f"(median of rounds 2..{args.rounds})")


if __name__ == "__main__":
    main()
