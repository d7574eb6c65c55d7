"""ServerApp: the model, the strategy, `strategy.start`, the results."""

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from adaptfl.strategies import FedACT
from stock_app.task import Net, central_evaluate, save

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    # The clients' lr and local steps K go to FedACT: it sends the lr in its recipe, and its
    # global direction is Δ_G = -mean Δ / (K·lr).
    strategy = FedACT(fraction_train=cfg["fraction-train"], rho=0.5, tau=0.3,
                      lr=cfg["lr"], local_steps=cfg["local-steps"])
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=cfg["num-server-rounds"],
        evaluate_fn=central_evaluate(cfg["data-dir"], cfg["num-test-examples"]),
    )
    save(result, cfg["out-dir"])
