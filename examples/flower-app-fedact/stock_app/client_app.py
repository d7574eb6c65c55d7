"""ClientApp: train the global model for some epochs on this node's data; evaluate it on the
node's own held-out rows."""

import torch.nn.functional as F
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from adaptfl.client_app.session import ClientSession
from adaptfl.core.stage import ClientData
from stock_app.task import Net, load_data, test

app = ClientApp()


def node_data(context: Context) -> tuple:
    cfg = context.run_config
    return load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                     cfg["data-dir"], cfg["num-train-examples"], cfg["batch-size"])


@app.train()
def train(msg: Message, context: Context) -> Message:
    trainloader, _ = node_data(context)
    model = Net()
    # loads the global weights; this node's size gives its step count K = ⌈epochs·rows/batch⌉
    session = ClientSession(msg, model, context=context,
                            data=ClientData(num_examples=len(trainloader.dataset)))
    optimizer = session.optimizer  # FedACT's AdamW, corrected by Δ_G and trust-modulated
    losses = []
    model.train()
    for _ in range(context.run_config["local-epochs"]):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    metrics = {"train_loss": sum(losses) / len(losses), "num-examples": len(trainloader.dataset)}
    return session.reply(num_examples=len(trainloader.dataset), metrics=metrics)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    _, valloader = node_data(context)
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    eval_loss, eval_acc = test(model, valloader)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
