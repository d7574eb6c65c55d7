"""The ClientApp: decode the server's message, run the recipe, encode the reply.

No per-algorithm branches: everything the client does is decided by the `recipe` ConfigRecord
and by which optional records (`delta-g`, `v-bar`) the message carries.
"""

from __future__ import annotations

import logging

import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.recipe import ClientRecipe
from adaptfl.client_app.client_state import ClientStateStore
from adaptfl.client_app.device import select_device
from adaptfl.client_app.terms import RoundInputs, build_terms
from adaptfl.client_app.train import train_round
from adaptfl.workloads import build_task_model, load_task, partition_indices
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

log = logging.getLogger(__name__)
app = ClientApp()


def _optional_arrays(content: RecordDict, key: str) -> dict[str, torch.Tensor] | None:
    if key not in content.array_records:
        return None
    return dict(content.array_records[key].to_torch_state_dict())


def _global_direction(content: RecordDict) -> dict[str, torch.Tensor] | None:
    """Δ_G of the FedACT family / MimeLite (`delta-g`) or FedPAC's g_G (`g-g`): the same slot of
    the chain, u = (1-ρ)·d + ρ·Δ_G. A message never carries both."""
    found = [k for k in (wire.DELTA_G, wire.G_G) if k in content.array_records]
    if len(found) > 1:
        raise ValueError(f"message carries both {found}: only one global direction can apply")
    return _optional_arrays(content, found[0]) if found else None


def handle_train(msg: Message, context: Context) -> Message:
    """Run one round of local training as the message's recipe says."""
    recipe = ClientRecipe.from_config(msg.content.config_records[wire.RECIPE])
    partition_id = int(context.node_config[wire.NODE_PARTITION_ID])
    num_partitions = int(context.node_config[wire.NODE_NUM_PARTITIONS])
    if recipe.num_threads > 0:
        torch.set_num_threads(recipe.num_threads)
    device = select_device(str(context.node_config.get(wire.NODE_DEVICE, recipe.device)))
    train, _ = load_task(recipe.task, recipe.data_dir)
    indices = torch.as_tensor(partition_indices(
        train.labels, num_partitions, partition_id, recipe.partitioning,
        recipe.dirichlet_alpha, recipe.seed, recipe.classes_per_client))
    model = build_task_model(recipe.model, train)
    model.load_state_dict(msg.content.array_records[wire.MODEL].to_torch_state_dict())
    model.to(device)
    # Terms the recipe names (FedProx, HaFedHo, SCAFFOLD, …): built at x^r, before any step.
    extra = {name: dict(record.to_torch_state_dict())
             for name, record in msg.content.array_records.items() if name != wire.MODEL}
    store = ClientStateStore(context, recipe.client_state_dir, recipe.server_round, recipe.run_key)
    terms = build_terms(recipe.terms, RoundInputs(model, recipe, extra, store, train, indices,
                                                  len(train.labels)))
    result = train_round(model, train, indices, recipe, partition_id,
                         delta_g=_global_direction(msg.content),
                         v_bar=_optional_arrays(msg.content, wire.V_BAR), terms=terms,
                         theta=_optional_arrays(msg.content, wire.THETA))
    outputs = [term.finish(result.delta, result.train_loss) for term in terms]
    content = RecordDict({
        wire.DELTA: ArrayRecord(result.delta),
        wire.METRICS: MetricRecord({
            wire.NUM_EXAMPLES: len(indices),
            wire.PARTITION_ID: partition_id,
            wire.TRAIN_LOSS: result.train_loss,
            wire.POS_RATIO: result.pos_ratio,
            wire.TOP_MASS: result.top_mass,
            **{k: v for out in outputs for k, v in out.metrics.items()},
        }),
    })
    for out in outputs:
        for name, tensors in out.records.items():
            content[name] = ArrayRecord(tensors)
    if result.v is not None:
        content[wire.V_LOCAL] = ArrayRecord(result.v)
    if result.theta is not None:
        content[wire.THETA_LOCAL] = ArrayRecord(result.theta)
    log.info("partition %d round %d: loss %.4f on %s", partition_id, recipe.server_round,
             result.train_loss, device)
    return Message(content=content, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return handle_train(msg, context)
