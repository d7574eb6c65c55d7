"""One record's codec: how its arrays cross the wire, written as one short string.

    fp32 | bf16 | fp16 | int8 | nf4 | fp4     every value, as values.py says
    top<P>%[:<values>]                         top-k: the P % largest |x| of each array, their
                                               positions (int32, increasing) and their values
                                               in one of the codecs above (fp32 if none)
    <any of these>+ef                          with error feedback (replies only): the client
                                               adds what earlier rounds did not send (feedback.py)

Examples: `int8`, `nf4+ef`, `top10%+ef`, `top1%:fp4+ef`. A record's arrays go on the wire as
`<name>` (fp32), else as `<name>@<part>` (`@q` codes, `@s` scales, `@i` positions, `@v…` the
kept values); only float32 arrays are encoded (integer buffers, HaFedHo's float64 |D| pass).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from adaptfl.codec.values import KINDS, MalformedEncoding, dequantize, parts_spec, quantize

ArraySpec = dict[str, tuple[tuple[int, ...], torch.dtype]]  # as core/contract.py's
Tensors = dict[str, torch.Tensor]
_GRAMMAR = re.compile(r"(?:top(?P<top>\d+(?:\.\d+)?)%(?::(?P<kept>[a-z0-9]+))?|(?P<dense>[a-z0-9]+))"
                      r"(?P<ef>\+ef)?")
SEP = "@"


@dataclass(frozen=True)
class Codec:
    values: str = "fp32"  # how each sent value is written (values.KINDS)
    top: float = 0.0  # percent of each array sent (top-k by magnitude); 0: all of it
    ef: bool = False  # error feedback (client -> server only)

    @classmethod
    def parse(cls, text: str, key: str = "codec") -> Codec:
        """From its string; a one-line ValueError naming `key` otherwise."""
        m = _GRAMMAR.fullmatch(text.strip())
        kind = (m.group("kept") or "fp32") if m and m.group("top") else (m.group("dense") if m else "")
        if m is None or kind not in KINDS:
            raise ValueError(f"invalid {key}={text!r}: choose {', '.join(KINDS)}, or top<P>%[:<values>] "
                             "(top-k), each optionally +ef (error feedback), e.g. 'top1%:fp4+ef'")
        top = float(m.group("top") or 0.0)
        if m.group("top") and not 0.0 < top < 100.0:
            raise ValueError(f"invalid {key}={text!r}: top-k keeps between 0 and 100 % of each array")
        return cls(kind, top, bool(m.group("ef")))

    def __str__(self) -> str:
        body = self.values if not self.top else f"top{self.top:g}%" + \
            ("" if self.values == "fp32" else f":{self.values}")
        return body + ("+ef" if self.ef else "")

    @property
    def lossless(self) -> bool:
        return self.values == "fp32" and not self.top

    def kept(self, numel: int) -> int:
        """Values sent of an array of `numel` (top-k: ceil(P % of it), at least one)."""
        return min(numel, max(1, math.ceil(numel * self.top / 100.0))) if self.top else numel

    # --- one array --------------------------------------------------------------------------
    def parts(self, numel: int, block: int) -> ArraySpec:
        """Part name -> (shape, dtype) of one encoded float32 array of `numel` values."""
        if not self.top:
            return dict(parts_spec(self.values, numel, block))
        k = self.kept(numel)
        kept = parts_spec(self.values, k, block)
        return {"i": ((k,), torch.int32), **{"v" + p: s for p, s in kept.items()}}

    def encode_array(self, x: torch.Tensor, block: int, generator: torch.Generator | None = None
                     ) -> Tensors:
        flat = x.detach().reshape(-1).to(torch.float32)
        if not self.top:
            return quantize(flat, self.values, block, generator)
        positions = self._top(flat)
        kept = quantize(flat[positions].contiguous(), self.values, block, generator)
        return {"i": positions.to(torch.int32), **{"v" + p: t for p, t in kept.items()}}

    def _top(self, flat: torch.Tensor) -> torch.Tensor:
        """The increasing positions of the kept values: the k largest |x|, ties at the k-th
        magnitude broken toward the lower position (so the choice is a function of the values,
        which `settled` relies on; torch.topk leaves ties open). A NaN counts as the largest,
        as in torch.topk (it is sent, and the receiver's value checks refuse it)."""
        k = self.kept(flat.numel())
        size = torch.nan_to_num(flat.abs(), nan=float("inf"))
        kth = torch.topk(size, k, sorted=False).values.min()
        above = torch.nonzero(size > kth).reshape(-1)
        tied = torch.nonzero(size == kth).reshape(-1)[:k - above.numel()]
        return torch.sort(torch.cat([above, tied])).values

    def decode_array(self, parts: Mapping[str, torch.Tensor], shape: tuple[int, ...], block: int
                     ) -> torch.Tensor:
        numel = math.prod(shape)
        if not self.top:
            return dequantize(dict(parts), self.values, numel, block).reshape(shape)
        positions = parts["i"].to(torch.int64)
        if positions.numel() and (int(positions[0]) < 0 or int(positions[-1]) >= numel):
            raise MalformedEncoding(f"top-k position outside [0, {numel})")
        if positions.numel() > 1 and not bool((positions[1:] > positions[:-1]).all()):
            raise MalformedEncoding("top-k positions not strictly increasing (repeated or unsorted)")
        kept = dequantize({p[1:]: t for p, t in parts.items() if p.startswith("v")}, self.values,
                          positions.numel(), block)
        out = torch.zeros(numel, dtype=torch.float32, device=kept.device)
        out[positions] = kept
        return out.reshape(shape)

    # --- one record -------------------------------------------------------------------------
    def record_spec(self, spec: ArraySpec, block: int) -> ArraySpec:
        """The encoded record's arrays, from the decoded record's (contract.py's ArraySpec)."""
        if self.lossless:
            return dict(spec)
        out: ArraySpec = {}
        for name, (shape, dtype) in spec.items():
            if dtype != torch.float32:
                out[name] = (shape, dtype)
                continue
            for part, part_spec in self.parts(math.prod(shape), block).items():
                out[f"{name}{SEP}{part}" if part else name] = part_spec
        return out

    def encode(self, tensors: Mapping[str, torch.Tensor], block: int,
               generator: torch.Generator | None = None) -> Tensors:
        if self.lossless:
            return dict(tensors)
        out: Tensors = {}
        for name, t in tensors.items():
            if t.dtype != torch.float32:
                out[name] = t
                continue
            for part, encoded in self.encode_array(t, block, generator).items():
                out[f"{name}{SEP}{part}" if part else name] = encoded.cpu()
        return out

    def decode(self, arrays: Mapping[str, torch.Tensor], spec: ArraySpec, block: int) -> Tensors:
        """The record's tensors from arrays that match `record_spec(spec)` (checked by the
        caller: names, shapes, dtypes); MalformedEncoding on values no encoder writes."""
        if self.lossless:
            return dict(arrays)
        out: Tensors = {}
        for name, (shape, dtype) in spec.items():
            if dtype != torch.float32:
                out[name] = arrays[name]
                continue
            parts = {p: arrays[f"{name}{SEP}{p}" if p else name] for p in self.parts(math.prod(shape), block)}
            try:
                out[name] = self.decode_array(parts, shape, block)
            except MalformedEncoding as why:
                raise MalformedEncoding(f"[{name}]: {why}") from None
        return out

    def round_trip(self, tensors: Mapping[str, torch.Tensor], block: int,
                   generator: torch.Generator | None = None) -> Tensors:
        """What a receiver decodes of `tensors` (on their device)."""
        if self.lossless:
            return dict(tensors)
        spec = {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}
        decoded = self.decode(self.encode(tensors, block, generator), spec, block)
        return {n: decoded[n].to(tensors[n].device) for n in tensors}

    def settled(self, tensors: Mapping[str, torch.Tensor], block: int,
                generator: torch.Generator | None = None) -> Tensors:
        """What the server keeps of a broadcast record: values that its encoding (to nearest)
        decodes to bit for bit, so clients decode exactly the state it keeps and re-encodes
        every round. The round trip is such values, except under top-k when a kept value
        decodes to 0: re-encoding then keeps another zero, which shifts the kept values' blocks
        and so their scales. Re-encoding until nothing changes ends: the nonzero positions only
        shrink, and while they stay the kept positions do too (`_top`), where the blockwise
        round trip is idempotent; so after at most 2 (nonzeros + 1) steps."""
        out = self.round_trip(tensors, block, generator)
        for _ in range(2 * sum(t.numel() for t in out.values()) + 2):
            again = self.round_trip(out, block)
            if all(torch.equal(again[n].view(torch.int32), out[n].view(torch.int32))
                   if out[n].dtype == torch.float32 else torch.equal(again[n], out[n]) for n in out):
                return out
            out = again
        raise AssertionError(f"codec {self}: re-encoding did not settle")  # cannot happen (above)


FP32 = Codec()


def array_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The bytes one array takes on Flower's wire: np.save's header and the data."""
    header = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(torch.empty(0, dtype=dtype).numpy().dtype)
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False,
                                                  "shape": tuple(shape)})
    return len(header.getvalue()) + math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def spec_bytes(spec: ArraySpec) -> int:
    return sum(array_bytes(shape, dtype) for shape, dtype in spec.values())
