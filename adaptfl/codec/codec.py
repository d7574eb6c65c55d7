"""One record's codec: how its arrays cross the wire, written as one short string.

    fp32 | bf16 | fp16 | int8 | nf4 | fp4     every value, as values.py says
    top<P>%[:<values>]                         top-k: the P % largest |x| of each array, their
                                               positions (positions.py: int32, a bitmap or
                                               Elias-Fano, as `codec-positions` says) and their
                                               values in one of the codecs above (fp32 if none)
    rtop<P>%[:<values>]                        top-k over the whole record: one threshold for
                                               all its arrays (parts `@i`, `@v…` of the record)
    rand<P>%[:<values>]                        seeded random-k: P % of each array at positions
                                               drawn from a 64-bit seed (the one part `@seed`),
                                               so no positions travel; scaled by n/k (unbiased)
                                               unless +ef, which repays what was left out
    <any of these>+ef                          with error feedback (replies only): the client
                                               adds what earlier rounds did not send (feedback.py)

Examples: `int8`, `nf4+ef`, `top10%+ef`, `top1%:fp4+ef`. A record's arrays go on the wire as
`<name>` (fp32), else as `<name>@<part>` (`@q` codes, `@s` scales, `@i` positions, `@v…` the
kept values); only float32 arrays are encoded (integer buffers, HaFedHo's float64 |D| pass).
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adaptfl.codec import positions as layout
from adaptfl.codec.values import KINDS, MalformedEncoding, dequantize, parts_spec, quantize

ArraySpec = dict[str, tuple[tuple[int, ...], torch.dtype]]  # as core/contract.py's
Tensors = dict[str, torch.Tensor]
_GRAMMAR = re.compile(r"(?:(?P<select>r?top|rand)(?P<top>\d+(?:\.\d+)?)%(?::(?P<kept>[a-z0-9]+))?"
                      r"|(?P<dense>[a-z0-9]+))(?P<ef>\+ef)?")
SEP = "@"
SEED = "seed"  # rand's one part per record: the seed its positions are drawn from
SELECTIONS = ("top", "rtop", "rand")


@dataclass(frozen=True)
class Codec:
    values: str = "fp32"  # how each sent value is written (values.KINDS)
    top: float = 0.0  # percent of each array sent (top-k by magnitude); 0: all of it
    ef: bool = False  # error feedback (client -> server only)
    select: str = "top"  # which values when top > 0: SELECTIONS
    positions: str = "int32"  # how top-k's positions travel (positions.LAYOUTS)

    @classmethod
    def parse(cls, text: str, key: str = "codec") -> Codec:
        """From its string; a one-line ValueError naming `key` otherwise."""
        m = _GRAMMAR.fullmatch(text.strip())
        kind = (m.group("kept") or "fp32") if m and m.group("top") else (m.group("dense") if m else "")
        if m is None or kind not in KINDS:
            raise ValueError(f"invalid {key}={text!r}: choose {', '.join(KINDS)}, or top<P>%[:<values>] "
                             "(top-k per array), rtop<P>%[:<values>] (top-k per record) or "
                             "rand<P>%[:<values>] (seeded random-k), each optionally +ef (error "
                             "feedback), e.g. 'top1%:fp4+ef'")
        top = float(m.group("top") or 0.0)
        if m.group("top") and not 0.0 < top < 100.0:
            raise ValueError(f"invalid {key}={text!r}: top-k keeps between 0 and 100 % of each array")
        return cls(kind, top, bool(m.group("ef")), m.group("select") or "top")

    def __str__(self) -> str:
        body = self.values if not self.top else f"{self.select}{self.top:g}%" + \
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
        where = {} if self.select == "rand" else layout.spec(self.positions, numel, k)
        return {**where, **{"v" + p: s for p, s in kept.items()}}

    def encode_array(self, x: torch.Tensor, block: int, generator: torch.Generator | None = None,
                     chooser: torch.Generator | None = None) -> Tensors:
        """One array's parts; `chooser`: rand's positions (the receiver draws the same)."""
        flat = x.detach().reshape(-1).to(torch.float32)
        if not self.top:
            return quantize(flat, self.values, block, generator)
        if self.select == "rand":
            positions = self._drawn(flat.numel(), chooser).to(flat.device)
            kept = quantize(flat[positions].contiguous(), self.values, block, generator)
            return {"v" + p: t for p, t in kept.items()}
        positions = self._top(flat)
        kept = quantize(flat[positions].contiguous(), self.values, block, generator)
        return {**layout.encode(positions, flat.numel(), self.positions),
                **{"v" + p: t for p, t in kept.items()}}

    def _drawn(self, numel: int, chooser: torch.Generator | None) -> torch.Tensor:
        """rand's k increasing positions of `numel`, from the generator both sides seed alike."""
        assert chooser is not None, "rand draws its positions from the record's seed"
        return torch.sort(torch.randperm(numel, generator=chooser)[:self.kept(numel)]).values

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

    def decode_array(self, parts: Mapping[str, torch.Tensor], shape: tuple[int, ...], block: int,
                     chooser: torch.Generator | None = None) -> torch.Tensor:
        numel = math.prod(shape)
        if not self.top:
            return dequantize(dict(parts), self.values, numel, block).reshape(shape)
        k = self.kept(numel)
        if self.select == "rand":
            positions = self._drawn(numel, chooser)
        else:
            where = {p: t for p, t in parts.items() if p.startswith("i")}
            try:
                positions = layout.decode(where, numel, k, self.positions)
            except MalformedEncoding as why:
                raise MalformedEncoding(f"top-k {why}") from None
        kept = dequantize({p[1:]: t for p, t in parts.items() if p.startswith("v")}, self.values, k, block)
        if self.select == "rand" and not self.ef:  # unbiased: E[n/k · 1{kept} x] = x
            kept = kept * (numel / k)
        out = torch.zeros(numel, dtype=torch.float32, device=kept.device)
        out[positions.to(kept.device)] = kept
        return out.reshape(shape)

    # --- one record -------------------------------------------------------------------------
    @property
    def whole_record(self) -> bool:
        """rtop: one top-k over the record's float arrays joined (one threshold for all)."""
        return self.select == "rtop" and bool(self.top)

    @property
    def seeded(self) -> bool:
        """rand: the positions come from one seed that travels with the record."""
        return self.select == "rand" and bool(self.top)

    def record_spec(self, spec: ArraySpec, block: int) -> ArraySpec:
        """The encoded record's arrays, from the decoded record's (contract.py's ArraySpec)."""
        if self.lossless:
            return dict(spec)
        out: ArraySpec = {n: s for n, s in spec.items() if s[1] != torch.float32}
        floats = {n: math.prod(shape) for n, (shape, dtype) in spec.items() if dtype == torch.float32}
        if not floats:
            return out
        if self.whole_record:
            return {**out, **{SEP + p: s for p, s in self.parts(sum(floats.values()), block).items()}}
        for name, numel in floats.items():
            for part, part_spec in self.parts(numel, block).items():
                out[f"{name}{SEP}{part}" if part else name] = part_spec
        if self.seeded:
            out[SEP + SEED] = ((1,), torch.int64)
        return out

    def encode(self, tensors: Mapping[str, torch.Tensor], block: int,
               generator: torch.Generator | None = None) -> Tensors:
        if self.lossless:
            return dict(tensors)
        out: Tensors = {n: t for n, t in tensors.items() if t.dtype != torch.float32}
        floats = {n: t for n, t in tensors.items() if t.dtype == torch.float32}
        if not floats:
            return out
        if self.whole_record:
            flat = torch.cat([floats[n].detach().reshape(-1) for n in sorted(floats)])
            return {**out, **{SEP + p: t.cpu() for p, t in self.encode_array(flat, block, generator).items()}}
        return {**out, **self._encode_arrays(floats, block, generator)}

    def _encode_arrays(self, floats: Mapping[str, torch.Tensor], block: int,
                       generator: torch.Generator | None) -> Tensors:
        """Each float array on its own (and rand's one seed for the record's positions)."""
        out: Tensors = {}
        seed = self._seed(floats, generator) if self.seeded else None
        for name, t in floats.items():
            chooser = _chooser(seed, name) if seed is not None else None
            for part, encoded in self.encode_array(t, block, generator, chooser).items():
                out[f"{name}{SEP}{part}" if part else name] = encoded.cpu()
        if seed is not None:
            out[SEP + SEED] = torch.tensor([seed], dtype=torch.int64)
        return out

    @staticmethod
    def _seed(floats: Mapping[str, torch.Tensor], generator: torch.Generator | None) -> int:
        """rand's seed: from the sender's generator, else a hash of the values (a run replays)."""
        if generator is not None:
            return int(torch.randint(-(1 << 62), 1 << 62, (1,), generator=generator))
        digest = hashlib.sha256()
        for name in sorted(floats):
            digest.update(floats[name].detach().cpu().contiguous().numpy().tobytes())
        return int.from_bytes(digest.digest()[:8], "little", signed=True)

    def decode(self, arrays: Mapping[str, torch.Tensor], spec: ArraySpec, block: int) -> Tensors:
        """The record's tensors from arrays that match `record_spec(spec)` (checked by the
        caller: names, shapes, dtypes); MalformedEncoding on values no encoder writes."""
        if self.lossless:
            return dict(arrays)
        out: Tensors = {n: arrays[n] for n, (_, dtype) in spec.items() if dtype != torch.float32}
        floats = {n: shape for n, (shape, dtype) in spec.items() if dtype == torch.float32}
        if not floats:
            return out
        if self.whole_record:
            return {**out, **self._decode_whole(arrays, floats, block)}
        seed = int(arrays[SEP + SEED][0]) if self.seeded else None
        for name, shape in floats.items():
            parts = {p: arrays[f"{name}{SEP}{p}" if p else name] for p in self.parts(math.prod(shape), block)}
            try:
                out[name] = self.decode_array(parts, shape, block,
                                              _chooser(seed, name) if seed is not None else None)
            except MalformedEncoding as why:
                raise MalformedEncoding(f"[{name}]: {why}") from None
        return out

    def _decode_whole(self, arrays: Mapping[str, torch.Tensor], floats: Mapping[str, tuple[int, ...]],
                      block: int) -> Tensors:
        """rtop's float arrays: one flat decode, cut back into the record's arrays by name."""
        sizes = [math.prod(floats[n]) for n in sorted(floats)]
        parts = {p: arrays[SEP + p] for p in self.parts(sum(sizes), block)}
        flat = self.decode_array(parts, (sum(sizes),), block)
        return {name: piece.reshape(floats[name])
                for name, piece in zip(sorted(floats), torch.split(flat, sizes), strict=True)}

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


def _chooser(seed: int, array: str) -> torch.Generator:
    """rand's generator of one array's positions: the record's seed and the array's name."""
    digest = hashlib.sha256(f"rand/{seed}/{array}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:7], "little"))


def array_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The bytes one array takes on Flower's wire: np.save's header and the data."""
    header = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(torch.empty(0, dtype=dtype).numpy().dtype)
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False,
                                                  "shape": tuple(shape)})
    return len(header.getvalue()) + math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def spec_bytes(spec: ArraySpec) -> int:
    return sum(array_bytes(shape, dtype) for shape, dtype in spec.values())


def wire_bytes(record: Mapping[str, Any]) -> int:
    """An ArrayRecord's bytes as they go over the wire: each array's serialised bytes."""
    return sum(len(arr.data) for arr in record.values())
