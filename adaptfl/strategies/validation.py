"""Validate a client's reply before anything of it reaches the server state.

A reply passes only if it carries exactly the expected records, every array has the expected
name, shape and dtype and finite values within its record's declared domain (v ≥ 0, Θ's SOAP
statistics PSD, Δ squarable under the rules that square it: core/domain.py), the metrics
are finite numbers with a positive example count, a non-negative int partition id (and the
algorithm's required keys, within their domains), and the whole reply is within the size bound.
Otherwise the reason is returned and the caller drops the reply. Across the round's replies the
partition ids fix the order of the float sums (which node an id belongs to: ownership.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeGuard, cast

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from adaptfl.codec.codec import Codec, wire_bytes
from adaptfl.codec.values import MalformedEncoding
from adaptfl.core import wire
from adaptfl.core.contract import ArraySpec
from adaptfl.core.domain import NON_FINITE, Domain

log = logging.getLogger(__name__)


@dataclass
class DecodedReply:
    arrays: dict[str, dict[str, torch.Tensor]]  # record name -> tensors (decoded)
    metrics: dict[str, float | int]
    num_bytes: int  # as it came over the wire (the arrays' serialised bytes)
    record_bytes: dict[str, int] = field(default_factory=dict)  # the same by record
    versions: ConfigRecord | None = None  # the broadcast versions the node holds (codec/versions.py)


# record name -> its codec (adaptfl/codec/codec.py), with the block size both sides use
Codecs = tuple[Mapping[str, Codec], int]


class ReplyRejected(ValueError):
    """A reply that must not touch the server state; the message says why."""


def _check_arrays(record_name: str, tensors: Mapping[str, torch.Tensor], spec: ArraySpec,
                  domains: Mapping[str, Domain] | None = None) -> None:
    missing = sorted(set(spec) - set(tensors))
    unknown = sorted(set(tensors) - set(spec))
    if missing:
        raise ReplyRejected(f"{record_name}: missing arrays {missing[:5]}")
    if unknown:
        raise ReplyRejected(f"{record_name}: unknown arrays {unknown[:5]}")
    for name, (shape, dtype) in spec.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(shape):
            raise ReplyRejected(f"{record_name}[{name}]: shape {tuple(t.shape)}, "
                                f"expected {tuple(shape)}")
        if t.dtype != dtype:
            raise ReplyRejected(f"{record_name}[{name}]: dtype {t.dtype}, expected {dtype}")
        domain = domains.get(name) if domains else None  # its check includes finite values
        why = domain.why_outside(t) if domain is not None else \
            NON_FINITE if t.is_floating_point() and not bool(torch.isfinite(t).all()) else None
        if why:
            raise ReplyRejected(f"{record_name}[{name}]: {why}")


NPY_HEADER = 4096  # bytes np.save puts before the data (128 for any shape adaptfl sends)


def expected_bytes(expected: Mapping[str, ArraySpec]) -> int:
    """The data bytes of a reply that matches the contract exactly."""
    return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
               for spec in expected.values() for shape, dtype in spec.values())


def reply_bound(max_reply_mb: float, expected: Mapping[str, ArraySpec]) -> int:
    """max-reply-mb in bytes; 0: derived from the contract, its expected size plus headers."""
    if max_reply_mb > 0:
        return int(max_reply_mb * 2**20)
    return expected_bytes(expected) + NPY_HEADER * sum(len(spec) for spec in expected.values())


def _numpy_name(dtype: torch.dtype) -> str | None:
    try:
        return str(torch.empty(0, dtype=dtype).numpy().dtype)
    except TypeError:  # bfloat16 & co. have no numpy dtype: checked after decoding only
        return None


def _check_metadata(record_name: str, record: Mapping[str, Array], spec: ArraySpec) -> None:
    """Names, serialisation, shape, dtype and byte count from the arrays' metadata, so that a
    reply of the wrong size is dropped before its tensors are decoded (a 600 MiB reply was once
    decoded in full, 2.7× the memory, before its shape was found wrong)."""
    names = set(record)
    if names != set(spec):
        missing, unknown = sorted(set(spec) - names), sorted(names - set(spec))
        raise ReplyRejected(f"{record_name}: " + (f"missing arrays {missing[:5]}" if missing
                                                  else f"unknown arrays {unknown[:5]}"))
    for name, (shape, dtype) in spec.items():
        arr = record[name]
        declared = tuple(getattr(arr, "shape", ()))
        if getattr(arr, "stype", None) != "numpy.ndarray":
            raise ReplyRejected(f"{record_name}[{name}]: serialisation {getattr(arr, 'stype', None)!r}, "
                                "expected 'numpy.ndarray'")
        if declared != tuple(shape):
            raise ReplyRejected(f"{record_name}[{name}]: shape {declared}, expected {tuple(shape)}")
        want = _numpy_name(dtype)
        if want is not None and getattr(arr, "dtype", None) != want:
            raise ReplyRejected(f"{record_name}[{name}]: dtype {getattr(arr, 'dtype', None)}, "
                                f"expected {want}")
        limit = math.prod(shape) * torch.empty((), dtype=dtype).element_size() + NPY_HEADER
        if len(arr.data) > limit:
            raise ReplyRejected(f"{record_name}[{name}]: {len(arr.data)} bytes, its shape and "
                                f"dtype need at most {limit}")


def _check_metrics(metrics: Mapping[str, object], required: frozenset[str],
                   domains: Mapping[str, Domain] | None = None,
                   level: int = logging.WARNING) -> dict[str, float | int]:
    """Required keys present; every value the strategy reads a finite number, the declared ones
    within their domain at float32, the partition id a non-negative int. A client's own extra
    metric that is not a finite number is left out of the round's record (logged), not a reason
    to drop the reply; lists of numbers are kept apart (allowed by Flower, recorded by nobody)
    unless the strategy reads the key: `num-examples = [1, 2]` is a bad reply
    (docs/threat-model.md, "Hostile clients", step 2)."""
    missing = sorted(({wire.NUM_EXAMPLES} | required) - set(metrics))
    if missing:
        raise ReplyRejected(f"{wire.METRICS}: missing keys {missing}")
    out = _numbers(metrics, {wire.NUM_EXAMPLES, wire.PARTITION_ID, *required, *(domains or {})}, level)
    if not (isinstance(out[wire.NUM_EXAMPLES], int) and out[wire.NUM_EXAMPLES] > 0):
        raise ReplyRejected(f"{wire.NUM_EXAMPLES}={out[wire.NUM_EXAMPLES]!r} must be a positive int")
    pid = out.get(wire.PARTITION_ID)
    if pid is not None and not (isinstance(pid, int) and pid >= 0):
        raise ReplyRejected(f"{wire.PARTITION_ID}={pid!r} must be a non-negative int")
    for key, domain in (domains or {}).items():
        why = domain.why_outside(torch.tensor([float(out[key])], dtype=torch.float32)) \
            if key in out else None
        if why:
            raise ReplyRejected(f"{wire.METRICS}[{key}]={out[key]!r}: {why} at float32")
    return out


def _numbers(metrics: Mapping[str, object], read: set[str], level: int) -> dict[str, float | int]:
    """The finite numbers among the metrics; one the strategy reads must be one (`level`: of
    the line about one it leaves out)."""
    out: dict[str, float | int] = {}
    for key, value in metrics.items():
        if isinstance(value, list) and key not in read:
            continue
        if not _finite_number(value):
            if key in read:
                raise ReplyRejected(f"{wire.METRICS}[{key}]={value!r} is not a finite number")
            log.log(level, "%s[%s]=%r is not a finite number: left out of the round's metrics",
                    wire.METRICS, key, value)
            continue
        out[key] = value
    return out


def _finite_number(value: object) -> TypeGuard[float | int]:
    """An int within int64 (what Flower's wire carries; float() of a larger one can overflow)
    or a finite float; not a bool, not a list."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -2**63 <= value < 2**63
    return isinstance(value, float) and math.isfinite(value)


def decode_reply(msg: Message, expected: Mapping[str, ArraySpec], max_bytes: int,
                 required_metrics: frozenset[str] = frozenset(),
                 domains: Mapping[str, Mapping[str, Domain]] | None = None,
                 metric_domains: Mapping[str, Domain] | None = None,
                 level: int = logging.WARNING, codecs: Codecs | None = None) -> DecodedReply:
    """Decode and validate one reply; raises ReplyRejected with the reason. `level`: of the line
    about a client's own metric left out (DEBUG under dp: it quotes the client's value)."""
    if msg.has_error():
        raise ReplyRejected(f"client error {msg.error.code}: {msg.error.reason}")
    return decode_content(msg.content, expected, max_bytes, required_metrics, domains, metric_domains,
                          level, codecs)


def decode_content(content: RecordDict, expected: Mapping[str, ArraySpec], max_bytes: int,
                   required_metrics: frozenset[str] = frozenset(),
                   domains: Mapping[str, Mapping[str, Domain]] | None = None,
                   metric_domains: Mapping[str, Domain] | None = None,
                   level: int = logging.WARNING, codecs: Codecs | None = None) -> DecodedReply:
    """Validate a reply's content (also used on the server's own preflight reply); `domains`
    (record -> array -> Domain) and `metric_domains` are the contract's. With `codecs`, every
    check up to the metadata is on the encoded records (so the size bound holds on what came
    over the wire), then each record is decoded, one at a time, and its values checked."""
    names = set(content.array_records)
    if names != set(expected):
        raise ReplyRejected(f"array records {sorted(names)}, expected {sorted(expected)}")
    unexpected = sorted(set(content.config_records) - {wire.VERSIONS})  # read by codec/versions.py
    if unexpected:
        raise ReplyRejected(f"unexpected config records {unexpected}")
    if set(content.metric_records) != {wire.METRICS}:
        raise ReplyRejected(f"metric records {sorted(content.metric_records)}, "
                            f"expected ['{wire.METRICS}']")
    by_record = {name: wire_bytes(rec) for name, rec in content.array_records.items()}
    size = sum(by_record.values())
    if size > max_bytes:
        raise ReplyRejected(f"reply of {size} bytes exceeds the bound of {max_bytes} bytes")
    codec_of, block = codecs if codecs is not None else ({}, 0)
    for record_name, spec in expected.items():  # before any tensor is materialised
        codec = codec_of.get(record_name)
        _check_metadata(record_name, content.array_records[record_name],
                        spec if codec is None else codec.record_spec(spec, block))
    arrays = {}
    for record_name, spec in expected.items():  # one record decoded at a time
        tensors = _decoded(record_name, content.array_records[record_name], spec,
                           codec_of.get(record_name), block)
        _check_arrays(record_name, tensors, spec, (domains or {}).get(record_name))
        arrays[record_name] = tensors
    metrics = _check_metrics(dict(content.metric_records[wire.METRICS]), required_metrics,
                             metric_domains, level)
    return DecodedReply(arrays=arrays, metrics=metrics, num_bytes=size, record_bytes=by_record,
                        versions=content.config_records.get(wire.VERSIONS))


def _decoded(record_name: str, record: ArrayRecord, spec: ArraySpec, codec: Codec | None, block: int
             ) -> dict[str, torch.Tensor]:
    """One record's tensors, as its codec wrote them (metadata checked already)."""
    try:
        tensors = dict(record.to_torch_state_dict())
    except Exception as err:  # noqa: BLE001 - any undecodable payload is a bad reply
        raise ReplyRejected(f"{record_name}: cannot decode arrays ({err})") from err
    if codec is None or codec.lossless:
        return tensors
    try:
        return codec.decode(tensors, spec, block)
    except MalformedEncoding as why:
        raise ReplyRejected(f"{record_name}: malformed {codec} encoding {why}") from None


# --- a fixed order of the replies ---------------------------------------------------------

def summation_order(replies: Mapping[int, DecodedReply]) -> Callable[[tuple[int, DecodedReply]], int]:
    """A fixed order of the replies, so float sums depend neither on arrival order nor on the
    transport: the clients' partition ids where every reply has a distinct one (they are the
    same in simulation, deployment and the in-process engine; a liar changes only the rounding
    order), else the node ids."""
    pids = [r.metrics.get(wire.PARTITION_ID) for r in replies.values()]
    if all(isinstance(p, int) and p >= 0 for p in pids) and len(set(pids)) == len(pids):
        return lambda item: cast(int, item[1].metrics[wire.PARTITION_ID])  # all() above: an int each
    return lambda item: item[0]
