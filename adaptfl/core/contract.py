"""The wire contract: which records go down and come back, declared by the components.

Every component that puts something on the wire declares it once as a `Record` (its name and
the shape of its arrays, derived from the model). An algorithm's contract is the union of its
components' records plus the base message (the model down, Δ and metrics up). The server builds
its payload and validates replies from it; the ClientApp refuses any record it does not list,
so a record sent and silently ignored cannot happen.

Frozen parameters (`requires_grad=False`: a pretrained base under LoRA adapters, a user's fixed
feature extractor) are not federated: every node builds them itself, the model record, Δ and
every per-parameter record (Δ_G, v̄, Θ, c, …) cover the other state_dict entries only, and the
server's spec carries a digest of the frozen weights that each client checks its own against.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from adaptfl.core import wire
from adaptfl.core.domain import FINITE, Domain

if TYPE_CHECKING:
    from adaptfl.algorithms.algorithm import Algorithm

# name -> (shape, dtype) for every array a record must hold
ArraySpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class ModelSpec:
    """Names, shapes and dtypes of the model: what valid arrays must look like."""

    entries: dict[str, tuple[tuple[int, ...], torch.dtype]]  # every federated state_dict entry
    parameters: tuple[str, ...]  # the trainable ones (optimizer state exists for these)
    frozen_digest: str = ""  # of the frozen parameters ("" when there are none)
    frozen_count: int = 0  # numbers in the frozen parameters (the bytes no round sends)

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelSpec:
        entries = {n: (tuple(t.shape), t.dtype) for n, t in federated_state(model).items()}
        frozen = frozen_parameters(model)
        unique = {id(p): p for p in frozen.values()}  # tied weights (embedding = head) once
        return cls(entries, tuple(n for n, p in model.named_parameters() if p.requires_grad),
                   frozen_digest(model), sum(p.numel() for p in unique.values()))

    @classmethod
    def of_arrays(cls, arrays: Mapping[str, torch.Tensor],
                  parameters: tuple[str, ...] | None = None) -> ModelSpec:
        """From a state dict alone; without `parameters` every floating entry counts as trainable."""
        entries = {n: (tuple(t.shape), t.dtype) for n, t in arrays.items()}
        names = parameters if parameters is not None else \
            tuple(n for n, t in arrays.items() if t.is_floating_point())
        return cls(entries, names)

    def params(self) -> ArraySpec:
        return {n: self.entries[n] for n in self.parameters}

    def blocks(self) -> ArraySpec:
        """One value per trainable tensor (FedACT's `block` v-sync)."""
        return {n: ((1,), self.entries[n][1]) for n in self.parameters}

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(n, self.entries[n][0]) for n in self.parameters]

    @property
    def dtype(self) -> torch.dtype:
        return self.entries[self.parameters[0]][1] if self.parameters else torch.float32


def frozen_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters that do not train (`requires_grad=False`), by every name they have."""
    return {n: p for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def federated_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict entries that cross the wire: all but the frozen parameters (no copies)."""
    frozen = frozen_parameters(model)
    return {n: t for n, t in model.state_dict(keep_vars=True).items() if n not in frozen}


def frozen_digest(model: torch.nn.Module) -> str:
    """SHA-256 over the frozen parameters' names, dtypes, shapes and bytes ("" if none): a node
    whose base differs from the server's (another file, another seed) would train adapters for
    a model nobody evaluates, so it is refused instead.

    A client checks it every round, and hashing a base takes seconds (SmolLM2-135M: ~1.5 s),
    so the digest is kept while the same tensor objects hold the same storage at the same
    version (every in-place write through autograd's tensors bumps it: load_state_dict, an
    optimizer, `copy_` under no_grad) and a strided sample of their values is unchanged (it
    catches a base rewritten through `.data` or numpy, which the version does not see)."""
    frozen = frozen_parameters(model)
    if not frozen:
        return ""
    names = sorted(frozen)
    tensors = [frozen[n].detach() for n in names]
    stamp = (names, [(t.data_ptr(), t._version, t.dtype, tuple(t.shape), t.device) for t in tensors],
             _probe(tensors))
    with _DIGESTS_LOCK:  # the same live objects: not new tensors at freed ones' addresses
        for refs, kept_stamp, kept in _DIGESTS:
            if kept_stamp == stamp and all(r() is frozen[n] for r, n in zip(refs, names, strict=True)):
                return kept
    sha = hashlib.sha256()
    for name, t in zip(names, tensors, strict=True):
        sha.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        # an ndarray is a Buffer; numpy's stubs don't match hashlib's Buffer protocol here
        sha.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    digest = sha.hexdigest()
    with _DIGESTS_LOCK:
        _DIGESTS.appendleft(([weakref.ref(frozen[n]) for n in names], stamp, digest))
    return digest


