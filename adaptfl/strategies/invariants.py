"""The server state a round leaves must be usable by the next one: checked after aggregation,
before the new state replaces the old (strategies/aggregation.py). A round that fails is refused and
the previous state kept, so a combination of individually valid replies (or a rule's overflow)
can neither end the run with a non-finite model nor poison every client's next round.

    model                 every floating entry finite
    records sent down     their declared domains (v̄ ≥ 0, Θ's SOAP statistics PSD, …)
    server-opt/<slot>     the rule's `moment_domains` (FedAdam's v ≥ 0), else finite
    aggregator/<slot>     finite and > 0 (clip's C per record)
    anything else         finite (FedDyn's h)
"""

from __future__ import annotations

from adaptfl.algorithms.algorithm import Algorithm
from adaptfl.core.contract import Contract
from adaptfl.core.domain import FINITE, Domain
from adaptfl.server_rules.aggregators import SLOT_PREFIX as AGGREGATOR_PREFIX
from adaptfl.server_rules.server_opt import SLOT_PREFIX as SERVER_OPT_PREFIX
from adaptfl.strategies.state import ServerState

POSITIVE = Domain("positive", nonneg=True)


class InvariantViolated(ValueError):
    """The new server state is outside its domain; the message names the entry and why."""


def _domains(record: str, names: list[str], contract: Contract, algorithm: Algorithm
             ) -> dict[str, Domain]:
    if record in contract.down:
        declared = contract.domains.get(record, {})
        return {n: declared.get(n, FINITE) for n in names}
    if record.startswith(SERVER_OPT_PREFIX):
        slot = record[len(SERVER_OPT_PREFIX):]
        return dict.fromkeys(names, algorithm.server_opt.moment_domains.get(slot, FINITE))
    if record.startswith(AGGREGATOR_PREFIX):
        return dict.fromkeys(names, POSITIVE)
    return dict.fromkeys(names, FINITE)


def check_state(state: ServerState, contract: Contract, algorithm: Algorithm) -> None:
    """Raise InvariantViolated naming the first entry outside its domain."""
    for name, t in state.model.items():
        why = FINITE.why_outside(t)
        if why:
            raise InvariantViolated(f"model[{name}]: {why}")
    for record, tensors in state.extras.items():
        for name, domain in _domains(record, list(tensors), contract, algorithm).items():
            why = domain.why_outside(tensors[name])
            if why is None and domain is POSITIVE and float(tensors[name].min()) <= 0.0:
                why = "must be > 0"
            if why:
                raise InvariantViolated(f"{record}[{name}]: {why}")
