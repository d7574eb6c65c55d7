"""ClientApp: load the global model, train on this node's data, reply."""

from itertools import cycle

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from stock_app.task import Net, load_partition

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loader = load_partition(context.node_config["partition-id"], context.node_config["num-partitions"],
                            cfg["data-dir"], cfg["num-train-examples"], cfg["batch-size"])
    optimizer = torch.optim.SGD(model.parameters(), lr=msg.content["config"]["lr"], momentum=0.9)
    losses = []
    model.train()
    for _, (x, y) in zip(range(cfg["local-steps"]), cycle(loader), strict=False):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    metrics = {"train-loss": sum(losses) / len(losses), "num-examples": len(loader.dataset)}
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
