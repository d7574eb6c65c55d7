"""adaptfl's own local training loop: K steps of the session's algorithm on one partition.

Independent of Flower's transport: the ClientApp, the in-process engine and the server's
preflight check all run it.
"""

from __future__ import annotations

import hashlib

import torch
from adaptfl.client_app.session import ClientSession
from adaptfl.workloads import Split, sample_batches
from adaptfl.workloads.task import Loss


def round_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A per-(run, round, client) seed, stable across processes and Python versions."""
    digest = hashlib.sha256(f"{seed}/{server_round}/{partition_id}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def run_local_steps(session: ClientSession, split: Split, loss_fn: Loss, indices: torch.Tensor,
                    client_id: int, steps: int | None = None) -> None:
    """The recipe's K local steps (or `steps`) on the rows `indices` of `split`."""
    info, model = session.info, session.model
    seed = round_seed(info.seed, info.server_round, client_id)
    torch.manual_seed(seed)  # dropout etc. in models that have it
    generator = torch.Generator().manual_seed(seed)
    batches = sample_batches(len(indices), info.batch_size, steps or info.local_steps, generator)
    model.train()
    for batch in batches:
        x, y = split.batch(indices[batch])
        x, y = x.to(session.device), y.to(session.device)
        logits = model(x)
        loss = session.loss(x, logits, loss_fn(logits, y))
        session.backward(loss, logits, loss_fn)
        session.step()
