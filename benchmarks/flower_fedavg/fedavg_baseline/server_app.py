"""A plain Flower ServerApp: Flower's FedAvg and `strategy.start`, central evaluation with
adaptfl's evaluate; per round the same measurements adaptfl's rows carry (`seconds`: from the
end of one round's evaluation to the end of the next, `server-rss-mb`)."""

import json
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from adaptfl.server_app.evaluate import evaluate
from adaptfl.server_app.loop import rss_mb
from adaptfl.workloads import build_task_model, load_task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    task = load_task(str(cfg["task"]), str(cfg["data-dir"]))
    torch.manual_seed(int(cfg["seed"]))
    model = build_task_model(str(cfg["model"]), task)
    rows: list[dict] = []
    out = Path(str(cfg["out-dir"])) if cfg["out-dir"] else None
    last = [time.perf_counter()]

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        accuracy, loss = evaluate(model, task)
        now = time.perf_counter()
        rows.append({"round": server_round, "test-accuracy": accuracy, "test-loss": loss,
                     "seconds": now - last[0], "server-rss-mb": rss_mb()})
        last[0] = now
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    strategy = FedAvg(fraction_train=float(cfg["fraction-train"]), fraction_evaluate=0.0,
                      min_train_nodes=1, min_evaluate_nodes=0, min_available_nodes=1)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=int(cfg["num-server-rounds"]), evaluate_fn=evaluate_fn)
