"""Named codec settings a user can pick with one key: `codec='lean'` (docs/compression.md).

    lean   every reply record as int2+ef (2-bit values with error feedback: no positions at
           all), every broadcast record as nf4 but Δ_G as int2, the model as a lossless delta
           against the one the node holds (model-delta='diff'); and, for an algorithm whose
           second moment v travels (FedACT's v-sync), v sent once at nf4 in round 1 and frozen
           after it (v-sync-until=1: 1-bit Adam's warm-up, Tang et al. 2021), so v̄ goes down
           once per node. Under dp (whose noised records are fixed per run) v is kept local
           instead (v-sync='none', FedAda2's choice). Measured: docs/results.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from adaptfl.codec.settings import record_key
from adaptfl.core import wire
from adaptfl.core.params import PRESET

LEAN = "lean"
PRESETS = (LEAN,)
LEAN_REPLY, LEAN_BROADCAST = "int2+ef", "nf4"
# the records lean sends at their own codec, and the keys it sets beside the codecs
LEAN_RECORDS = {wire.DELTA_G: "int2", wire.V_LOCAL: "nf4"}
LEAN_V_ONCE = {"v-sync": "full", "v-sync-until": 1}  # v in round 1 only, then frozen
LEAN_V_LOCAL = {"v-sync": "none"}  # under dp, whose noised records are fixed per run
LEAN_KEYS = {"model-delta": "diff"}


def _unset(values: Mapping[str, Any], key: str) -> bool:
    return values.get(key, "") in ("", PRESET, None)


def expand(values: Mapping[str, Any], synced_v: Callable[[Mapping[str, Any]], bool],
           shared: Callable[[Mapping[str, Any]], set[str]]) -> dict[str, Any]:
    """The run config with a codec preset written out. `synced_v(values)`: whether the
    algorithm these values configure sends v; `shared(values)`: the records it shares."""
    out = dict(values)
    if out.get("codec") != LEAN:
        return out
    out["codec"] = "fp32"
    noised = out.get("dp", "none") != "none"  # dp noises a fixed record set every round
    if _unset(out, "v-sync") and synced_v(out):
        for key, value in (LEAN_V_LOCAL if noised else LEAN_V_ONCE).items():
            if _unset(out, key):
                out[key] = value
    for key, value in LEAN_KEYS.items():
        if _unset(out, key):
            out[key] = value
    for record in sorted(shared(out)):
        key = record_key(record)
        if _unset(out, key):
            out[key] = LEAN_RECORDS.get(record, LEAN_BROADCAST if record in wire.SHARED_DOWN else LEAN_REPLY)
    return out
