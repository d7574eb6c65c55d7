"""The one place that decides which parameters Muon updates and which go to AdamW (Jordan
et al. 2024: Muon for hidden matrices, AdamW for the rest).

`hidden` (default, Muon's authors): hidden ≥2-D weights only; the first layer, embeddings, the
classifier head, biases and norms go to AdamW. `all-2d` (the FedPAC authors' code): every ≥2-D
weight goes to Muon. Works on names and shapes only, so the server computes the same split to
know the shapes of Θ. The decision is logged once per distinct model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger(__name__)
ROUTINGS = ("hidden", "all-2d")
_EMBEDDING_HINTS = ("embed", "wte", "wpe", "tok_emb", "pos_emb", "position")
_logged: set[tuple[str, ...]] = set()


def route_muon(shapes: Sequence[tuple[str, Sequence[int]]], routing: str = "hidden") -> list[str]:
    """Names of the parameters Muon manages, in model order (the rest use AdamW)."""
    if routing not in ROUTINGS:
        raise ValueError(f"invalid muon-routing={routing!r}: choose one of {ROUTINGS}")
    matrices = [n for n, s in shapes if len(s) >= 2]
    chosen = matrices if routing == "all-2d" else _hidden_weights(matrices)
    _log_once(routing, [n for n, _ in shapes], chosen)
    return chosen


def _hidden_weights(matrices: list[str]) -> list[str]:
    """Muon's authors' split: layer weights between the first layer and the classifier head;
    learnt tokens and position tables (class_token, pos_embedding) are not layer weights."""
    weights = [n for n in matrices if n.endswith("weight")]
    edge = {weights[0], weights[-1]} if weights else set()  # first layer, classifier head
    return [n for n in weights if n not in edge and not any(h in n.lower() for h in _EMBEDDING_HINTS)]


def _log_once(routing: str, names: list[str], chosen: list[str]) -> None:
    key = (routing, *names)
    if key in _logged:
        return
    _logged.add(key)
    rest = [n for n in names if n not in chosen]
    log.info("muon routing %s: Muon %s; AdamW %s", routing, chosen, rest)
    if not chosen:
        log.warning("muon routing %s left Muon no matrix: everything runs AdamW "
                    "(muon-routing='all-2d' routes every ≥2-D weight to Muon)", routing)
