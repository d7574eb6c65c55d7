"""Writes that survive a kill -9 and a power cut: whole-file replacement by rename, appends
fsynced before the next step relies on them, and the folder fsynced after a rename (else the
rename itself may be lost). The order a run relies on: the metrics row is on disk before the
checkpoint that says its round is complete (server_app/checkpoint.py)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Replace `path` with `data`: a reader sees the old file or the new one, never a part.
    `mode` 0o600: created readable by its owner only (never, not even briefly, by others)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    if mode != 0o666:  # a .tmp left by a killed run may have other bits
        os.fchmod(fd, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def append_durable(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
