"""A client's own held-out split for federated evaluation, derived from its partition.

The clients' partitions cover the train split, so no train row is held out; each client's test
rows come from the task's test split instead, in its own label mix: of every label its partition
holds, the share of the test split's rows of that label that its partition holds of the train
split's (h_c / N_c of them, rounded, at least one). Clients' test rows of one label may overlap
(each draws its own), and none was ever trained on. The draw is a permutation per client from
a seed of (run seed, partition id): the same rows in every process and every round.
"""

from __future__ import annotations

import hashlib

import torch


def held_out_seed(seed: int, client_id: int) -> int:
    digest = hashlib.sha256(f"{seed}/held-out/{client_id}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def held_out_rows(train_labels: torch.Tensor, rows: torch.Tensor, test_labels: torch.Tensor,
                  seed: int, client_id: int) -> torch.Tensor:
    """Sorted rows of the test split for the client that owns `rows` of the train split (see the
    module docstring). A partition none of whose labels the test split has gets a uniform draw of
    the test split at the partition's share of the train split instead."""
    generator = torch.Generator().manual_seed(held_out_seed(seed, client_id))
    width = int(max(train_labels.max(), test_labels.max())) + 1 if len(test_labels) else 0
    held = torch.bincount(train_labels[rows], minlength=width)  # h_c, this client's train rows
    total = torch.bincount(train_labels, minlength=width)  # N_c, the whole train split's
    picked = []
    for label in torch.nonzero(held).flatten().tolist():
        pool = torch.nonzero(test_labels == label).flatten()
        if len(pool) == 0:
            continue
        count = min(len(pool), max(1, round(int(held[label]) * len(pool) / int(total[label]))))
        picked.append(pool[torch.randperm(len(pool), generator=generator)[:count]])
    if not picked and len(test_labels):
        count = max(1, round(len(rows) * len(test_labels) / len(train_labels)))
        picked.append(torch.randperm(len(test_labels), generator=generator)[:count])
    return torch.sort(torch.cat(picked)).values if picked else torch.zeros(0, dtype=torch.int64)
