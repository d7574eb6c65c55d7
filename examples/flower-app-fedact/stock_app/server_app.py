"""ServerApp: the model, the strategy, `strategy.start`, the results."""

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from adaptfl.strategies import FedACT
from stock_app.task import Net, central_evaluate, save

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    # FedACT sends the clients their lr (AdamW's: start from 1e-3, not the SGD value), and needs their
    # epochs and batch size: its Δ_G = -mean Δ/(K·lr) divides each reply by its own step count K.
    strategy = FedACT(fraction_train=cfg["fraction-train"], fraction_evaluate=cfg["fraction-evaluate"],
                      rho=0.5, tau=0.3, lr=cfg["lr"], local_epochs=cfg["local-epochs"],
                      batch_size=cfg["batch-size"])
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=cfg["num-server-rounds"],
        evaluate_fn=central_evaluate(cfg["data-dir"], cfg["num-test-examples"]),
    )
    save(result, cfg["out-dir"])
