"""ServerApp: the model, the strategy, `strategy.start`, the results."""

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from stock_app.task import Net, central_evaluate, save

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    strategy = FedAvg(fraction_train=cfg["fraction-train"], fraction_evaluate=cfg["fraction-evaluate"])
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=cfg["num-server-rounds"],
        train_config=ConfigRecord({"lr": cfg["lr"]}),
        evaluate_fn=central_evaluate(cfg["data-dir"], cfg["num-test-examples"]),
    )
    save(result, cfg["out-dir"])
