"""The ClientApp: adaptfl's client round. What Flower's `ClientApp(client_fn, mods=[secaggplus_mod,
fixedclipping_mod])` does in its mods, adaptfl's client does on the recipe the server sends: it
clips its update to `clipping-norm`, adds its own share of the noise (dp='client'), and masks it
for SecAgg+; each SuperNode first checks the recipe against its own floor (README: "The nodes'
floor"). The local training (Flower's `train`: Adam over the node's rows) is adaptfl's
`localadam` algorithm, on the model of task.py.
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from adaptfl.client_app.app import train_or_refuse

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    # Every SecAgg+ stage and the training come as train messages; a recipe this node refuses (its
    # floor, its ledger) is answered as a one-line error reply.
    return train_or_refuse(msg, context)
