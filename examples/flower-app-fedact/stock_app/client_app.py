"""ClientApp: load the global model, train on this node's data, reply."""

from itertools import cycle

import torch.nn.functional as F
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from adaptfl.client_app.session import ClientSession
from stock_app.task import Net, load_partition

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    model = Net()
    session = ClientSession(msg, model, context=context)  # loads the global weights
    loader = load_partition(context.node_config["partition-id"], context.node_config["num-partitions"],
                            cfg["data-dir"], cfg["num-train-examples"], cfg["batch-size"])
    optimizer = session.optimizer  # FedACT's AdamW, corrected by Δ_G and trust-modulated
    losses = []
    model.train()
    for _, (x, y) in zip(range(cfg["local-steps"]), cycle(loader), strict=False):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return session.reply(num_examples=len(loader.dataset), metrics={"train-loss": sum(losses) / len(losses)})
