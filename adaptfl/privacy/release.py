"""What a dp run releases (docs/privacy.md, "What a dp run releases"): a whitelist, declared
here once.

Under dp the outputs meant to be shared (metrics.jsonl, metrics.csv, the plots, TensorBoard, the
log at INFO and above, the MetricRecord Flower's `Strategy.start` logs) hold only the keys of
`RELEASED`: the privacy spent, the noise, and what the server computes from the noised means and
its own evaluation. Anything else a round row holds is a function of individual replies (their
norms, losses, metrics, latencies, who took part, why a reply was dropped) and goes, with the
whole row, to `server-confidential.jsonl` in the run folder (mode 0600): the server's, not for
publication. `RunOutputs` (server_app/outputs.py) splits every row here. The released values do
not depend on which nodes were sampled, nor on which of them were slow or failed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from adaptfl.core.durable import fsync_dir
from adaptfl.core.json_rows import json_line

CONFIDENTIAL_FILE = "server-confidential.jsonl"

RELEASED = frozenset({
    "round",
    # the server's central evaluation of the (noised) model, timed on its own clock
    "test-accuracy", "test-loss", "eval-seconds",
    # n sampled: a function of the connected nodes and fraction-train, not of who was drawn
    "replies-sampled",
    # the privacy spent (dp='client': booked at min-replies, whatever came) and the noise's
    # scale (the adaptive C and share are noised releases)
    "dp-epsilon", "dp-epsilon-ledger", "dp-noise-multiplier", "dp-clip-norm", "dp-unclipped-share",
})
# Not released, though they name no node: each depends on who was sampled and how they fared
# (a slow node lengthens `seconds`, a failed one lowers `replies-accepted` or skips the round,
# the central noise's std is z√k·C/m), so they would tell the rounds a node was in.

V = TypeVar("V")


def released(row: Mapping[str, V]) -> dict[str, V]:
    """The part of a round row that may be published under dp."""
    return {k: v for k, v in row.items() if k in RELEASED}


def detail_level(private: bool, level: int = logging.WARNING) -> int:
    """The log level of a line naming a node or a client's value: DEBUG under dp (the server
    operator's, opt-in), else `level`."""
    return logging.DEBUG if private else level


def _write_private(path: Path, text: str, flags: int) -> None:
    """Write through a descriptor created 0600: never readable by others, not even briefly."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an older run may have other bits
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def append_confidential(run_dir: Path, row: Mapping[str, Any]) -> None:
    """One round's whole row, fsynced before the checkpoint relies on it (as metrics.jsonl)."""
    _write_private(run_dir / CONFIDENTIAL_FILE, json_line(row), os.O_APPEND)


def write_confidential(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Replace the confidential file with exactly `rows` (resume), atomically."""
    path = run_dir / CONFIDENTIAL_FILE
    tmp = path.with_name(path.name + ".tmp")
    _write_private(tmp, "".join(map(json_line, rows)), os.O_TRUNC)
    os.replace(tmp, path)
    fsync_dir(run_dir)