# the few bases this process hashed last: (weak refs to their parameters, stamp, digest)
_DIGESTS: deque[tuple[list[weakref.ref[torch.Tensor]], tuple[Any, ...], str]] = deque(maxlen=4)
_DIGESTS_LOCK = threading.Lock()  # clients of the in-process engine may run in threads
PROBE = 64  # values sampled per tensor


def _probe(tensors: list[torch.Tensor]) -> bytes:
    """PROBE evenly spaced values of each tensor, as bytes (one small copy per tensor)."""
    picks = [t.reshape(-1)[::max(1, t.numel() // PROBE)][:PROBE] for t in tensors]
    return b"".join(p.cpu().contiguous().view(torch.uint8).numpy().tobytes() for p in picks)


def load_federated(model: torch.nn.Module, arrays: Mapping[str, torch.Tensor]) -> None:
    """Load the wire's model record into `model`, which keeps its frozen parameters. The record
    must name every trainable entry and nothing the model lacks; frozen entries it carries
    (a server that counted them as trainable) are loaded too, unchanged by training."""
    missing, unexpected = model.load_state_dict(dict(arrays), strict=False)
    trainable_missing = sorted(set(missing) - set(frozen_parameters(model)))
    if unexpected or trainable_missing:
        what = f"names {unexpected[:3]} the model lacks" if unexpected else \
            f"no values for the federated entries {trainable_missing[:3]}"
        raise ValueError(f"the model record holds {what}: server and client build different models")


Shape = Callable[[ModelSpec, "Algorithm"], ArraySpec]


def params_shape(spec: ModelSpec, algorithm: Algorithm) -> ArraySpec:
    return spec.params()


def scalar_shape(name: str) -> Shape:
    return lambda spec, algorithm: {name: ((1,), torch.float32)}


# The domain of one array of a record, by its name (Θ mixes slots: Sophia's h ≥ 0, SOAP's PSD
# statistics, Muon's momentum of any sign)
DomainOf = Callable[["Algorithm", str], Domain]


@dataclass(frozen=True)
class Record:
    """One ArrayRecord on the wire, with the values its arrays may hold (core/domain.py):
    checked on every reply that carries it and on the server state that is sent as it."""

    name: str
    shape: Shape = params_shape
    doc: str = ""
    domain: Domain | DomainOf = FINITE

    def domains(self, arrays: ArraySpec, algorithm: Algorithm) -> dict[str, Domain]:
        if isinstance(self.domain, Domain):
            return dict.fromkeys(arrays, self.domain)
        return {name: self.domain(algorithm, name) for name in arrays}


@dataclass(frozen=True)
class Metric:
    """A reply metric a component requires, with its domain (checked at float32, the precision
    the server state keeps it in: f̂ = 1e300 is a finite Python float and an infinite f̂^t)."""

    name: str
    domain: Domain = FINITE
    doc: str = ""


@dataclass(frozen=True)
class Contract:
    """What an algorithm's messages carry, by record name."""

    down: dict[str, ArraySpec]  # extra records the server may send (besides the model)
    up: dict[str, ArraySpec]  # records every reply must carry (besides Δ)
    up_metrics: frozenset[str] = field(default_factory=frozenset)  # required reply metrics
    # record -> array -> domain, for every record above and Δ (the server optimizer's)
    domains: dict[str, dict[str, Domain]] = field(default_factory=dict)
    metric_domains: dict[str, Domain] = field(default_factory=dict)

    def reply_spec(self, spec: ModelSpec) -> dict[str, ArraySpec]:
        return {wire.DELTA: dict(spec.entries), **self.up}

    def reply_domains(self) -> dict[str, dict[str, Domain]]:
        return {name: self.domains[name] for name in (wire.DELTA, *self.up) if name in self.domains}
