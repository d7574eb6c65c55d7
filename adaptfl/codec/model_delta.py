"""The model broadcast as a lossless delta against a model the node holds (`model-delta`,
docs/compression.md). Two transforms, each exact both ways (the node applies the inverse to its
copy and checks the result against the new model's version, codec/versions.py):

    xor    each array's bytes XOR the held version's, regrouped by their place in the value
           (byte k of every value together, as blosc's shuffle: where two models are close
           their signs, exponents and high mantissa bits agree, so those bytes are zero), zlib
    diff   each 4-byte array (float32) as the integer difference of its values' bit patterns
           mapped to integers in the values' order (close values: a small difference, without
           the carries that make XOR's high bits differ), zigzagged, as bit planes (bit k of
           every value together, as bitshuffle: Masui et al. 2015), LZMA; other dtypes as in
           xor. On the main job's CNN 0.68-0.71 of the model against xor's 0.71-0.74
           (benchmarks/bench_model_delta.py), for about 0.5 s of one core per delta encoded

The record's one array names its transform ("zlib": xor, "diff-lzma": diff).
"""

from __future__ import annotations

import lzma
import zlib
from collections.abc import Mapping

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]
BLOB = "zlib"  # xor's one array: the compressed XOR bytes (uint8)
DIFF_BLOB = "diff-lzma"  # diff's one array
BLOBS = {"xor": BLOB, "diff": DIFF_BLOB}
LEVEL = 6
SIGN = np.int64(0x80000000)


def _bytes(t: torch.Tensor) -> np.ndarray:
    if not t.numel():  # an empty tensor may carry a stride no view accepts
        return np.zeros(0, dtype=np.uint8)
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def _ordered(t: torch.Tensor) -> np.ndarray:
    """A 4-byte array's bit patterns as int64 in the order of their float values: a bijection
    onto [-2^31, 2^31) (-0.0 -> -1, +0.0 -> 0), so differences mod 2^32 invert exactly."""
    bits = _bytes(t).view(np.int32).astype(np.int64)
    return np.where(bits < 0, -1 - (bits & 0x7FFFFFFF), bits)


def _from_ordered(o: np.ndarray) -> np.ndarray:
    bits = np.where(o < 0, (-1 - o) | SIGN, o)
    return bits.astype(np.uint32).view(np.uint8)


def _diff_planes(new: torch.Tensor, old: torch.Tensor) -> bytes:
    d = ((_ordered(new) - _ordered(old) + SIGN) % (2 * SIGN)) - SIGN  # wrapped to int32's range
    zigzag = ((d << 1) ^ (d >> 63)) & 0xFFFFFFFF
    bits = np.unpackbits(zigzag.astype(">u4").view(np.uint8).reshape(-1, 32 // 8), axis=1)
    return np.packbits(bits.T, axis=1).tobytes()  # 32 planes of ceil(n / 8) bytes


def _undiff_planes(planes: bytes, old: torch.Tensor) -> np.ndarray:
    n = old.numel()
    bits = np.unpackbits(np.frombuffer(planes, dtype=np.uint8).reshape(32, -1), axis=1)[:, :n]
    zigzag = np.ascontiguousarray(np.packbits(bits.T, axis=1)).view(">u4").reshape(-1).astype(np.int64)
    d = (zigzag >> 1) ^ -(zigzag & 1)
    o = ((_ordered(old) + d + SIGN) % (2 * SIGN)) - SIGN
    return _from_ordered(o)


def _uses_diff(t: torch.Tensor, how: str) -> bool:
    return how == "diff" and t.element_size() == 4 and t.numel() > 0


def _size(t: torch.Tensor, how: str) -> int:
    """The bytes one array takes in the decompressed blob."""
    return 32 * ((t.numel() + 7) // 8) if _uses_diff(t, how) else t.numel() * t.element_size()


def encode(new: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor], how: str = "xor") -> Tensors:
    """{BLOBS[how]: uint8} of `new` against `base` (the same names, shapes and dtypes)."""
    parts = []
    for name in sorted(new):
        if _uses_diff(new[name], how):
            parts.append(_diff_planes(new[name], base[name]))
            continue
        x = np.bitwise_xor(_bytes(new[name]), _bytes(base[name]))
        parts.append(x.reshape(-1, new[name].element_size()).T.tobytes())
    joined = b"".join(parts)
    blob = zlib.compress(joined, LEVEL) if how == "xor" else lzma.compress(joined, check=lzma.CHECK_NONE)
    return {BLOBS[how]: torch.frombuffer(bytearray(blob), dtype=torch.uint8)}


def _blob(record: Mapping[str, torch.Tensor]) -> tuple[str, torch.Tensor]:
    """(the transform, its one uint8 array) of a delta record, or ValueError."""
    how = next((h for h, key in BLOBS.items() if set(record) == {key}), None)
    if how is None or record[BLOBS[how]].dtype != torch.uint8 or record[BLOBS[how]].dim() != 1:
        raise ValueError(f"the model delta must be one uint8 array, one of {sorted(BLOBS.values())}")
    return how, record[BLOBS[how]]


def _inflate(blob: torch.Tensor, how: str, size: int) -> bytes:
    """The blob decompressed, exactly `size` bytes, or ValueError."""
    inflate = zlib.decompressobj() if how == "xor" else lzma.LZMADecompressor()
    try:
        flat = inflate.decompress(blob.numpy().tobytes(), size + 1)
    except (zlib.error, lzma.LZMAError) as err:
        raise ValueError(f"the model delta does not decompress ({err})") from None
    if len(flat) != size or not inflate.eof:
        raise ValueError(f"the model delta is not {size} bytes: not a delta of the held model")
    return flat


def _apply(part: bytes, held: torch.Tensor, how: str) -> torch.Tensor:
    """One array: its part of the blob applied to the held one."""
    if not held.numel():
        return held.detach().clone()
    if _uses_diff(held, how):
        raw = torch.from_numpy(_undiff_planes(part, held).copy())
    else:
        x = np.frombuffer(part, dtype=np.uint8).reshape(held.element_size(), -1).T
        raw = torch.from_numpy(np.bitwise_xor(x.reshape(-1), _bytes(held)).copy())
    return raw.view(held.dtype).reshape(held.shape)


def decode(record: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> Tensors:
    """The new model from its delta and the held `base`; ValueError on a blob that is not the
    delta of a model of `base`'s arrays (it decompresses to another size)."""
    how, blob = _blob(record)
    flat = _inflate(blob, how, sum(_size(t, how) for t in base.values()))
    decoded: Tensors = {}
    start = 0
    for name in sorted(base):
        n = _size(base[name], how)
        decoded[name] = _apply(flat[start:start + n], base[name], how)
        start += n
    # in the held model's order, the server's: a record's order decides, e.g., which array dp's
    # noise draws come first for in the reply that Δ is taken against
    return {name: decoded[name] for name in base}
