"""ServerApp: the model, the strategy, its `start` loop with central evaluation, the final model."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from pytorch_example.strategy import CustomStrategy
from pytorch_example.task import Net, central_test_loader, create_run_dir, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    # FedACT needs the clients' epochs and batch size: its Δ_G = -mean Δ/(K·lr) divides each
    # reply by its own step count K = ⌈epochs·rows/32⌉
    strategy = CustomStrategy(fraction_train=cfg["fraction-train"],
                              fraction_evaluate=cfg["fraction-evaluate"],
                              local_epochs=cfg["local-epochs"], batch_size=32)
    strategy.save_path = create_run_dir(dict(cfg), cfg["out-dir"])
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": 0.001}),  # AdamW's (FedACT's) lr, not SGD's 0.1
        num_rounds=cfg["num-server-rounds"],
        evaluate_fn=central_evaluate(cfg["server-device"], cfg["data-dir"], cfg["num-test-examples"]),
    )
    torch.save(result.arrays.to_torch_state_dict(), strategy.save_path / "final_model.pt")


def central_evaluate(device: str, data_dir: str, size: int):  # noqa: ANN201 - Flower's evaluate_fn
    loader = central_test_loader(data_dir, size)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, loader, device)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    return evaluate
