"""Torch's `params` argument as LocalUpdate's param groups, and components named or given."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adaptfl.core.params import Component, fields_of, lookup
from adaptfl.local_update.rules import Preconditioner


def build_component(kind: str, spec: str | Component, overrides: dict[str, Any]) -> Any:
    """A component from a name or an instance, with keyword overrides of its fields."""
    cls = lookup(kind, spec) if isinstance(spec, str) else type(spec)
    names = {f.name for f in fields_of(cls)}
    mine = {k: overrides.pop(k) for k in list(overrides) if k in names}
    return cls(**mine) if isinstance(spec, str) else spec.replace(**mine)


def as_groups(params: Iterable[Any], rule: Preconditioner) -> list[dict[str, Any]]:
    """Torch's params argument as groups; named parameters are routed by the rule (Muon)."""
    items = list(params)
    if not items:
        raise ValueError("LocalUpdate got no parameters")
    if isinstance(items[0], dict):
        return items
    if isinstance(items[0], tuple):
        return rule.groups(items, 1.0)
    if rule.routes_parameters:  # routing needs shapes only; positions stand in for names
        named = [(str(i), p) for i, p in enumerate(items)]
        groups = rule.groups(named, 1.0)
        return [{**g, "params": [p for _, p in g["params"]]} for g in groups]
    return [{"params": items}]
