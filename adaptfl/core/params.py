"""Hyperparameters declared once, as typed dataclass fields that know their run-config key.

A component (a preconditioner, a trust rule, a correction, a client term, a server optimizer,
an aggregator, a block of run settings) is a frozen dataclass whose fields are declared with
`param(default, doc, ...)`. From that one declaration come:

- the run-config key (the field name in kebab-case unless `key=` says otherwise),
- the type check and coercion at the edge (`Component.build`),
- the range / choice check with a one-line message naming the key (`__post_init__`),
- the values carried in the recipe to clients (`Component.values`),
- the key table of docs/algorithms.md and `pyproject.toml`'s `[tool.flwr.app.config]` (algorithms/config.py).

`None` as a default means "derived" (α = 1/τ, the preconditioner's lr, …), so no valid number
is ever stolen as a sentinel; in a run config the string "preset" asks for that default.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

PRESET = "preset"  # run-config value: "the algorithm's / the component's default"
_META = "adaptfl"
C = TypeVar("C", bound="Component")


@dataclass(frozen=True)
class Param:
    """What a field means and which values it accepts."""

    doc: str
    key: str = ""  # run-config key; "" = the field name in kebab-case
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # low itself excluded
    open_high: bool = False
    sane: tuple[float, float] | None = None  # outside: refused as nonsense (e.g. lr=1e10)
    # Read only by adaptfl's own round loop (server_app/loop.py), not by Flower's
    # `Strategy.start`: what to use there instead. Setting it for `start` is refused.
    loop_only: str = ""
    # A key of the same component that contradicts this one: both set away from their defaults
    # is refused (`local-epochs` replaces `local-steps`).
    excludes: str = ""

    def why_invalid(self, value: Any) -> str | None:
        """A reason the value is invalid, or None."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            return f"choose one of {list(self.choices)}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be finite"
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
                return f"must be {'>' if self.open_low else '>='} {self.low}" + self._range_hint()
            if self.high is not None and (value > self.high or (self.open_high and value == self.high)):
                return f"must be {'<' if self.open_high else '<='} {self.high}" + self._range_hint()
            if self.sane is not None and not self.sane[0] <= value <= self.sane[1]:
                return (f"outside the sane range [{self.sane[0]:g}, {self.sane[1]:g}]; "
                        "a value like this wrecks the model")
        return None

    def _range_hint(self) -> str:
        if self.low is None or self.high is None:
            return ""
        lo, hi = "(" if self.open_low else "[", ")" if self.open_high else "]"
        return f" (range {lo}{self.low:g}, {self.high:g}{hi})"


def param(default: Any, doc: str, *, key: str = "", choices: tuple[Any, ...] | None = None,
          within: tuple[float | None, float | None] = (None, None), open_low: bool = False,
          open_high: bool = False, sane: tuple[float, float] | None = None, loop_only: str = "",
          excludes: str = "") -> Any:
    """A dataclass field declared with its doc and checks (see the module docstring)."""
    meta = Param(doc, key, choices, within[0], within[1], open_low, open_high, sane, loop_only, excludes)
    return dataclasses.field(default=default, metadata={_META: meta})


def key_of(field: dataclasses.Field[Any]) -> str:
    meta: Param = field.metadata[_META]
    return meta.key or field.name.replace("_", "-")


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


@dataclass(frozen=True)
class FieldInfo:
    name: str  # attribute name
    key: str  # run-config key
    type: type  # int | float | str | bool
    optional: bool  # None allowed (a derived default)
    default: Any
    param: Param


def _field_type(cls: type, field: dataclasses.Field[Any]) -> tuple[type, bool]:
    hint = typing.get_type_hints(cls)[field.name]
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if base not in _TYPES.values():
        raise TypeError(f"{cls.__name__}.{field.name}: a run-config field must be int, float, str "
                        f"or bool (optionally | None), not {hint}")
    return base, optional


def fields_of(cls: type) -> tuple[FieldInfo, ...]:
    """The declared hyperparameters of a component class, in declaration order."""
    cached: tuple[FieldInfo, ...] | None = cls.__dict__.get("_adaptfl_fields")
    if cached is not None:
        return cached
    out = []
    for f in dataclasses.fields(cls):
        if _META not in f.metadata:
            continue
        kind, optional = _field_type(cls, f)
        out.append(FieldInfo(f.name, key_of(f), kind, optional, f.default, f.metadata[_META]))
    result = tuple(out)
    type.__setattr__(cls, "_adaptfl_fields", result)
    return result


