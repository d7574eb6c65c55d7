"""A client's side of the wire codecs: each shared record encoded as its codec says, with error
feedback where it ends in +ef (Seide et al. 2014; Karimireddy et al. 2019, "Error Feedback
Fixes SignSGD"): the client sends C(x + e) and keeps e ← x + e − D(C(x + e)), so over the rounds
what was sent plus the last residual is what it had to send.

The residual is durable client state (client_app/client_state.py, one entry for all of a
client's +ef records): it survives a SuperNode restart and a server resume, and it is dropped
with the client's state; a client that finds none starts from zero. It is kept in float64, so
the identity above holds to float64 rounding (exactly when the updates are dyadic: the tests).
Each record's residual stands alone: a record a reply leaves out (v in a round without v,
v-sync-every) keeps its residual for the next reply that carries it, and a record whose kept
residual has other arrays or shapes (another model) starts from zero without the others.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from adaptfl.codec.settings import CompressionBase
from adaptfl.core import wire

log = logging.getLogger(__name__)
RESIDUAL = "wire-residual"  # the client-state name
Tensors = dict[str, torch.Tensor]
Generators = Callable[[str], torch.Generator | None]  # record -> its stochastic rounding


def residual_key(record: str, array: str) -> str:
    return f"{record}/{array}"


def encode_reply(records: Mapping[str, Tensors], compression: CompressionBase, store: Any,
                 generator: Generators) -> tuple[dict[str, Tensors], dict[str, float]]:
    """(the records as they go on the wire, the reply's codec metrics). `store`: the client's
    durable state (load/save), read and written only when some record has +ef."""
    block = compression.codec_block
    fed_back = {name: tensors for name, tensors in records.items() if compression.of(name).ef}
    out = {name: compression.of(name).encode(tensors, block, generator(name))
           for name, tensors in records.items() if name not in fed_back}
    if not fed_back:
        return out, {}
    stored, _ = store.load(RESIDUAL)
    residual = _usable(stored or {}, fed_back)
    # the residuals of the records this reply leaves out, kept as they were
    kept: Tensors = {k: t for k, t in (stored or {}).items() if k.split("/", 1)[0] not in fed_back}
    for name, tensors in fed_back.items():
        codec = compression.of(name)
        target64 = {a: t.detach().cpu().double() + residual.get(residual_key(name, a), 0.0)
                    for a, t in tensors.items() if t.dtype == torch.float32}
        target = {a: target64[a].float() if a in target64 else t.cpu() for a, t in tensors.items()}
        out[name] = codec.encode(target, block, generator(name))
        spec = {a: (tuple(t.shape), t.dtype) for a, t in target.items()}
        sent = codec.decode(out[name], spec, block)
        kept.update({residual_key(name, a): target64[a] - sent[a].double() for a in target64})
    store.save(RESIDUAL, kept)
    norm = math.sqrt(sum(float((t * t).sum()) for t in kept.values()))
    return out, {wire.EF_RESIDUAL: norm}


def _usable(stored: Mapping[str, torch.Tensor], fed_back: Mapping[str, Tensors]) -> Tensors:
    """The kept residuals of the records fed back now, each record's only where its arrays and
    shapes are this reply's float32 arrays exactly (else that record starts from zero)."""
    out: Tensors = {}
    for name, tensors in fed_back.items():
        expect = {residual_key(name, a): tuple(t.shape) for a, t in tensors.items()
                  if t.dtype == torch.float32}
        mine = {k: t for k, t in stored.items() if k.split("/", 1)[0] == name}
        if {k: tuple(t.shape) for k, t in mine.items()} == expect:
            out.update(mine)
        elif mine:
            log.warning("kept residual of %s has other arrays or shapes than this reply's: from zero", name)
    return out
