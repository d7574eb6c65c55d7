"""An algorithm is a named composition of components (catalog.py names them):

    preconditioner   the local rule g -> d               (local_update/rules/)
    correction       u = (1-ρ)·d + ρ·Δ_G               (components/correction.py, mimelite.py)
    trust            u <- φ ⊙ u                         (local_update/modulation.py)
    moments          FedACT's v̄ sync                    (components/moments.py)
    local_state      fresh or persistent inner state    (components/local_state.py)
    sharing          FedPAC / FedMIX-P Θ                (components/sharing.py)
    terms            client terms with server parts     (components/prox.py, hafedho.py, …)
    server_opt       the rule on the mean Δ             (server_rules/server_opt/)
    aggregator       how replies are combined           (server_rules/aggregators/)

The run config fills it: `preconditioner=`, `trust=`, `v-sync=`, `server-opt=`, `aggregator=`,
`local-state=` switch a component, `term=` the client term(s); every other key sets a field of the component
that declares it. The
checks across components are here, and so is the wire contract (the union of the records the
components declare), which both sides derive from the very same objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from adaptfl.algorithms.components.local_state import Fresh, LocalState
from adaptfl.core import wire
from adaptfl.core.contract import Contract, ModelSpec, Record
from adaptfl.core.domain import bounded
from adaptfl.core.params import PRESET, Component, component, fields_of, param, registry
from adaptfl.core.stage import Stage

if TYPE_CHECKING:  # the components import Algorithm for their own annotations
    from adaptfl.algorithms.components.correction import Correction
    from adaptfl.algorithms.components.moments import Moments
    from adaptfl.algorithms.components.sharing import Sharing
    from adaptfl.local_update.modulation import Trust
    from adaptfl.local_update.rules import Preconditioner
    from adaptfl.server_rules.aggregators import Aggregator
    from adaptfl.server_rules.server_opt import ServerOpt

# slot of the Algorithm -> (component kind, the run-config key that switches it; "" = fixed)
SLOTS = {
    "preconditioner": ("preconditioner", "preconditioner"),
    "correction": ("correction", ""),
    "trust": ("trust", "trust"),
    "moments": ("moments", "v-sync"),
    "sharing": ("sharing", ""),
    "server_opt": ("server_opt", "server-opt"),
    "aggregator": ("aggregator", "aggregator"),
    "local_state": ("local_state", "local-state"),
}
TERM_SWITCH = "term"  # replaces the algorithm's client terms by one, or by none ("none")


def term_choices() -> list[str]:
    """What `term=` accepts: "none" or a registered client term (a new term file adds itself)."""
    return ["none", *sorted(registry("term"))]


def _switch(kind: str, key: str, name: Any) -> type[Component]:
    known = registry(kind)
    if name not in known:
        raise ValueError(f"invalid {key}={name!r}: choose one of {sorted(known)}")
    return known[name]


@component("settings", "selection")
@dataclass(frozen=True)
class Selection(Component):
    """Which algorithm, and which components replace its own."""

    algorithm: str = param("fedact", "the named algorithm (docs/algorithms.md)")
    preconditioner: str = param(PRESET, "local rule: sgd, adam, adamw, sophia, muon, soap")
    trust: str = param(PRESET, "trust modulation: none, act, mgup, cautious")
    v_sync: str = param(PRESET, "second-moment sync of the Adam family: none, full, block")
    server_opt: str = param(PRESET, "rule on the mean Δ: none, avgm, adam, yogi, adagrad, adamom")
    aggregator: str = param(PRESET, "how replies are combined: mean, clip, median, trimmed-mean, krum")
    term: str = param(PRESET, "the client term, instead of the algorithm's own: none, feddyn, "
                      "hafedho, moon, prox, scaffold")
    local_state: str = param(PRESET, "the inner optimizer's state across rounds: fresh, persist")


@dataclass(frozen=True)
class Algorithm:
    name: str
    paper: str
    preconditioner: Preconditioner
    correction: Correction
    trust: Trust
    moments: Moments
    sharing: Sharing
    server_opt: ServerOpt
    aggregator: Aggregator
    terms: tuple[Stage, ...] = ()
    local_state: LocalState = dataclasses.field(default_factory=Fresh)
    # the algorithm's own weight decay (DiLoCo's 0.1), used while its preconditioner is kept;
    # None: the preconditioner's default
    weight_decay: float | None = None

    def stages(self) -> tuple[Stage, ...]:
        """The components with a part on each side of the wire, in the order they run (the kept
        optimizer state first, so what the server sends this round is imported over it)."""
        return (self.local_state, self.correction, self.moments, self.sharing, *self.terms)

    def components(self) -> tuple[Component, ...]:
        return (self.preconditioner, self.correction, self.trust, self.moments, self.sharing,
                self.server_opt, self.aggregator, *self.terms, self.local_state)

    def configured(self, values: Mapping[str, Any]) -> Algorithm:
        """This algorithm with a run config's values: switches first, then fields by key."""
        changes: dict[str, Any] = {}
        for slot, (kind, switch) in SLOTS.items():
            current = getattr(self, slot)
            chosen = values.get(switch, PRESET) if switch else PRESET
            cls = type(current) if chosen == PRESET else _switch(kind, switch, chosen)
            changes[slot] = cls.build(values, base=current)
        terms = self.terms
        chosen = values.get(TERM_SWITCH, PRESET)
        if chosen != PRESET:  # the algorithm's terms replaced (a term of its own class keeps its values)
            if chosen not in term_choices():
                raise ValueError(f"invalid {TERM_SWITCH}={chosen!r}: choose one of {term_choices()}")
            same = [t for t in self.terms if t.name == chosen]
            # cast: the "term" components are Stages (algorithms/components/)
            terms = () if chosen == "none" else \
                (same[0] if same else cast(Stage, registry("term")[chosen]()),)
        changes["terms"] = tuple(type(t).build(values, base=t) for t in terms)
        if type(changes["preconditioner"]) is not type(self.preconditioner):
            changes["weight_decay"] = None  # another rule: its own default weight decay
        algorithm = dataclasses.replace(self, **changes)
        algorithm.check()
        return algorithm

    def keys(self) -> set[str]:
        """Every run-config key some component of this algorithm reads."""
        return {f.key for c in self.components() for f in fields_of(type(c))}

    def check(self) -> None:
        """Refuse combinations of the components that make no sense (one line, before round 1)."""
        rule, name = self.preconditioner, self.name
        if self.moments.synced and "exp_avg_sq" not in rule.slots or \
                self.moments.synced and not rule.elementwise:
            raise ValueError(f"v-sync={self.moments.name!r} syncs Adam's second moment v, which "
                             f"preconditioner={rule.name!r} does not have (algorithm {name!r}); "
                             "choose adam or adamw, or v-sync='none'")
        if self.moments.synced and getattr(rule, "bias_correction", "") == "local" and \
                not self.local_state.persists:
            raise ValueError("bias-correction='local' restarts v's correction every round, which "
                             "contradicts a synced v; use 'paper' or 'single-counter'")
        if self.sharing.shares and not rule.shareable:
            raise ValueError(f"algorithm {name!r} shares preconditioner state Θ, which "
                             f"preconditioner={rule.name!r} does not have; choose sophia, muon or soap")
        if rule.name == "muon" and self.trust.active and not getattr(rule, "trust_on_muon", False):
            raise ValueError(f"trust={self.trust.name!r} scales single coordinates of Muon's "
                             "orthogonalised update, which breaks its orthogonality; set "
                             "trust-on-muon=true to opt in")
        bias_correction = getattr(rule, "bias_correction", "local")  # Adam's (rules/adam.py)
        if self.local_state.persists and bias_correction in ("paper", "single-counter"):
            raise ValueError(f"local-state='persist' carries the step count k across rounds, so "
                             f"bias-correction={bias_correction!r} (v on the global step "
                             "(r-1)·K + k) would count the earlier rounds twice; use 'local' "
                             "(torch's AdamW, kept) or 'off'")
        names = [r.name for s in self.stages() for r in (*s.records_down(), *s.records_up())]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"algorithm {name!r}: two components claim the records {duplicated}")

    def shared_records(self) -> set[str]:
        """The names of every array record but the model, both directions (Δ included)."""
        return {wire.DELTA} | {r.name for s in self.stages() for r in (*s.records_down(), *s.records_up())}

    def reply_record_count(self) -> int:
        """How many records a reply carries (Δ, the uploads, the required metrics): what dp
        noises, known before any model is built."""
        stages = self.stages()
        return 1 + sum(len(s.records_up()) for s in stages) + \
            len({m.name for s in stages for m in s.up_metrics})

    def skips_uploads(self) -> bool:
        """Whether some round's replies carry fewer records than the contract's `up` (v-sync-every,
        v-sync-until)."""
        return any(s.skips_uploads() for s in self.stages())

    def _uploads(self, server_round: int | None) -> list[Record]:
        """The records a reply carries: in that round, or (None) in any round."""
        return [r for s in self.stages()
                for r in (s.records_up() if server_round is None else s.records_up_on(server_round))]

    def contract(self, spec: ModelSpec, server_round: int | None = None) -> Contract:
        """The records of this algorithm's messages, with the shapes of this model; with
        `server_round`, `up` holds only the records that round's replies carry."""
        stages = self.stages()
        records = [r for s in stages for r in (*s.records_down(), *s.records_up())]
        shapes = {r.name: r.shape(spec, self) for r in records}
        domains = {r.name: r.domains(shapes[r.name], self) for r in records}
        for r in (r for s in stages for r in s.records_up()):  # what a client uploads is bounded
            domains[r.name] = {n: bounded(d) for n, d in domains[r.name].items()}
        # Δ's domain is the server rule's: the 1/sqrt(v) rules and FedAdamom square it
        domains[wire.DELTA] = dict.fromkeys(spec.entries, self.server_opt.delta_domain)
        metrics = [m for s in stages for m in s.up_metrics]
        return Contract(
            down={r.name: shapes[r.name] for s in stages for r in s.records_down()},
            up={r.name: shapes[r.name] for r in self._uploads(server_round)},
            up_metrics=frozenset(m.name for m in metrics), domains=domains,
            metric_domains={m.name: bounded(m.domain) for m in metrics})

    def describe(self) -> str:
        parts = [c.describe() for c in self.components()
                 if c.name not in ("none", "mean", "fresh") or c is self.preconditioner]
        return f"{self.name} [{', '.join(parts)}]"
