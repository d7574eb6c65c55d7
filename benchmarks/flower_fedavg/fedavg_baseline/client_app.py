"""A plain Flower ClientApp: K steps of SGD on this node's Dirichlet partition, reply the weights."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from adaptfl.workloads import build_task_model, load_task, partition_indices, sample_batches

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg, node = context.run_config, context.node_config
    torch.set_num_threads(1)  # as adaptfl's run with num-threads=1
    task = load_task(str(cfg["task"]), str(cfg["data-dir"]))  # cached per process
    pid, count = int(node["partition-id"]), int(node["num-partitions"])
    rows = torch.as_tensor(partition_indices(task.labels, count, pid, "dirichlet",
                                             float(cfg["dirichlet-alpha"]), int(cfg["seed"])).copy())
    model = build_task_model(str(cfg["model"]), task)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]))
    server_round = int(msg.content["config"]["server-round"])
    generator = torch.Generator().manual_seed(int(cfg["seed"]) * 100_003 + server_round * 1009 + pid)
    model.train()
    losses = []
    for batch in sample_batches(len(rows), int(cfg["batch-size"]), int(cfg["local-steps"]), generator):
        x, y = task.train.batch(rows[batch])
        optimizer.zero_grad()
        loss = task.loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    metrics = MetricRecord({"num-examples": len(rows), "train-loss": sum(losses) / len(losses)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                   reply_to=msg)
