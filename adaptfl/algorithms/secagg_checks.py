"""What composes with SecAgg+, checked with the run config (one line, before round 1).

The server holds only the sum of each shared record, so whatever reads one reply alone is
refused: a robust aggregator (median, trimmed mean, Krum, clip), the reply screen, the weight
and contribution caps, hostile-fraction, the central dp (it clips each reply on the server),
a lossy reply codec (fixed point is the replies' wire format). Composes: the uniform mean
(weighting='uniform': the mean of the sum), every server optimizer and server-side state
(post-processing of the sum), stateful clients, dp='client' (distributed, discrete noise),
resume between rounds, codecs on the broadcast.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from adaptfl.algorithms.settings import Federation
from adaptfl.core import wire
from adaptfl.core.secagg_settings import clip_key

if TYPE_CHECKING:
    from adaptfl.algorithms.config import RunConfig


# What reads one reply alone and is on by default: under secagg='secagg+' each default gives way
# (the server holds only the sum); a value other than its default is the user's, and is refused.
GIVE_WAY = {"screen-ratio": 0.0, "max-contribution-ratio": 0.0, "weighting": "uniform"}
MIN_SECURE_NODES = 3  # a SecAgg+ sum of fewer reveals each reply to the others (secagg/server.py)
log = logging.getLogger(__name__)


def secagg_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """`secagg='secagg+'` alone runs: the defaults that read each reply alone (the screen, the
    contribution bound, weighting by each reply's claimed examples) are switched off, in one log
    line; under dp='client' the screens are off already. A value that is not the default stays,
    for check_secagg to refuse."""
    if values.get("secagg", "none") == "none":
        return values
    defaults = {f.name.replace("_", "-"): f.default for f in dataclasses.fields(Federation)}
    private = values.get("dp", "none") != "none"
    switched = {key: off for key, off in GIVE_WAY.items()
                if values.get(key, defaults[key]) == defaults[key] and defaults[key] != off
                and not (private and key != "weighting")}
    if switched:
        log.info("secagg='secagg+': %s (the server holds only the sum, so nothing can read one reply)",
                 ", ".join(f"{k}={v!r}" for k, v in switched.items()))
    return {**values, **switched}


def _refuse_lossy_replies(cfg: RunConfig) -> None:
    """SecAgg+ sends the replies as fixed-point integers: no lossy reply codec, the warm-up's
    (codec-warmup: round 1's codecs) included."""
    lossy = [(r, c) for r in wire.SHARED_UP for c in (cfg.compression, cfg.compression.for_round(1))
             if not c.of(r).lossless]
    if lossy:
        record, compression = lossy[0]
        raise ValueError(f"secagg='secagg+' with the lossy codec {str(compression.of(record))!r} "
                         f"on {record!r}: SecAgg+ sends the replies as fixed-point integers; keep "
                         "reply codecs at fp32 (broadcast codecs compose)")


def check_secagg(cfg: RunConfig) -> None:
    secagg, fed = cfg.secagg, cfg.federation
    if not secagg.on:  # a key only secagg reads, moved from its default, would do nothing
        liars = secagg.secagg_liars != type(secagg)().secagg_liars
        unread = secagg.set_keys() + [f"secagg-liars={secagg.secagg_liars}"] * liars
        if unread:
            raise ValueError(f"{unread[0]} with secagg='none': nothing is masked; set "
                             "secagg='secagg+' or drop it")
        return
    needs_one_reply = [
        (cfg.algorithm.aggregator.name != "mean", f"aggregator={cfg.algorithm.aggregator.name!r}",
         "aggregator='mean'"),
        (fed.weighting != "uniform", f"weighting={fed.weighting!r}", "weighting='uniform'"),
        # under dp the screen and the contribution bound are off already (strategies/intake.py):
        # dp's clipping bounds a reply
        (fed.screen_ratio > 0 and not cfg.privacy.on, f"screen-ratio={fed.screen_ratio:g}", "screen-ratio=0"),
        (fed.max_weight_share < 1, f"max-weight-share={fed.max_weight_share:g}", "max-weight-share=1"),
        (fed.max_contribution_ratio > 0 and not cfg.privacy.on,
         f"max-contribution-ratio={fed.max_contribution_ratio:g}", "max-contribution-ratio=0"),
        (fed.hostile_fraction > 0, f"hostile-fraction={fed.hostile_fraction:g}", "hostile-fraction=0"),
        (cfg.privacy.dp == "central", "dp='central'", "dp='client' (each node noises its share)"),
    ]
    refused = [(setting, instead) for hit, setting, instead in needs_one_reply if hit]
    if refused:  # all of them in the one line: the defaults' screens are two of them
        settings, instead = ", ".join(s for s, _ in refused), " ".join(i for _, i in refused)
        verb = "they read" if len(refused) > 1 else "it reads"
        raise ValueError(f"secagg='secagg+' with {settings}: {verb} each reply alone, and the server "
                         f"holds only their sum; use {instead}")
    _refuse_lossy_replies(cfg)
    shared = cfg.algorithm.shared_records()
    unread = [key for key in secagg.set_keys() if key[len(clip_key("")):] not in shared]
    if unread:
        raise ValueError(f"{unread[0]}: algorithm {cfg.algorithm.name!r} shares no such record "
                         f"(it shares {sorted(shared)})")
    if cfg.privacy.dp == "client" and secagg.set_keys():
        raise ValueError(f"{secagg.set_keys()[0]} with dp='client': under dp each record's range is "
                         "its clipping norm (dp-clip-norm, dp-state-clip-norm); drop it")
