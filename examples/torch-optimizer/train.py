"""FedACT's local optimizer as a plain torch optimizer: no Flower, no federation.

`LocalUpdate` is a `torch.optim.Optimizer`: built from `model.parameters()` with keyword
hyperparameters, driven by a torch LR scheduler through `param_groups`, saved and restored with
`state_dict()` / `load_state_dict()`. This script trains a small CNN on Fashion-MNIST with AdamW
directions and ACT trust modulation (τ = 0.3: α = 1/τ on the top 30 % of coordinates by
u ⊙ g, γ = τ elsewhere) under cosine annealing, saves a checkpoint halfway, and checks that a
fresh model + optimizer + scheduler restored from it finish bit for bit like the uninterrupted run.

    python train.py                  # 200 steps, checkpoint at 100
    python train.py --steps 40       # what CI runs
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR

from adaptfl.local_update import LocalUpdate
from adaptfl.workloads import load_fashion_mnist


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),  # 28 -> 12
                         nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),  # 12 -> 4
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def make_optimizer(model: nn.Module, steps: int) -> tuple[LocalUpdate, CosineAnnealingLR]:
    optimizer = LocalUpdate(model.parameters(), lr=3e-3, weight_decay=1e-4, trust="act", tau=0.3)
    return optimizer, CosineAnnealingLR(optimizer, T_max=steps)


def batch_rows(step: int, n: int, batch_size: int) -> torch.Tensor:
    """The rows of step `step`: seeded by the step, so a resumed run sees the same batches."""
    return torch.randint(0, n, (batch_size,), generator=torch.Generator().manual_seed(step))


def train(model: nn.Module, optimizer: LocalUpdate, scheduler: CosineAnnealingLR, data, steps: range,
          batch_size: int) -> list[tuple[float, float, float]]:
    """(loss, lr, size of the parameter update) per step."""
    log = []
    for step in steps:
        x, y = data.batch(batch_rows(step, len(data), batch_size))
        before = [p.detach().clone() for p in model.parameters()]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        moved = [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]
        log.append((float(loss.detach()), lr, float(torch.cat([m.flatten() for m in moved]).norm())))
    return log


@torch.no_grad()
def accuracy(model: nn.Module, data, rows: torch.Tensor) -> float:
    x, y = data.batch(rows)
    return float((model(x).argmax(1) == y).float().mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data-dir", default="", help="Fashion-MNIST IDX files; empty: the system's")
    parser.add_argument("--test-examples", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the bit-for-bit comparison below must not depend on threading
    train_data, test_data = load_fashion_mnist(args.data_dir)
    half = args.steps // 2

    # The uninterrupted run, with a checkpoint of model, optimizer and scheduler halfway.
    model = make_model(seed=0)
    optimizer, scheduler = make_optimizer(model, args.steps)
    log = train(model, optimizer, scheduler, train_data, range(half), args.batch_size)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "checkpoint.pt"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict()}, checkpoint)
        state = torch.load(checkpoint, weights_only=True)  # plain tensors and numbers: no pickled code
    log += train(model, optimizer, scheduler, train_data, range(half, args.steps), args.batch_size)

    # A fresh process would do exactly this: build everything anew, load the checkpoint, go on.
    resumed = make_model(seed=1)  # other initial weights: the checkpoint alone must decide
    resumed_opt, resumed_sched = make_optimizer(resumed, args.steps)
    resumed.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["optimizer"])
    resumed_sched.load_state_dict(state["scheduler"])
    train(resumed, resumed_opt, resumed_sched, train_data, range(half, args.steps), args.batch_size)

    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  resumed.state_dict().values(), strict=True))
    rows = torch.arange(min(args.test_examples, len(test_data)))
    first, last = log[0], log[-1]
    print(f"loss {first[0]:.3f} -> {last[0]:.3f}; test accuracy {accuracy(model, test_data, rows):.3f} "
          f"({len(rows)} images)")
    print(f"lr {first[1]:.2e} -> {last[1]:.2e} (cosine); update size, last step / first: "
          f"{last[2] / first[2]:.2e}")
    print(f"resumed from step {half}: {'bit-identical' if same else 'DIFFERENT'} to the uninterrupted run")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
