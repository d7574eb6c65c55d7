"""The `codec*` keys, declared once: how every record but the model crosses the wire.

    codec            the codec of every shared record, both directions (codec.py's grammar);
                     fp32, the default, sends today's bytes exactly
    codec-<record>   one record's own codec over `codec` ("": codec's); one key per record of
                     core/wire.py (SHARED_DOWN, SHARED_UP), e.g. codec-delta='top1%:fp4+ef',
                     codec-v='int8', codec-delta-g='nf4'
    codec-rounding   nearest, or stochastic (unbiased; seeded by the run seed, the round, the
                     sender and the record, so a run replays)
    codec-block      values per absmax block of int8 / nf4 / fp4 / int2 (64, as QLoRA)
    codec-positions  how top-k's positions travel (positions.py): auto (the smallest of the
                     three for each array's size and k), int32, bitmap, elias-fano
    codec-warmup     rounds 1..R send every shared record at codec-warmup-codec (fp32: dense),
                     then the codecs above: top-k cells lose most in round 1 and never recover
                     it (docs/compression.md), the rounds where the model moves most
    model-delta      xor / diff: the model to a node holding an earlier one as its lossless
                     XOR / ordered-bit difference against it, compressed (model_delta.py);
                     none: whole

The model broadcast is always exact: a sampled client may hold an older model than the last
one. A broadcast record the run may send unchanged later (the model under model-delta, a frozen
v̄) goes only to a node that does not hold its current version (versions.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from adaptfl.codec.codec import FP32, Codec
from adaptfl.codec.positions import LAYOUTS
from adaptfl.core import wire
from adaptfl.core.domain import Domain
from adaptfl.core.params import Component, component, param

KEPT_MODELS = 2  # the earlier models the server keeps for model-delta (versions.py)


def record_key(record: str) -> str:
    return f"codec-{record}"


@dataclass(frozen=True)
class CompressionBase(Component):
    """What every record's codec is (the per-record fields are added below, from wire.py)."""

    codec: str = param("fp32", "wire codec of every shared record, both directions (not the model): "
                       "fp32 (lossless), bf16, fp16, int8, nf4, fp4, int2, or top<P>%[:<values>] "
                       "(top-k per array), rtop<P>%[:<values>] (per record), rand<P>%[:<values>] "
                       "(seeded random-k, replies only); +ef: error feedback on the replies' "
                       "records; or the preset lean (replies int2+ef, broadcasts nf4, Δ_G int2, v once and "
                       "frozen, model-delta=diff). "
                       "docs/compression.md")
    codec_rounding: str = param("nearest", "rounding of the lossy codecs: nearest, or stochastic "
                                "(unbiased, seeded: a run replays)", choices=("nearest", "stochastic"))
    codec_block: int = param(64, "values per absmax scale of int8 / nf4 / fp4 / int2", within=(2, 1 << 20))
    codec_positions: str = param("auto", "how top-k's positions travel: auto (the smallest for each "
                                 "array), int32, bitmap, elias-fano", choices=LAYOUTS)
    codec_warmup: int = param(0, "rounds 1..R send every shared record at codec-warmup-codec, then "
                              "the codecs above (0: no warm-up)", within=(0, None))
    codec_warmup_codec: str = param("fp32", "the codec of every shared record in the codec-warmup "
                                    "rounds (any codec above; fp32: dense)")
    model_delta: str = param("none", "the model to a node that holds one of the server's last "
                             f"{KEPT_MODELS} models: none (whole), xor (lossless: its bitwise XOR "
                             "against that one, compressed), or diff (lossless: the difference of "
                             "its float32 values' ordered bit patterns, as bit planes, compressed)",
                             choices=("none", "xor", "diff"))

    def check(self) -> None:
        Codec.parse(self.codec)
        self._check_warmup()
        for record in wire.SHARED_DOWN + wire.SHARED_UP:
            text = self.raw(record)
            if text:
                codec = Codec.parse(text, record_key(record))
                if codec.ef and record in wire.SHARED_DOWN:
                    raise ValueError(f"invalid {record_key(record)}={text!r}: error feedback (+ef) is "
                                     "a client's, for what it sends; the server's broadcast has none")
            if record in wire.SHARED_DOWN and self.of(record).select == "rand" and self.of(record).top:
                raise ValueError(f"invalid {record_key(record) if text else 'codec'}={text or self.codec!r}: "
                                 f"random-k (rand) is for replies; the broadcast {record!r} must decode to "
                                 "the server's state every round (use top or rtop there, or set "
                                 f"{record_key(record)})")

    def _check_warmup(self) -> None:
        if self.codec_warmup == 0:
            if self.codec_warmup_codec != "fp32":
                raise ValueError(f"codec-warmup-codec={self.codec_warmup_codec!r} with codec-warmup=0: "
                                 "no round reads it; set codec-warmup=R or drop it")
            return
        Codec.parse(self.codec_warmup_codec, "codec-warmup-codec")
        try:  # its own check: the warm-up codec on every record, the broadcasts too
            warm = self.for_round(1)
        except ValueError as why:
            raise ValueError(f"codec-warmup-codec={self.codec_warmup_codec!r}: {why}") from None
        if all(str(warm.of(r)) == str(self.of(r)) for r in wire.SHARED_DOWN + wire.SHARED_UP):
            raise ValueError(f"codec-warmup={self.codec_warmup} with codec-warmup-codec="
                             f"{self.codec_warmup_codec!r}: every record runs that codec after the "
                             "warm-up too; set a lighter codec or drop codec-warmup")

    def for_round(self, server_round: int) -> CompressionBase:
        """The codecs of one round: in rounds 1..codec-warmup, codec-warmup-codec on every shared
        record (both sides derive it from the round: the recipe carries the settings)."""
        if server_round > self.codec_warmup:
            return self
        # Any: the per-record fields are generated (below), mypy sees only the base's
        records = wire.SHARED_DOWN + wire.SHARED_UP
        blank: dict[str, Any] = {"codec_" + r.replace("-", "_"): "" for r in records}
        return dataclasses.replace(self, codec=self.codec_warmup_codec, codec_warmup=0,
                                   codec_warmup_codec="fp32", **blank)

    def raw(self, record: str) -> str:
        return str(getattr(self, "codec_" + record.replace("-", "_")))

    def of(self, record: str) -> Codec:
        """The codec of one record (ARRAYS, the model: always fp32). `codec`'s +ef reaches the
        replies' records only: the server's broadcast has no residual to feed back."""
        if record == wire.ARRAYS:
            return FP32
        own = self.raw(record)
        codec = Codec.parse(own or self.codec, record_key(record) if own else "codec")
        if codec.top:  # the positions' layout: only a sparse codec has positions
            codec = dataclasses.replace(codec, positions=self.codec_positions)
        return dataclasses.replace(codec, ef=False) if record in wire.SHARED_DOWN else codec

    def set_keys(self) -> list[str]:
        """The per-record keys set (for the check that their records are shared)."""
        return [record_key(r) for r in wire.SHARED_DOWN + wire.SHARED_UP if self.raw(r)]

    @property
    def lossless(self) -> bool:
        return all(self.of(r).lossless for r in wire.SHARED_DOWN + wire.SHARED_UP)

    def generator(self, seed: int, server_round: int, sender: str, record: str) -> torch.Generator | None:
        """The stochastic rounding's generator for one record of one sender's message (None: nearest)."""
        if self.codec_rounding != "stochastic":
            return None
        digest = hashlib.sha256(f"codec/{seed}/{server_round}/{sender}/{record}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:7], "little"))


def _per_record_fields() -> list[tuple[str, type, Any]]:
    fields: list[tuple[str, type, Any]] = []
    for record in wire.SHARED_DOWN + wire.SHARED_UP:
        side = "broadcast" if record in wire.SHARED_DOWN else "reply"
        fields.append(("codec_" + record.replace("-", "_"), str,
                       param("", f"wire codec of the {side} record `{record}` (\"\": codec's)")))
    return fields


# one field per shared record, generated from wire.py so a new record gets its key
Compression: type[CompressionBase] = component("settings", "compression")(dataclasses.make_dataclass(
    "Compression", _per_record_fields(), bases=(CompressionBase,), frozen=True))
Compression.__module__ = __name__
Compression.__doc__ = "Wire codecs of the shared records (docs/compression.md)."


def check_shared(compression: CompressionBase, shared: set[str], algorithm: str) -> None:
    """A per-record key must name a record this algorithm sends: refused otherwise (one line)."""
    unread = [key for key in compression.set_keys() if key[len("codec-"):] not in shared]
    if unread:
        raise ValueError(f"{', '.join(unread)}: algorithm {algorithm!r} shares no such record (it "
                         f"shares {sorted(shared)}); remove {'them' if len(unread) > 1 else 'it'}")


def check_domains(compression: CompressionBase, domains: Mapping[str, Mapping[str, Domain]]) -> None:
    """Per-value rounding keeps signs (v ≥ 0 stays so) but not a matrix's PSD-ness: a lossy
    codec on a record with PSD arrays (SOAP's statistics in Θ) is refused before round 1."""
    lossy = sorted(r for r, arrays in domains.items()
                   if not compression.of(r).lossless and any(d.psd for d in arrays.values()))
    if lossy:
        keys = " ".join(f"{record_key(r)}='fp32'" for r in lossy)
        raise ValueError(f"{', '.join(lossy)} hold{'s' if len(lossy) == 1 else ''} symmetric PSD "
                         "statistics (SOAP), which the lossy "
                         f"codec {str(compression.of(lossy[0]))!r} breaks value by value; set {keys}")
