"""Named codec settings a user can pick with one key: `codec='lean'` (docs/compression.md).

    lean   every reply record as int2+ef (2-bit values with error feedback: no positions at
           all), every broadcast record as nf4, the model exact; and, for an algorithm whose
           second moment v travels (FedACT's v-sync), v kept local instead (v-sync='none': each
           client starts v from zero every round, as FedAda2 does), since v at any codec costs
           as much as Δ. On the main job's FedACT: 12.4x fewer client -> server bytes than
           FedAvg fp32, 1.6 points below FedACT fp32 at 8 rounds (3 seeds), 2.8 at 20
           (docs/results.md): not the 1.5 the goal asks.

The preset fills only the keys the run leaves unset, so `codec='lean' codec-delta='int8+ef'`
keeps its own Δ codec; `--print-config` shows what it expanded to (`codec` becomes fp32 and
each shared record gets its own key).
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
    if _unset(out, "v-sync") and synced_v(out):
        out["v-sync"] = "none"
    for record in sorted(shared(out)):
        key = record_key(record)
        if _unset(out, key):
            out[key] = LEAN_BROADCAST if record in wire.SHARED_DOWN else LEAN_REPLY
    return out
