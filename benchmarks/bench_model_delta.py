"""What a lossless delta of the model broadcast would save: the bytes of model B sent as its
bitwise XOR against model A (the version a node holds), compressed, over B's own bytes.

    python benchmarks/bench_model_delta.py OLD/model.pt NEW/model.pt

XOR of the float32 bit patterns is exact both ways (the node XORs it onto its copy), and where
the two models are close their signs, exponents and high mantissa bits agree, so the XOR is
mostly zero bits. Printed per compressor: zlib and LZMA on the XOR as it lies, and on its bytes
regrouped by position within the value (byte shuffle, as blosc does: the zero high bytes
together); then what the wire's two model-delta transforms send (adaptfl/codec/model_delta.py:
xor, and diff, the ordered-bit difference as bit planes with LZMA). docs/compression.md has the
figures of the main job's CNN.
"""

from __future__ import annotations

import argparse
import lzma
import zlib
from collections.abc import Callable

import numpy as np
import torch

Compressor = Callable[[bytes], bytes]
COMPRESSORS: dict[str, Compressor] = {"zlib-6": lambda b: zlib.compress(b, 6), "lzma": lzma.compress}


def load_model(path: str) -> dict[str, torch.Tensor]:
    loaded = torch.load(path, weights_only=True)
    return loaded.get("model", loaded) if isinstance(loaded, dict) else loaded


def xor_bytes(old: torch.Tensor, new: torch.Tensor, shuffle: bool) -> bytes:
    """new's bytes XOR old's; `shuffle`: byte k of every value together, for k = 0..itemsize-1."""
    a = old.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    b = new.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    x = np.bitwise_xor(a, b)
    return x.reshape(-1, new.element_size()).T.copy().tobytes() if shuffle else x.tobytes()


def ratios(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> dict[str, float]:
    """compressed XOR bytes / the new model's bytes, per compressor and layout."""
    raw = sum(t.numel() * t.element_size() for t in new.values())
    out = {}
    for shuffle in (False, True):
        joined = b"".join(xor_bytes(old[n], new[n], shuffle) for n in sorted(new))
        for name, compress in COMPRESSORS.items():
            out[f"{name}{' shuffled' if shuffle else ''}"] = len(compress(joined)) / raw
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    args = parser.parse_args()
    old, new = load_model(args.old), load_model(args.new)
    if {n: (t.shape, t.dtype) for n, t in old.items()} != {n: (t.shape, t.dtype) for n, t in new.items()}:
        raise SystemExit("the two models differ in their arrays: no delta between them")
    from adaptfl.codec import model_delta

    raw = sum(t.numel() * t.element_size() for t in new.values())
    wire = {f"model-delta={how}": model_delta.encode(new, old, how)[blob].numel() / raw
            for how, blob in model_delta.BLOBS.items()}
    for name, ratio in {**ratios(old, new), **wire}.items():
        print(f"{name:>17}: {ratio:.3f} of the model's bytes ({1 - ratio:.1%} saved)")


if __name__ == "__main__":
    main()
