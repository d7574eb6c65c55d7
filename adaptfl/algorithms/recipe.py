"""The per-round recipe a client runs, carried in one ConfigRecord.

The server writes the algorithm's components (`<slot>` = name, `<slot>.<key>` = value), the
round's values (`round.<field>`) and, for adaptfl's own ClientApp, the data and runtime
settings. The client rebuilds the very same component objects from it, through the same
declarations and checks, so server-side and client-side validation cannot disagree, and the
ClientApp needs no per-algorithm branch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

from adaptfl.algorithms.algorithm import SLOTS, Algorithm
from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.settings import Data, LanguageModel, Runtime
from adaptfl.codec.settings import Compression, CompressionBase
from adaptfl.core.params import Component, fields_of, lookup
from adaptfl.core.privacy_settings import SERVER_ONLY, Privacy
from adaptfl.core.stage import RoundInfo, Stage

CLIENT_STATE_DIR = "output.client-state-dir"
CLIENT_STATE_MEMORY = "output.client-state-memory"
FROZEN_DIGEST = "model.frozen-digest"  # of the server's frozen parameters (contract.py)
SECURE = "secagg.on"  # SecAgg+: the reply is summed masked; dp='client' noise goes on its integers
# an EVALUATE instruction's recipe: the personalised model's local steps (0: the round's K)
EVALUATE_STEPS = "evaluate.local-steps"
SAMPLED = "privacy.sampled"  # nodes sampled this round: dp='client' noise shares are 1/n each


def _component(prefix: str, c: Component) -> dict[str, Any]:
    return {prefix: c.name, **{f"{prefix}.{k}": v for k, v in c.values().items() if v is not None}}


def to_recipe(algorithm: Algorithm, info: RoundInfo, data: Data | None = None,
              runtime: Runtime | None = None, client_state_dir: str = "",
              client_state_memory: bool = True, llm: LanguageModel | None = None,
              privacy: Privacy | None = None, sampled: int = 1,
              compression: CompressionBase | None = None, secure: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"algorithm": algorithm.name}
    for slot in SLOTS:
        out.update(_component(slot, getattr(algorithm, slot)))
    out["terms"] = ",".join(t.name for t in algorithm.terms)
    for t in algorithm.terms:
        out.update({k: v for k, v in _component(f"terms.{t.name}", t).items() if k != f"terms.{t.name}"})
    out.update({f"round.{k.replace('_', '-')}": v for k, v in dataclasses.asdict(info).items()})
    for prefix, settings in (("data", data), ("runtime", runtime), ("llm", llm)):
        if settings is not None:
            out.update({f"{prefix}.{k}": v for k, v in settings.values().items()})
    out[CLIENT_STATE_DIR] = client_state_dir
    out[CLIENT_STATE_MEMORY] = client_state_memory
    if privacy is not None and privacy.on:  # what a dp='client' client clips and noises with
        out.update({f"privacy.{k}": v for k, v in privacy.values().items() if k not in SERVER_ONLY})
        out[SAMPLED] = sampled
    if compression is not None and not compression.lossless:  # fp32 everywhere: today's recipe
        out.update({f"compression.{k}": v for k, v in compression.values().items()})
    if secure:  # the reply goes out masked (secagg/client.py): a plain request for it is refused
        out[SECURE] = True
    return out


def _build(kind: str, name: str, record: Mapping[str, Any], prefix: str) -> Component:
    cls = lookup(kind, name)
    values = {k[len(prefix) + 1:]: v for k, v in record.items() if k.startswith(prefix + ".")}
    known = {f.key for f in fields_of(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"recipe sets {prefix} keys {unknown} that {kind} {name!r} does not have; "
                         "server and client run different adaptfl versions")
    return cls.build(values)


def algorithm_from_recipe(record: Mapping[str, Any]) -> Algorithm:
    """The algorithm exactly as the server built it (every check runs again here)."""
    name = str(record["algorithm"])
    # Any: the slots' components, each of its own kind (Algorithm types them Any too)
    parts: dict[str, Any] = {slot: _build(kind, str(record[slot]), record, slot)
                             for slot, (kind, _) in SLOTS.items()}
    names = [n for n in str(record.get("terms", "")).split(",") if n]
    # cast: the "term" components are Stages (algorithms/components/)
    terms = tuple(cast(Stage, _build("term", n, record, f"terms.{n}")) for n in names)
    paper = catalog()[name].paper if name in catalog() else "user-defined"
    algorithm = Algorithm(name, paper, terms=terms, **parts)
    algorithm.check()
    return algorithm


def round_from_recipe(record: Mapping[str, Any]) -> RoundInfo:
    try:
        return RoundInfo(**{f.name: record[f"round.{f.name.replace('_', '-')}"]
                            for f in dataclasses.fields(RoundInfo)})
    except KeyError as missing:
        raise ValueError(f"recipe lacks {missing}; server and client run different adaptfl "
                         "versions") from None


def privacy_from_recipe(record: Mapping[str, Any]) -> tuple[Privacy, int]:
    """The dp settings and the round's sampled count (dp='none' when the recipe has none)."""
    values = {k[8:]: v for k, v in record.items() if k.startswith("privacy.") and k != SAMPLED}
    return Privacy.build(values), int(record.get(SAMPLED, 1))


def compression_from_recipe(record: Mapping[str, Any]) -> CompressionBase:
    """The wire codecs (fp32 everywhere when the recipe names none)."""
    return Compression.build({k[12:]: v for k, v in record.items() if k.startswith("compression.")})


def settings_from_recipe(record: Mapping[str, Any]) -> tuple[Data, Runtime]:
    return Data.build({k[5:]: v for k, v in record.items() if k.startswith("data.")}), \
        Runtime.build({k[8:]: v for k, v in record.items() if k.startswith("runtime.")})


def llm_from_recipe(record: Mapping[str, Any]) -> LanguageModel:
    return LanguageModel.build({k[4:]: v for k, v in record.items() if k.startswith("llm.")})
