"""The model broadcast as a lossless delta against a model the node holds (`model-delta='xor'`,
docs/compression.md): each array's bytes XOR the held version's, regrouped by their place in
the value (byte k of every value together, as blosc's shuffle: where two models are close their
signs, exponents and high mantissa bits agree, so those bytes are zero), then zlib. Exact both
ways: the node XORs the same bytes back onto its copy, and checks the result against the new
model's version (codec/versions.py) before use.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]
BLOB = "zlib"  # the record's one array: the compressed XOR bytes (uint8)
LEVEL = 6


def _bytes(t: torch.Tensor) -> np.ndarray:
    if not t.numel():  # an empty tensor may carry a stride no view accepts
        return np.zeros(0, dtype=np.uint8)
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def encode(new: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> Tensors:
    """{BLOB: uint8} of `new` against `base` (the same names, shapes and dtypes)."""
    parts = []
    for name in sorted(new):
        x = np.bitwise_xor(_bytes(new[name]), _bytes(base[name]))
        parts.append(x.reshape(-1, new[name].element_size()).T.tobytes())
    return {BLOB: torch.frombuffer(bytearray(zlib.compress(b"".join(parts), LEVEL)), dtype=torch.uint8)}


def decode(record: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> Tensors:
    """The new model from its delta and the held `base`; ValueError on a blob that is not the
    delta of a model of `base`'s arrays (it decompresses to another size)."""
    if set(record) != {BLOB} or record[BLOB].dtype != torch.uint8 or record[BLOB].dim() != 1:
        raise ValueError(f"the model delta must be one uint8 array {BLOB!r}")
    size = sum(t.numel() * t.element_size() for t in base.values())
    inflate = zlib.decompressobj()
    try:
        flat = inflate.decompress(record[BLOB].numpy().tobytes(), size + 1)
    except zlib.error as err:
        raise ValueError(f"the model delta does not decompress ({err})") from None
    if len(flat) != size or not inflate.eof:
        raise ValueError(f"the model delta is not {size} bytes: not a delta of the held model")
    decoded: Tensors = {}
    start = 0
    for name in sorted(base):
        held = base[name]
        n = held.numel() * held.element_size()
        x = np.frombuffer(flat[start:start + n], dtype=np.uint8).reshape(held.element_size(), -1).T
        raw = torch.from_numpy(np.bitwise_xor(x.reshape(-1), _bytes(held)).copy())
        decoded[name] = raw.view(held.dtype).reshape(held.shape) if n else held.detach().clone()
        start += n
    # in the held model's order, the server's: a record's order decides, e.g., which array dp's
    # noise draws come first for in the reply that Δ is taken against
    return {name: decoded[name] for name in base}

