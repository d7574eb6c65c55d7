"""adaptfl: federated adaptive and second-order optimization on Flower.

One package tree: every subpackage lives in this folder (`adaptfl/strategies`, `adaptfl/client_app`,
…). The repository's top-level `server_app/`, `client_app/` and `strategies/` are symbolic links
into it, for readers; the top-level `deploy/` is a folder of its own holding what Docker and
operators read, whose tools are `adaptfl/deploy` (docs/architecture.md)."""

from __future__ import annotations

from adaptfl.source import checkout, source_checkout

__version__ = "0.2.0"

__all__ = ["__version__", "checkout", "source_checkout"]
