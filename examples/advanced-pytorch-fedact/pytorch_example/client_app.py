"""ClientApp: a stateful client. Its classification head (`fc2`) stays its own: kept in
`context.state` after training and put back over the global one each round."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from adaptfl.client_app.session import ClientSession
from adaptfl.core.stage import ClientData
from pytorch_example.task import Net, load_data
from pytorch_example.task import test as test_fn
from pytorch_example.task import train as train_fn

app = ClientApp()
HEAD = "classification-head"


def keep_head(state: RecordDict, net: Net) -> None:
    state[HEAD] = ArrayRecord(net.fc2.state_dict())


def restore_head(state: RecordDict, net: Net) -> None:
    if HEAD in state:  # not in the first round this client takes part in
        net.fc2.load_state_dict(state[HEAD].to_torch_state_dict(), strict=True)


def node_data(context: Context) -> tuple:
    cfg = context.run_config
    return load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                     cfg["data-dir"], cfg["num-train-examples"])


@app.train()
def train(msg: Message, context: Context) -> Message:
    trainloader, _ = node_data(context)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    model = Net()
    # loads the global weights; this node's size gives its step count K = ⌈epochs·rows/batch⌉
    session = ClientSession(msg, model, context=context, device=device,
                            data=ClientData(num_examples=len(trainloader.dataset)))
    restore_head(context.state, model)
    train_loss = train_fn(model, trainloader, context.run_config["local-epochs"],
                          msg.content["config"]["lr"], device,
                          optimizer=session.optimizer)  # FedACT's AdamW at the round's lr
    keep_head(context.state, model)
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    return session.reply(num_examples=len(trainloader.dataset), metrics=metrics)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    _, valloader = node_data(context)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    restore_head(context.state, model)
    eval_loss, eval_acc = test_fn(model, valloader, device)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