def coerce(key: str, value: Any, info: FieldInfo, has_preset: bool = False) -> Any:
    """One run-config value into the field's type; Flower parses `lr=1` as int, so an int is
    accepted for a float. Raises a one-line ValueError naming the key; it offers "preset" only
    where there is one (`has_preset`: an algorithm's preset sets the field, or its default is
    derived), not for settings such as num-server-rounds."""
    if value is None and info.optional:
        return None
    expected = info.type
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool:
        if not isinstance(value, bool):
            raise ValueError(f"run-config {key}={value!r}: expected true or false")
        return value
    if not isinstance(value, expected) or isinstance(value, bool):
        hint = f" or \"{PRESET}\"" if has_preset or info.default in (None, PRESET) else ""
        raise ValueError(f"run-config {key}={value!r}: expected {expected.__name__}{hint}")
    return value


class Component:
    """Base of every declared component: validation on construction, values by key."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for info in fields_of(type(self)):
            why = info.param.why_invalid(getattr(self, info.name))
            if why:
                raise ValueError(f"invalid {info.key}={getattr(self, info.name)!r}: {why}")
        self._check_exclusions()
        self.check()

    def _check_exclusions(self) -> None:
        """Two keys declared as contradicting each other (`excludes=`), both set: one line."""
        by_key = {info.key: info for info in fields_of(type(self))}
        for info in by_key.values():
            other = by_key.get(info.param.excludes)
            if other is None:
                continue
            mine, theirs = getattr(self, info.name), getattr(self, other.name)
            if mine != info.default and theirs != other.default:
                raise ValueError(f"{info.key}={mine!r} and {other.key}={theirs!r} contradict each other: "
                                 f"{info.key} replaces {other.key}; set one of them")

    def check(self) -> None:
        """Cross-field checks (one-line ValueError naming the keys)."""

    @classmethod
    def build(cls: type[C], values: Mapping[str, Any], base: Component | None = None) -> C:
        """From run-config values by key: set keys override `base`'s fields (the algorithm's
        preset, when it is of a class with those fields), which override the class defaults."""
        kwargs: dict[str, Any] = {}
        for info in fields_of(cls):
            if info.key in values and values[info.key] != PRESET:
                has_preset = base is not None and hasattr(base, info.name)
                kwargs[info.name] = coerce(info.key, values[info.key], info, has_preset)
            elif base is not None and hasattr(base, info.name):
                kwargs[info.name] = getattr(base, info.name)
        return cls(**kwargs)

    def values(self) -> dict[str, Any]:
        """{run-config key: value} of every declared field (None for a derived default)."""
        return {info.key: getattr(self, info.name) for info in fields_of(type(self))}

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def describe(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.values().items() if v is not None)
        return f"{self.name}({inner})"


# --- the registry ---------------------------------------------------------------------------
_REGISTRY: dict[str, dict[str, type[Component]]] = {}
# Packages whose every module declares components; importing them registers the components, so a
# new preconditioner, term, server optimizer or aggregator is one new file in one of them.
COMPONENT_PACKAGES = (
    "adaptfl.algorithms.settings",
    "adaptfl.core.privacy_settings",
    "adaptfl.local_update.rules",
    "adaptfl.local_update.modulation",
    "adaptfl.algorithms.components",
    "adaptfl.server_rules.server_opt",
    "adaptfl.server_rules.aggregators",
)
_discovered = False


def component(kind: str, name: str) -> Callable[[type[C]], type[C]]:
    """Register a component class under (kind, name)."""

    def register(cls: type[C]) -> type[C]:
        cls.kind, cls.name = kind, name
        known = _REGISTRY.setdefault(kind, {})
        if name in known and known[name] is not cls:
            raise TypeError(f"two {kind} components named {name!r}: {known[name]} and {cls}")
        known[name] = cls
        fields_of(cls)  # type errors in declarations surface at import
        return cls

    return register


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    import importlib
    import pkgutil

    for package in COMPONENT_PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            importlib.import_module(f"{package}.{info.name}")
    _discovered = True


def registry(kind: str) -> dict[str, type[Component]]:
    """Every registered component of one kind, by name."""
    _discover()
    return dict(_REGISTRY.get(kind, {}))


def lookup(kind: str, name: str) -> type[Component]:
    known = registry(kind)
    if name not in known:
        raise ValueError(f"unknown {kind.replace('_', '-')} {name!r}; choose one of {sorted(known)}")
    return known[name]


def all_fields() -> Iterator[tuple[type[Component], FieldInfo]]:
    """Every declared field of every registered component."""
    _discover()
    for kind in _REGISTRY:
        for cls in _REGISTRY[kind].values():
            for info in fields_of(cls):
                yield cls, info
