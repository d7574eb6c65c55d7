"""Broadcast records sent once per node: each node keeps the records it last received, and the
server sends a record's bytes only to a node whose version of it differs (docs/compression.md,
"Versioned broadcast records").

A record's version is a digest of its arrays as they go on the wire (encoded: names, dtypes,
shapes and values; 63 bits of SHA-256), so a version is also the checksum of a copy: before a
node uses a copy it holds, it checks the copy against the version the instruction names, and a
node that holds another copy or none refuses the round with that reason rather than train on
values the server did not send. The protocol, both ends:

    server   an instruction carries `versions` {record: version} (core/wire.py VERSIONS) for
             each record it may send unchanged in a later round (the model under model-delta,
             whose held copy a delta needs; a frozen v̄; |D|); the arrays of such a record go
             only where the node's last reply echoed that very version (ServerState.held).
             A record that changes every round (FedAvg's model, Δ_G) goes whole and unversioned:
             a copy kept of it would never be used, yet cost every message its digest and write
    node     a record that came with its bytes is checked against its version and kept (durable
             client state, `held-<record>`); one that came without is taken from what the node
             keeps, checked first; the reply echoes the versions the node now holds
    server   keeps a node's echo, only the versions it announced to that node this round; a node
             without a usable reply (it failed, refused, was late) is forgotten: its next
             instruction is whole. So a node that lost its copy loses one round, then gets it whole
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Mapping
from typing import Protocol

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from adaptfl.codec import model_delta
from adaptfl.core import wire

log = logging.getLogger(__name__)
Tensors = dict[str, torch.Tensor]
Versions = dict[str, int]  # record -> version
HELD = "held-"  # durable client state: held-<record>, the record's arrays as the node received them


class NotHeld(ValueError):
    """An instruction names a version of a record that this node does not hold: the round is
    refused (the server then forgets the node's versions and sends everything whole)."""


class Store(Protocol):
    """The client's durable state (client_app/client_state.py): `durable` says whether a saved
    record can be loaded in a later round (the throwaway MemoryStore: no)."""

    durable: bool

    def load(self, name: str) -> tuple[Tensors | None, object]: ...

    def save(self, name: str, tensors: Tensors) -> None: ...


def digest(tensors: Mapping[str, torch.Tensor]) -> int:
    """A record's version: 63 bits of SHA-256 over its arrays in name order (name, dtype, shape,
    bytes), a non-negative int64 as a ConfigRecord carries it."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return int.from_bytes(h.digest()[:8], "little") >> 1


def record_version(record: ArrayRecord) -> int:
    return digest(dict(record.to_torch_state_dict()))


# --- the server's side ------------------------------------------------------------------------

def versions_of(content: RecordDict, repeated: Collection[str]) -> Versions:
    """The version of each record of a (whole) instruction that may be sent unchanged later."""
    return {name: record_version(rec) for name, rec in content.array_records.items()
            if name in wire.VERSIONED and name in repeated}


def addressed(content: RecordDict, versions: Mapping[str, int], held: Mapping[str, int]) -> RecordDict:
    """One node's instruction: `content` with `versions`, less the arrays of each record the
    node holds at the announced version (no versions announced: all of `content`)."""
    if not versions:
        return RecordDict(dict(content.items()))
    out = RecordDict({name: record for name, record in content.items()
                      if name not in versions or held.get(name) != versions[name]})
    out[wire.VERSIONS] = ConfigRecord(dict(versions))
    return out


def echoed(record: ConfigRecord | None, announced: Mapping[str, int]) -> Versions:
    """What the server keeps of a node's echo: the versions it announced to that node this
    round and the node says it holds (anything else, malformed or not, is left out)."""
    if record is None:
        return {}
    return {name: value for name, value in record.items()
            if isinstance(value, int) and not isinstance(value, bool) and announced.get(name) == value}


# --- the node's side --------------------------------------------------------------------------

def announced(content: RecordDict) -> Versions | None:
    """The versions an instruction names (None: an instruction without them, which is whole)."""
    record = content.config_records.get(wire.VERSIONS)
    if record is None:
        return None
    out = {name: value for name, value in record.items() if name in (*wire.VERSIONED, wire.ARRAYS_DELTA)
           and isinstance(value, int) and not isinstance(value, bool) and value >= 0}
    if len(out) != len(record):
        bad = sorted(set(record) - set(out))
        raise NotHeld(f"{wire.VERSIONS!r} names {bad[:3]}, which are not versions of records this node "
                      f"keeps ({', '.join(wire.VERSIONED)}): server and client disagree")
    return out


def take_held(content: RecordDict, store: Store) -> tuple[RecordDict, Versions | None]:
    """(the instruction with every record it names, `versions` taken out; the versions this node
    now holds, None for an instruction without versions). A record that came is checked against
    its version and kept; one that did not is the node's kept copy, checked first (NotHeld)."""
    versions = announced(content)
    if versions is None:
        return content, None
    out = RecordDict({name: record for name, record in content.items() if name != wire.VERSIONS})
    base = versions.pop(wire.ARRAYS_DELTA, None)
    if base is not None:  # the model as a delta against one this node holds (model_delta.py)
        out[wire.ARRAYS] = ArrayRecord(_undelta(out, store, base, versions.get(wire.ARRAYS)))
    held: Versions = {}
    for name, version in versions.items():
        if name not in out.array_records:
            out[name] = ArrayRecord(_held_copy(store, name, version))
            held[name] = version
            continue
        tensors = dict(out.array_records[name].to_torch_state_dict())
        if digest(tensors) != version:
            raise NotHeld(f"record {name!r} arrived as another version than the instruction names "
                          f"({digest(tensors)} against {version}): not used")
        if store.durable and _kept(store, name, tensors):
            held[name] = version
    return out, held


def _kept(store: Store, name: str, tensors: Tensors) -> bool:
    """Keep a record that came; a node that cannot (a state folder it may not write) trains all
    the same and holds nothing, so it is sent the record whole again."""
    try:
        store.save(HELD + name, tensors)
    except (OSError, ValueError) as err:
        log.warning("cannot keep broadcast record %s (%s): it is sent whole again", name, err)
        return False
    return True


def _undelta(content: RecordDict, store: Store, base: int, version: int | None) -> Tensors:
    """The model from its delta (taken out of `content`) and the held model of version `base`,
    checked to be the announced `version`."""
    if wire.ARRAYS in content.array_records or wire.ARRAYS_DELTA not in content.array_records:
        raise NotHeld(f"an instruction naming a model delta carries {wire.ARRAYS_DELTA!r} and not "
                      f"{wire.ARRAYS!r}: server and client disagree")
    delta = dict(content.array_records[wire.ARRAYS_DELTA].to_torch_state_dict())
    del content[wire.ARRAYS_DELTA]
    try:
        model = model_delta.decode(delta, _held_copy(store, wire.ARRAYS, base))
    except NotHeld:
        raise
    except ValueError as why:
        raise NotHeld(f"record {wire.ARRAYS_DELTA!r}: {why}") from None
    if digest(model) != version:
        raise NotHeld(f"the model decoded from its delta is version {digest(model)}, the instruction "
                      f"names {version}: not used")
    return model


def echo(reply: RecordDict, held: Versions | None) -> None:
    """The reply's echo of what the node holds (none to an instruction without versions)."""
    if held is not None:
        reply[wire.VERSIONS] = ConfigRecord(dict(held))


def _held_copy(store: Store, name: str, version: int) -> Tensors:
    """The node's kept copy of `name`, if it is that version."""
    tensors, _ = store.load(HELD + name)
    if tensors is None:
        raise NotHeld(f"the instruction leaves out record {name!r} (version {version}) as held by this "
                      "node, which holds none (its state was lost or wiped): refused; the server sends "
                      "it whole in its next instruction to this node")
    have = digest(tensors)
    if have != version:
        raise NotHeld(f"this node's kept copy of record {name!r} is version {have}, the instruction "
                      f"names version {version}: not used, refused; the server sends it whole in its "
                      "next instruction to this node")
    return tensors
