"""Well-formed but hostile replies (issue 13 §1), fed to the strategy by hand: every attack is
dropped with its reply, capped, or refused with the round; the server state never leaves its
domain; and with a robust aggregator one hostile reply among five changes no averaged record
(Δ, v̄, Θ, control variates, MimeLite's m, HaFedHo's g and f̂, the server rules' moments)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.core.domain import FINITE, MOMENT, NON_FINITE, NONNEG, PSD, SQUARABLE, SQUARE_BOUND
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import AdaptiveStrategy
from adaptfl.strategies.examples import LEDGER
from adaptfl.strategies.invariants import check_state
from adaptfl.strategies.state import ServerState

F32 = torch.float32
SPEC = ModelSpec({"w": ((2, 2), F32), "b": ((2,), F32)}, ("w", "b"))
MODEL = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -0.5])}
GRID = InProcessGrid(5, {})  # nodes 1..5
HOSTILE = 5
BIG = 3.4e38  # finite at float32
# The safe defaults (screen-ratio, max-weight-ratio: strategies/screen.py) off: what the checks
# behind them (domains, invariants, the aggregators) do alone
UNSCREENED = {"screen_ratio": 0.0, "max_weight_ratio": 0.0, "max_contribution_ratio": 0.0}


def _strategy(algorithm: str, **kw) -> AdaptiveStrategy:
    extra = {"muon_routing": "all-2d"} if algorithm.endswith("muon") else {}
    if algorithm.endswith("+light"):  # FedPAC's compressed upload, expanded before combining
        algorithm, extra = algorithm.removesuffix("+light"), {**extra, "light": True}
    base = dict(algorithm=algorithm, local_steps=2, lr=0.05, lr_schedule="constant",
                num_server_rounds=3, **extra)
    strategy = AdaptiveStrategy(RunConfig.of(**{**base, **kw}))
    strategy.initialize(MODEL, SPEC)
    return strategy


def _honest(strategy: AdaptiveStrategy, node: int, same: bool = False) -> dict:
    """Plausible records for every array the contract expects (in domain), varying by node."""
    contract = strategy.contract()
    scale = 1.0 if same else 1.0 + 0.1 * node
    arrays = {}
    for record, spec in contract.reply_spec(SPEC).items():
        domains = contract.domains.get(record, {})
        arrays[record] = {}
        for name, (shape, dtype) in spec.items():
            if domains.get(name) is PSD:
                value = torch.eye(shape[0]) * scale
            else:
                value = torch.full(shape, 0.01 * scale)
            arrays[record][name] = value.to(dtype)
    metrics = {wire.NUM_EXAMPLES: 10, wire.PARTITION_ID: node - 1, wire.F_HAT: 1.0 * scale}
    return {"arrays": arrays, "metrics": metrics}


def _message(to: Message, reply: dict) -> Message:
    content = RecordDict({name: ArrayRecord(t) for name, t in reply["arrays"].items()})
    content[wire.METRICS] = MetricRecord(reply["metrics"])
    return Message(content=content, reply_to=to)


def _round(strategy: AdaptiveStrategy, replies: dict[int, dict]) -> dict[int, Message]:
    sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(
        1, ArrayRecord(strategy.state.model), ConfigRecord(), GRID)}
    strategy.aggregate_train(1, [_message(sent[node], r) for node, r in replies.items()])
    return sent


def _same_state(a: AdaptiveStrategy, b: AdaptiveStrategy) -> bool:
    """Every record the state averages or sends; not HaFedHo's ledger of raw claims
    (strategies/examples.py), which records each client's first claim as made and caps it where
    |D| is computed (n-total, compared)."""
    b.state.run_key = a.state.run_key  # random per job; everything else must agree
    kept = [{**s.extras} for s in (a.state, b.state)]
    for state in (a.state, b.state):
        state.extras.pop(LEDGER, None)
    same = a.state.to_bytes() == b.state.to_bytes()
    for state, extras in zip((a.state, b.state), kept, strict=True):
        state.extras = extras
    return same


def _attack(kind: str):  # noqa: ANN202 - reply -> hostile reply
    def apply(reply: dict) -> dict:
        arrays, metrics = reply["arrays"], reply["metrics"]
        if kind == "negative-v":
            arrays[wire.V_LOCAL]["w"][0, 0] = -1.0
        elif kind == "v-1e30":
            arrays[wire.V_LOCAL]["w"][0, 0] = 1e30
        elif kind == "delta-1e30":
            arrays[wire.DELTA]["w"][0, 0] = 1e30
        elif kind == "f-hat-1e300":
            metrics[wire.F_HAT] = 1e300
        elif kind == "theta-not-psd":
            arrays[wire.THETA_LOCAL]["w/gg0"] = torch.tensor([[1.0, 2.0], [2.0, 1.0]])  # eigenvalue -1
        elif kind == "theta-asymmetric":
            arrays[wire.THETA_LOCAL]["w/gg0"] = torch.tensor([[1.0, 0.5], [0.0, 1.0]])
        elif kind == "negative-h":
            arrays[wire.THETA_LOCAL]["b/hessian"][1] = -0.5
        elif kind == "pid-float":
            metrics[wire.PARTITION_ID] = 4.0
        elif kind == "pid-negative":
            metrics[wire.PARTITION_ID] = -1
        return reply
    return apply


DOMAIN_ATTACKS = [
    ("fedact", "negative-v", "v[w]: negative"), ("fedadamw", "negative-v", "v[w]: negative"),
    ("fedact", "v-1e30", "squared"), ("fedadam", "delta-1e30", "delta[w]: |value| 1e+30 overflows"),
    ("fedyogi", "delta-1e30", "squared"), ("fedadagrad", "delta-1e30", "squared"),
    ("fedadamom", "delta-1e30", "squared"), ("hafedho", "f-hat-1e300", "not finite|non-finite"),
    ("fedpac-soap", "theta-not-psd", "positive semi-definite"),
    ("fedmixp-soap", "theta-asymmetric", "not symmetric"),
    ("fedpac-sophia", "negative-h", "b/hessian]: negative"),
    ("fedavg", "pid-float", "partition-id=4.0 must be a non-negative int"),
    ("scaffold", "pid-negative", "partition-id=-1 must be a non-negative int"),
]


@pytest.mark.parametrize("algorithm,kind,reason", DOMAIN_ATTACKS)
def test_a_reply_outside_its_domain_is_dropped_alone(algorithm: str, kind: str, reason: str) -> None:
    attacked, honest_only = _strategy(algorithm), _strategy(algorithm)
    replies = {n: _honest(attacked, n) for n in range(1, 5)}
    _round(attacked, {**replies, HOSTILE: _attack(kind)(_honest(attacked, HOSTILE))})
    _round(honest_only, replies)
    assert list(attacked.report.rejected) == [str(HOSTILE)]
    assert any(part in attacked.report.rejected[str(HOSTILE)] for part in reason.split("|")), \
        attacked.report.rejected
    assert attacked.report.accepted == 4 and not attacked.report.skipped
    assert _same_state(attacked, honest_only)  # the hostile reply contributed nothing


def test_a_partition_stays_with_the_node_that_first_held_it() -> None:
    """Issue 21 §4: on main a node claiming another's partition id got both dropped, every
    round: one client could knock out a chosen honest one. Now the claimer alone is dropped."""
    strategy = _strategy("fedavg")
    _round(strategy, {n: _honest(strategy, n) for n in range(1, 6)})  # round 1 binds 0..4
    assert strategy.state.partition_owners == {p: p + 1 for p in range(5)}
    replies = {n: _honest(strategy, n) for n in range(1, 6)}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 0  # node 1's partition
    _round(strategy, replies)
    assert list(strategy.report.rejected) == ["5"] and strategy.report.accepted == 4
    assert "partition-id=0 belongs to node 1" in strategy.report.rejected["5"]
    # bindings survive a checkpoint; an owner that left frees its id for whoever comes next
    again = ServerState.from_bytes(strategy.state.to_bytes())
    assert again.partition_owners == strategy.state.partition_owners
    # the round's `clients` rows: the owner's, never overwritten by the claimer's
    replies = {n: _honest(strategy, n) for n in range(1, 6)}
    for reply in replies.values():
        reply["metrics"][wire.CLIENT_STATE] = 1
    replies[HOSTILE]["metrics"].update({wire.PARTITION_ID: 0, wire.CLIENT_STATE: 2})
    _round(strategy, replies)
    assert strategy.report.clients["0"] == {wire.CLIENT_STATE: 1, "node-id": 1}
    assert sorted(strategy.report.clients) == ["0", "1", "2", "3"]


def test_a_reply_must_come_from_the_node_its_instruction_went_to() -> None:
    strategy = _strategy("fedavg")
    sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(
        1, ArrayRecord(MODEL), ConfigRecord(), GRID)}
    for node, msg in sent.items():  # as Flower's Grid stamps them on push
        msg.metadata.__dict__["_message_id"] = f"instruction-{node}"
    forged = _message(sent[2], _honest(strategy, 2))
    forged.metadata.__dict__["_src_node_id"] = HOSTILE  # node 5 answers node 2's instruction
    wrong_type = _message(sent[3], _honest(strategy, 3))
    wrong_type.metadata.__dict__["_message_type"] = MessageType.EVALUATE
    strategy.aggregate_train(1, [forged, wrong_type, _message(sent[1], _honest(strategy, 1))])
    assert "reply to node 2's instruction sent by node 5" in strategy.report.rejected["5->2"]
    assert "message type" in strategy.report.rejected["3"]
    assert strategy.report.accepted == 1
    assert strategy.report.answered == 2  # node 2 sent nothing: the forgery is not its answer


def test_a_forged_reply_does_not_drop_the_victims_own() -> None:
    strategy = _strategy("fedavg")
    sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(
        1, ArrayRecord(MODEL), ConfigRecord(), GRID)}
    for node, msg in sent.items():
        msg.metadata.__dict__["_message_id"] = f"instruction-{node}"
    forged = _message(sent[2], _honest(strategy, 2))
    forged.metadata.__dict__["_src_node_id"] = HOSTILE
    honest = [_message(sent[n], _honest(strategy, n)) for n in (1, 2, 3, 4)]
    strategy.aggregate_train(1, [forged, *honest])  # before it, node 2's bucket held two replies
    assert strategy.report.accepted == 4 and list(strategy.report.rejected) == ["5->2"]


# --- finite values that overflow later: the invariant check keeps them out of the state ------------
OVERFLOW_FAMILIES = ["fedavg", "fedact", "fedadamw", "fedpac-soap", "fedpac-sophia", "hafedho",
                     "fedadam", "scaffold", "mimelite", "feddyn", "fedcm", "fedmixp-muon"]


@pytest.mark.parametrize("algorithm", OVERFLOW_FAMILIES)
def test_a_finite_delta_of_3e38_never_makes_the_state_non_finite(algorithm: str) -> None:
    strategy = _strategy(algorithm)
    replies = {n: _honest(strategy, n) for n in range(1, 5)}
    hostile = _honest(strategy, HOSTILE)
    hostile["arrays"][wire.DELTA]["w"][0, 0] = BIG
    _round(strategy, {**replies, HOSTILE: hostile})
    check_state(strategy.state, strategy.contract(), strategy.cfg.algorithm)  # in its domain
    report = strategy.report
    if report.skipped:  # refused as a round: nothing of it is kept
        assert "round refused" in report.skip_reason
        assert strategy.state.server_round == 0 and strategy.state.extras == {}
        assert all(torch.equal(strategy.state.model[n], MODEL[n]) for n in MODEL)
    else:  # dropped alone (a rule that squares Δ), or accepted with a finite mean
        assert str(HOSTILE) in report.rejected or report.accepted == 5


def test_the_round_refusal_names_the_overflowing_state_and_keeps_the_old_one() -> None:
    strategy = _strategy("fedact", **UNSCREENED)  # Δ_G = -mean Δ/(K·lr) = -10·mean Δ: 3.4e38 overflows
    before = strategy.state.to_bytes()
    replies = {n: _honest(strategy, n) for n in range(1, 5)}
    replies[1]["arrays"][wire.DELTA]["w"][0, 0] = BIG
    _round(strategy, replies)
    assert strategy.report.skipped and "delta-g[w]: non-finite" in strategy.report.skip_reason
    after = strategy.state
    assert after.server_round == 0 and after.model["w"].tolist() == MODEL["w"].tolist()
    assert len(before) > 0 and wire.DELTA_G not in after.extras


def test_a_liars_sample_count_is_capped_at_max_weight_share() -> None:
    liar = {"arrays": {wire.DELTA: {n: -t for n, t in MODEL.items()}},
            "metrics": {wire.NUM_EXAMPLES: 2**62, wire.PARTITION_ID: 4}}
    uncapped = _strategy("fedavg", lr="preset", **UNSCREENED)
    capped = _strategy("fedavg", lr="preset", max_weight_share=0.25, **UNSCREENED)
    for strategy in (uncapped, capped):
        replies = {n: {"arrays": {wire.DELTA: {k: torch.zeros_like(t) for k, t in MODEL.items()}},
                       "metrics": {wire.NUM_EXAMPLES: 10, wire.PARTITION_ID: n - 1}} for n in range(1, 5)}
        _round(strategy, {**replies, HOSTILE: liar})
    assert uncapped.state.model["w"].abs().max() < 1e-6  # the default: sample counts as claimed
    # capped: x + 0.25·(-x) + 0.75·0
    assert capped.state.model["w"].tolist() == [[0.75, 1.5], [2.25, 3.0]]
    assert capped.report.metrics["weights-capped"] == 1.0


# --- robust aggregation protects every averaged record -------------------------------------------
ROBUST_FAMILIES = ["fedavg", "fedact", "fedpac-soap", "fedpac-soap+light", "fedpac-sophia",
                   "fedmixp-muon", "scaffold", "mimelite", "hafedho", "fedadam", "feddyn", "fedlada"]


def _poisoned(strategy: AdaptiveStrategy) -> dict:
    """Every record inflated a million times, inside its domain (v and h stay ≥ 0, Θ PSD), and
    f̂ = 1e18 (uploads are bounded below 1.8e19 since issue 32: f̂ = 1e30 is refused on arrival):
    what validation cannot refuse."""
    reply = _honest(strategy, HOSTILE, same=True)
    reply["arrays"] = {r: {n: t * 1e6 for n, t in arrays.items()} for r, arrays in reply["arrays"].items()}
    reply["metrics"][wire.F_HAT] = 1e18
    reply["metrics"][wire.NUM_EXAMPLES] = 10**9
    return reply


@pytest.mark.parametrize("aggregator", ["median", "trimmed-mean", "krum"])
@pytest.mark.parametrize("algorithm", ROBUST_FAMILIES)
def test_one_hostile_reply_among_five_changes_no_averaged_record(algorithm: str, aggregator: str) -> None:
    attacked, clean, plain = (_strategy(algorithm, aggregator=aggregator, min_replies=5, **UNSCREENED),
                              _strategy(algorithm, aggregator=aggregator, min_replies=5, **UNSCREENED),
                              _strategy(algorithm, **UNSCREENED))
    honest = {n: _honest(attacked, n, same=True) for n in range(1, 6)}
    _round(attacked, {**{n: honest[n] for n in range(1, 5)}, HOSTILE: _poisoned(attacked)})
    _round(clean, honest)
    _round(plain, {**{n: honest[n] for n in range(1, 5)}, HOSTILE: _poisoned(plain)})
    assert attacked.report.accepted == 5 and not attacked.report.skipped
    assert _same_state(attacked, clean), f"{aggregator} let the hostile reply move the state"
    assert plain.report.skipped or not _same_state(plain, clean)  # the mean does not resist


@pytest.mark.parametrize("algorithm", ["fedact", "scaffold", "fedpac-sophia"])
def test_clipping_bounds_a_hostile_record_to_the_median_norm(algorithm: str) -> None:
    clipped, clean = (_strategy(algorithm, aggregator="clip", **UNSCREENED),
                      _strategy(algorithm, aggregator="clip", **UNSCREENED))
    honest = {n: _honest(clipped, n, same=True) for n in range(1, 6)}
    _round(clipped, {**{n: honest[n] for n in range(1, 5)}, HOSTILE: _poisoned(clipped)})
    _round(clean, honest)
    # every record of the hostile reply was scaled to the honest norm (the median), which here
    # gives the honest value back: the state matches the clean round's to float rounding
    a, b = clipped.state, clean.state
    for name in a.model:
        assert torch.allclose(a.model[name], b.model[name], rtol=1e-6, atol=0), name
    for record in set(a.extras) - {"aggregator/clip-norm"}:
        for name, t in a.extras[record].items():
            assert torch.allclose(t, b.extras[record][name], rtol=1e-5, atol=1e-12), (record, name)
    assert clipped.report.metrics["clipped-share"] == pytest.approx(0.2)


# --- every shared record screened, a lone reply against the reference (issue 32 §2-3) ------------
def _set_first(reply: dict, record: str, value: float) -> dict:
    if record == wire.METRICS:
        reply["metrics"][wire.F_HAT] = value
    else:
        next(iter(reply["arrays"][record].values())).view(-1)[0] = value
    return reply


LONE = [("fedavg", wire.DELTA, 1e30), ("scaffold", wire.DELTA_C, 1e15),
        ("fedpac-sophia", wire.THETA_LOCAL, 1e15)]  # f̂: its bound alone (intake.py)


@pytest.mark.parametrize("algorithm,record,value", LONE)
def test_a_lone_reply_is_screened_against_the_reference_kept_in_the_state(algorithm, record, value) -> None:
    """On main a reply alone in its round was never screened (the screen needs the others'
    median): one Δ entry of 1e30 went into fedavg's model. Now round 1's kept replies leave
    their median norm per record in the state (checkpointed), and a resumed run screens a lone
    reply against it; the round is skipped and the state kept."""
    strategy = _strategy(algorithm, min_replies=1)
    _round(strategy, {n: _honest(strategy, n) for n in range(1, 6)})
    resumed = _strategy(algorithm, min_replies=1)
    resumed.state = ServerState.from_bytes(strategy.state.to_bytes())  # as resume=true loads it
    before = resumed.state.clone()
    _round(resumed, {HOSTILE: _set_first(_honest(resumed, HOSTILE), record, value)})
    why = resumed.report.rejected[str(HOSTILE)]
    name = f"{wire.METRICS}[{wire.F_HAT}]" if record == wire.METRICS else record
    assert why.startswith(f"screened: {name} norm") and "the screen reference" in why, why
    assert resumed.report.skipped and resumed.state.server_round == before.server_round
    assert all(torch.equal(resumed.state.model[n], t) for n, t in before.model.items())
    assert {r: {n: t.tolist() for n, t in a.items()} for r, a in resumed.state.extras.items()} == \
        {r: {n: t.tolist() for n, t in a.items()} for r, a in before.extras.items()}
    honest = _strategy(algorithm, min_replies=1)  # an honest lone reply is not screened
    honest.state = ServerState.from_bytes(strategy.state.to_bytes())
    _round(honest, {HOSTILE: _honest(honest, HOSTILE)})
    assert honest.report.rejected == {} and not honest.report.skipped


@pytest.mark.parametrize("algorithm,record", [("scaffold", wire.DELTA_C), ("fedpac-sophia", wire.THETA_LOCAL),
                                              ("hafedho", wire.METRICS)])
def test_an_upload_of_1e30_is_outside_its_bounded_domain(algorithm, record) -> None:
    """Issue 32 §2: Δc, Θ_i (Sophia's h ≥ 0 included) and f̂ of ±1e30 are finite at float32 and
    were accepted, alone in a round too; every upload is bounded |x| < 1.8e19 now."""
    strategy = _strategy(algorithm, **UNSCREENED)
    sign = -1.0 if record == wire.METRICS else 1.0
    _round(strategy, {HOSTILE: _set_first(_honest(strategy, HOSTILE), record, sign * 1e30)})
    assert "overflows float32 when squared" in strategy.report.rejected[str(HOSTILE)]
    assert strategy.state.server_round == 0


def test_the_contribution_bound_clips_scaffolds_delta_c_as_well_as_its_delta() -> None:
    """A flipped SCAFFOLD client sends Δc as well as Δ: max-contribution-ratio bounds each (the
    capped flip left scaffold 0.145 under its clean run at ratio 1 while only Δ was clipped,
    docs/robustness.md). Δc × 5 from one of five identical replies is scaled back to the median
    contribution, which here is the honest value: the state is the clean round's."""
    bounded = {**UNSCREENED, "max_contribution_ratio": 1.0}
    clipped, clean, unclipped = (_strategy("scaffold", **bounded), _strategy("scaffold", **bounded),
                                 _strategy("scaffold", **UNSCREENED))
    honest = {n: _honest(clipped, n, same=True) for n in range(1, 6)}

    def inflated(strategy: AdaptiveStrategy) -> dict:
        reply = _honest(strategy, HOSTILE, same=True)
        reply["arrays"][wire.DELTA_C] = {k: 5 * t for k, t in reply["arrays"][wire.DELTA_C].items()}
        return reply

    _round(clipped, {**{n: honest[n] for n in range(1, 5)}, HOSTILE: inflated(clipped)})
    _round(clean, honest)
    _round(unclipped, {**{n: honest[n] for n in range(1, 5)}, HOSTILE: inflated(unclipped)})
    assert clipped.report.clipped == 1
    c_clipped, c_clean, c_unclipped = (s.state.extras[wire.SCAFFOLD_C] for s in (clipped, clean, unclipped))
    for name, t in c_clean.items():
        assert torch.allclose(c_clipped[name], t, rtol=1e-6, atol=0), name
    assert any(not torch.allclose(c_unclipped[n], t) for n, t in c_clean.items())  # what it bounds


@pytest.mark.parametrize("domain", [FINITE, SQUARABLE, NONNEG, MOMENT, PSD], ids=lambda d: d.name)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_domain_refuses_a_non_finite_value_and_keeps_finite_ones(domain, bad, dtype) -> None:  # noqa: ANN001
    """A squarable domain finds NaN and ±inf in its one pass over |values| (no isfinite pass)."""
    t = torch.eye(3, dtype=dtype)
    assert domain.why_outside(t) is None
    t[1, 1] = bad
    assert domain.why_outside(t) == NON_FINITE
    if domain.squarable:
        assert "overflows" in (domain.why_outside(torch.full((2,), 2 * SQUARE_BOUND)) or "")
