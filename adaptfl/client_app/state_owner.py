"""Who a durable client state file belongs to: the run, the client (partition) and the round.

A state file is only an optimizer's or a variate's tensors; nothing in them says whose they
are, so partition 2's file copied over partition 1's, a folder linked to another partition's,
or a file from another job would be loaded as this client's own. Every file therefore holds
`{"owner": {"run", "client", "round"}, "tensors": …}`, and a load checks the owner against
the store that reads it: a mismatch is refused as a damaged file is (lost state, reported as
state 0). A file without an owner (written before the binding, or stripped) is refused too:
accepting it would let anyone drop the binding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Owner:
    run: str  # the run key (Flower's run id without one): the folder's run-<run>
    client: str  # "partition-<id>" or "node-<id>": the folder's name
    round: int  # the round that wrote it: the file's .r<round>

    def as_dict(self) -> dict[str, str | int]:
        return {"run": self.run, "client": self.client, "round": self.round}


def bind(tensors: Tensors, owner: Owner) -> dict[str, object]:
    """What is written to the file."""
    return {"owner": owner.as_dict(), "tensors": tensors}


def unbind(loaded: object, owner: Owner) -> tuple[object, str | None]:
    """The tensors of a loaded file and None, or (None, why it is not this owner's)."""
    if not isinstance(loaded, dict) or set(loaded) != {"owner", "tensors"} \
            or not isinstance(loaded["owner"], dict):
        return None, "not bound to a run, partition and round (written before the binding?)"
    got, want = loaded["owner"], owner.as_dict()
    for key in ("run", "client", "round"):
        if got.get(key) != want[key]:
            return None, f"belongs to {key} {got.get(key)!r}, not {want[key]!r}"
    return loaded["tensors"], None
