"""Reader for the IDX binary format used by (Fashion-)MNIST.

Layout: two zero bytes, a type code, the number of dimensions, then one
big-endian uint32 per dimension, then the values in C order (big-endian).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

# IDX type code -> numpy dtype (multi-byte values are big-endian on disk).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"


def read_idx_file(path: str | Path) -> np.ndarray:
    """Read an IDX file, gzipped or not (detected from its content)."""
    raw = Path(path).read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        raw = gzip.decompress(raw)
    return parse_idx(raw, source=str(path))


def parse_idx(raw: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode the bytes of an (uncompressed) IDX file into a numpy array.

    Raises ValueError naming ``source`` when the header is not a valid IDX
    magic number or the payload length disagrees with the declared shape.
    """
    if len(raw) < 4:
        raise ValueError(f"{source}: only {len(raw)} bytes, too short for IDX")
    zero_a, zero_b, type_code, num_dims = raw[0], raw[1], raw[2], raw[3]
    if zero_a != 0 or zero_b != 0 or type_code not in IDX_DTYPES:
        raise ValueError(
            f"{source}: bad IDX magic number 0x{raw[:4].hex()} "
            f"(expected 0x0000 + type code in "
            f"{sorted(hex(code) for code in IDX_DTYPES)} + dims)"
        )
    shape = _read_shape(raw, num_dims, source)
    dtype = IDX_DTYPES[type_code]
    header_size = 4 + 4 * num_dims
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header_size != expected_bytes:
        raise ValueError(
            f"{source}: shape {shape} needs {expected_bytes} data bytes, "
            f"file has {len(raw) - header_size}"
        )
    values = np.frombuffer(raw, dtype=dtype, offset=header_size)
    # Native byte order and a writable copy, so torch can share the memory.
    return values.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def _read_shape(raw: bytes, num_dims: int, source: str) -> tuple[int, ...]:
    header_size = 4 + 4 * num_dims
    if len(raw) < header_size:
        raise ValueError(
            f"{source}: header declares {num_dims} dimensions but the file "
            f"ends after {len(raw)} bytes"
        )
    dims = np.frombuffer(raw, dtype=">u4", count=num_dims, offset=4)
    return tuple(int(size) for size in dims)
