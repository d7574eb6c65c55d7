"""The `secagg*` keys, declared once: SecAgg+ over every record a client shares.

    secagg                 none, or secagg+ (Bell et al., CCS 2020): the server sees only the sum
    secagg-shares          the size of each node's neighbourhood (itself and shares-1 neighbours on
                           a random ring: SecAgg+'s k-regular graph, k = shares - 1), capped at the
                           round's sample; each node's two secrets are split into that many shares
    secagg-threshold       t / shares: a secret is rebuilt from t shares, never from fewer; above
                           1/2, so a server cannot gather both kinds of share of one honest node
    secagg-modulus-bits    the integers' modulus 2^m: m <= 32 sends uint32 (fp32's bytes)
    secagg-clip            the range [-c, c] of every shared value (clipped into it by construction)
    secagg-clip-<record>   one record's own range (0: secagg-clip); under dp each record's range
                           is its clipping norm C_j instead (a clipped vector has no larger entry)
    secagg-liars           f: the most nodes the search for inputs out of range assumes may lie
                           (strategies/secagg_search.py); a node is excluded only if it is in every
                           set of f nodes that explains the failed sums, so f liars cannot frame
                           an honest one

Fixed point: each round the server sizes the integer step so that the sampled nodes' sum,
with dp's noise to ten standard deviations, stays inside the modulus (protocol.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from adaptfl.core import wire
from adaptfl.core.params import Component, component, param

LOOP = "adaptfl's round loop runs the protocol's five exchanges (server_app/loop.py)"


def clip_key(record: str) -> str:
    return f"secagg-clip-{record}"


@dataclass(frozen=True)
class SecAggBase(Component):
    """SecAgg+'s parameters (the per-record ranges are added below, from wire.py)."""

    secagg: str = param("none", "secure aggregation of every shared record: none, or secagg+ "
                        "(the server sees only the sum; docs/privacy.md)", choices=("none", "secagg+"),
                        loop_only=LOOP)
    secagg_shares: int = param(11, "SecAgg+ neighbourhood: a node and shares-1 neighbours on a random "
                               "ring, capped at the round's sample", within=(3, 1 << 16))
    secagg_threshold: float = param(0.66, "shares needed to rebuild a secret, as a share of "
                                    "secagg-shares (rounded up); above 1/2", within=(0.5, 1.0),
                                    open_low=True)
    secagg_modulus_bits: int = param(32, "the sum's modulus 2^m (m <= 32: uint32 on the wire)",
                                     within=(16, 64))
    secagg_liars: int = param(2, "the most nodes that may send inputs out of range: a node is "
                              "excluded only when every set of this many nodes explaining the sums "
                              "out of reach includes it (docs/secagg.md, 'An input out of range')",
                              within=(1, 8))
    secagg_clip: float = param(8.0, "every shared value is clipped into [-c, c] before fixed point",
                               within=(0.0, None), open_low=True)

    @property
    def on(self) -> bool:
        return self.secagg != "none"

    def clip_of(self, record: str) -> float:
        own = float(getattr(self, "secagg_clip_" + record.replace("-", "_"), 0.0))
        return own or self.secagg_clip

    def set_keys(self) -> list[str]:
        return [clip_key(r) for r in wire.SHARED_UP
                if getattr(self, "secagg_clip_" + r.replace("-", "_"))]

    def round_shares(self, sampled: int) -> tuple[int, int]:
        """(shares, threshold) of a round with `sampled` nodes."""
        shares = min(self.secagg_shares, sampled)
        return shares, max(2, math.ceil(self.secagg_threshold * shares))


def _per_record_fields() -> list[tuple[str, type, Any]]:
    return [("secagg_clip_" + r.replace("-", "_"), float,
             param(0.0, f"the range [-c, c] of the reply record `{r}` under secagg (0: secagg-clip)",
                   within=(0.0, None)))
            for r in wire.SHARED_UP]


SecAgg: type[SecAggBase] = component("settings", "secagg")(dataclasses.make_dataclass(
    "SecAgg", _per_record_fields(), bases=(SecAggBase,), frozen=True))
SecAgg.__module__ = __name__
SecAgg.__doc__ = "Secure aggregation of the shared records (docs/privacy.md)."
