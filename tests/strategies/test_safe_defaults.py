"""The safe defaults of issue 21 §2, by hand: each reply screened against the round's others
(screen-ratio), each weight capped at max-weight-ratio × the round's median, the three attacks of
the issue dropped under the default settings, honest rounds bit-identical with and without the
screens, and the warning of a run that ends below its initial model."""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.sampling import hostile_count
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.abort import RunAborted, SkipGuard, fell_below_start
from adaptfl.server_app.run_checks import check_tolerance
from adaptfl.strategies.screen import (
    CLAIMS,
    HISTORY,
    WINDOW,
    cap_to_median,
    capped_factors,
    is_young,
    next_history,
    round_sizes,
    screened,
)
from adaptfl.strategies.validation import DecodedReply
from tests.strategies.test_hostile_replies import (
    GRID,
    HOSTILE,
    MODEL,
    UNSCREENED,
    _honest,
    _message,
    _round,
    _same_state,
    _strategy,
)


def _reply(*values: float) -> DecodedReply:
    return DecodedReply({wire.DELTA: {"w": torch.tensor(values)}}, {wire.NUM_EXAMPLES: 1}, 0)


def test_a_reply_is_judged_against_the_median_of_the_others() -> None:
    # norms 1, 2, 3, 40; ratios 1/3, 2/3, 3/median(1, 2, 40) = 1.5, 40/median(1, 2, 3) = 20
    replies, plain = [_reply(1.0), _reply(2.0), _reply(0.0, 3.0), _reply(40.0)], [1.0] * 4
    kept, dropped, largest = screened(replies, plain, 10.0)
    assert kept == [0, 1, 2] and list(dropped) == [3] and "delta norm 20×" in dropped[3]
    assert largest == 1.5
    # a capped claim pulls by its capped weight: norm 3 at 10× the median weight, over median(1, 2)
    assert "capped weight × norm 20×" in screened(replies[:3], [1.0, 1.0, 10.0], 10.0)[1][2]
    # two replies: each against the other (a median of both would let the larger one hide)
    assert list(screened([_reply(1.0), _reply(11.0)], [1.0, 1.0], 10.0)[1]) == [1]
    assert screened([_reply(1.0), _reply(9.0)], [1.0, 1.0], 10.0)[1] == {}
    assert screened([_reply(1e30)], [1.0], 10.0)[1] == {}  # alone: nothing to compare with
    assert screened([_reply(1.0), _reply(1.0), _reply(1e6)], plain[:3], 0.0)[1] == {}  # 0: off
    # a squared statistic (v, G·Gᵀ) by sqrt of its norm: 50× is 7.1× in the gradients' scale
    three = [_reply(1.0), _reply(1.0), _reply(50.0)]
    assert screened(three, plain[:3], 10.0, squared={wire.DELTA})[1] == {}
    assert list(screened(three, plain[:3], 10.0)[1]) == [2]


def test_the_screen_reads_every_shared_record_and_names_it() -> None:
    # issue 32 §2: one Δc of 1e30 in SCAFFOLD's c ended the run; every record of the reply
    # (and its required metrics) is compared now, and the reason names the record. The cost:
    # an honest Θ / momentum far from the others' (the config fuzz once drew a fedmixp-muon
    # round whose honest theta-i was 3.4e3× the other's) is screened too (docs/robustness.md)
    def reply(delta: float, theta: float, f_hat: float = 1.0) -> DecodedReply:
        return DecodedReply({wire.DELTA: {"w": torch.tensor([delta])},
                             "theta-i": {"w": torch.tensor([theta])}},
                            {wire.NUM_EXAMPLES: 1, wire.F_HAT: f_hat}, 0)

    replies = [reply(1.0, 1.0), reply(1.0, 3e3), reply(1.0, 2.0)]
    kept, dropped, _ = screened(replies, [1.0] * 3, 10.0)
    assert kept == [0, 2] and dropped[1].startswith("screened: theta-i norm 2e+03× the median")
    assert "3e+03 > screen-ratio=10 × 1.5" in dropped[1]
    assert screened(replies, [1.0] * 3, 10.0, only={wire.DELTA})[1] == {}  # `only`: Δ alone
    liar = [reply(1.0, 1.0), reply(1.0, 1.0), reply(1.0, 1.0, f_hat=-1e6)]
    assert screened(liar, [1.0] * 3, 10.0)[1] == {}  # metrics only when named
    assert screened(liar, [1.0] * 3, 10.0, metrics={wire.F_HAT})[1][2].startswith(
        f"screened: {wire.METRICS}[{wire.F_HAT}] norm 1e+06×")


def test_a_lone_reply_is_screened_against_the_history_median() -> None:
    lone = [_reply(1e30)]
    assert screened(lone, [1.0], 10.0)[1] == {}  # no history yet: nothing to compare with
    history = next_history({}, round_sizes([_reply(1.0), _reply(2.0), _reply(3.0)]))
    assert history == {wire.DELTA: [1.0, 2.0, 3.0]} and not is_young(history)
    why = screened(lone, [1.0], 10.0, reference=history)[1][0]
    assert why.startswith("screened: delta norm 5e+29× the screen reference"), why
    assert screened([_reply(19.0)], [1.0], 10.0, reference=history)[1] == {}
    # a client alone in successive rounds cannot walk the median up screen-ratio× a round: one
    # of three samples is never the median
    walked = next_history(history, round_sizes([_reply(19.0)]))
    assert screened([_reply(26.0)], [1.0], 10.0, reference=walked)[1] != {}  # median 2.5
    assert is_young(next_history({}, round_sizes([_reply(19.0)])))
    # the last WINDOW replies per record
    many = next_history({}, {wire.DELTA: [float(i) for i in range(WINDOW + 5)]})
    assert many[wire.DELTA] == [float(i) for i in range(5, WINDOW + 5)]


@pytest.mark.parametrize("ratio", [0.05, 1.0, 1.99])
def test_a_screen_ratio_that_would_drop_honest_replies_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"^invalid screen-ratio=.*use >= 2, or 0 \(off\)$"):
        RunConfig.of(algorithm="fedavg", screen_ratio=ratio)
    RunConfig.of(algorithm="fedavg", screen_ratio=0.0)  # off
    RunConfig.of(algorithm="fedavg", screen_ratio=2.0)


def test_weights_are_capped_at_a_multiple_of_the_median() -> None:
    assert cap_to_median([10.0, 12.0, 9.0, 11.0, 2.0**62], 10.0) == [10.0, 12.0, 9.0, 11.0, 110.0]
    honest = [10.0, 34.0, 3.0, 17.0]  # 34 / median 13.5 = 2.5: within
    assert cap_to_median(honest, 10.0) == honest
    # the screen's factors: 1, or the capped weight over the median claim
    assert capped_factors([10.0, 11.0, 2.0**62], [10.0, 11.0, 110.0]) == [1.0, 1.0, 10.0]
    assert capped_factors(honest, honest) == [1.0] * 4
    assert cap_to_median([1.0, 2.0**62], 0.0) == [1.0, 2.0**62]  # 0: off


def _flip(reply: dict) -> None:
    reply["arrays"] = {r: {n: -20.0 * t for n, t in a.items()} if r == wire.DELTA else a
                       for r, a in reply["arrays"].items()}


def _zero_the_model(reply: dict) -> None:
    reply["arrays"][wire.DELTA] = {n: -t for n, t in MODEL.items()}
    reply["metrics"][wire.NUM_EXAMPLES] = 2**62


def _one_entry(reply: dict) -> None:
    reply["arrays"][wire.DELTA]["w"][0, 0] = 1e30


ATTACKS = [_flip, _zero_the_model, _one_entry]


def _forget(strategy, node: int) -> int | None:  # noqa: ANN001
    """Takes `node` out of the partition ledger (it saw the node's reply); the id it held."""
    ledger = strategy.state.ownership
    ledger.first_seen.pop(node, None)  # a malformed reply is never seen
    pid = next((p for p, n in ledger.owners.items() if n == node), None)
    if pid is not None:
        del ledger.owners[pid], ledger.bound_at[pid]
    return pid


@pytest.mark.parametrize("aggregator", ["mean", "clip"])
@pytest.mark.parametrize("attack", ATTACKS, ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("algorithm", ["fedavg", "fedact", "scaffold", "hafedho"])
def test_the_attacks_of_issue_21_are_screened_by_default(algorithm, attack, aggregator) -> None:
    """On main the default mean took each of them whole (fedavg at 0.09-0.10, or a 2.6e29
    weight in model.pt); now the reply is dropped and the round is the honest replies' own."""
    attacked, honest_only = (_strategy(algorithm, aggregator=aggregator),
                             _strategy(algorithm, aggregator=aggregator))
    replies = {n: _honest(attacked, n) for n in range(1, HOSTILE)}
    hostile = _honest(attacked, HOSTILE)
    attack(hostile)
    _round(attacked, {**replies, HOSTILE: hostile})
    _round(honest_only, replies)
    assert list(attacked.report.rejected) == [str(HOSTILE)]
    assert attacked.report.rejected[str(HOSTILE)].startswith("screened: delta ")
    assert attacked.report.metrics["replies-screened"] == 1
    assert _forget(attacked, HOSTILE) == HOSTILE - 1  # it did answer, screened: its id bound
    assert _same_state(attacked, honest_only)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedact", "fedpac-soap", "scaffold", "hafedho", "fedadam"])
def test_honest_rounds_are_bit_identical_with_and_without_the_screens(algorithm) -> None:
    """Honest replies (norms 1.1-1.5×, the largest 1.5 / median(1.1, 1.2, 1.3, 1.4) = 1.2× the
    others', sample counts 10-40) trip neither screen, and the round is the same bytes as with
    both off; a claim 30× the median is capped, and then screened by its pull. (The contribution
    bound is off here: these collinear replies are 0-0.2 from their median, and the heaviest one
    is clipped; test_contribution.py holds that a round it leaves alone keeps the same tensors.)"""
    screened_run = _strategy(algorithm, max_contribution_ratio=0.0)
    plain = _strategy(algorithm, **UNSCREENED)
    replies = {n: _honest(screened_run, n) for n in range(1, 6)}
    for n, reply in replies.items():
        reply["metrics"][wire.NUM_EXAMPLES] = 10 * n if n < 5 else 40
    for _ in range(2):  # round 2 reads what round 1 sent down
        _round(screened_run, replies)
        _round(plain, replies)
    assert screened_run.report.rejected == {} and "weights-capped" not in screened_run.report.metrics
    assert screened_run.report.metrics["screen-ratio-max"] == pytest.approx(1.5 / 1.25, rel=1e-6)
    history = screened_run.state.extras.pop(HISTORY)  # the screen's own, beside the same state
    assert history[wire.DELTA].numel() == 10 and history[CLAIMS].tolist() == [10, 20, 30, 40, 40] * 2
    assert _same_state(screened_run, plain)
    screened_run.state.extras[HISTORY] = history
    replies[HOSTILE]["metrics"][wire.NUM_EXAMPLES] = 30 * 30  # the median is 30
    _round(screened_run, replies)  # capped at 10 × 30: its pull 10 × 1.5 is 12× the others'
    assert "capped weight × norm 12×" in screened_run.report.rejected[str(HOSTILE)]
    capped_only = _strategy(algorithm, screen_ratio=0.0, max_contribution_ratio=0.0)
    _round(capped_only, replies)
    assert capped_only.report.metrics["weights-capped"] == 1.0


def test_a_run_that_ends_below_its_initial_model_says_where_it_fell() -> None:
    rows = [{"round": 0, "test-accuracy": 0.10}, {"round": 1, "test-accuracy": 0.50},
            {"round": 2, "test-accuracy": 0.05}, {"round": 3, "test-accuracy": 0.20},
            {"round": 4, "test-accuracy": 0.08}, {"round": 5, "test-accuracy": 0.09}]
    line = fell_below_start(rows)
    assert line is not None and "fell below in round 4" in line and "0.0900" in line
    assert fell_below_start([*rows[:-1], {"round": 5, "test-accuracy": 0.10}]) is None  # equal: fine
    assert fell_below_start(rows[1:]) is None  # a resumed run's rows without round 0: no claim


# --- issue 21 §3: clip bounds the weight, refusals counted over a window, what was set aside ------
def test_clip_bounds_the_weight_as_it_bounds_the_norm() -> None:
    """Main: a flipped Δ of the honest norm claiming 2**62 examples was the whole clipped mean
    (fedact at 0.016). Now it weighs the median claim: x + (4·Δ - Δ)/5 = x + 0.6·Δ."""
    strategy = _strategy("fedavg", aggregator="clip", lr="preset", **UNSCREENED)
    step = {"w": torch.full((2, 2), 0.01), "b": torch.full((2,), 0.01)}
    replies = {n: {"arrays": {wire.DELTA: dict(step)}, "metrics": {wire.NUM_EXAMPLES: 10,
                                                                     wire.PARTITION_ID: n - 1}}
               for n in range(1, 5)}
    replies[HOSTILE] = {"arrays": {wire.DELTA: {k: -t for k, t in step.items()}},
                        "metrics": {wire.NUM_EXAMPLES: 2**62, wire.PARTITION_ID: 4}}
    _round(strategy, replies)
    for name, x in MODEL.items():  # fedavg's server step: x + mean Δ
        assert torch.allclose(strategy.state.model[name], x + 0.6 * step[name], rtol=0, atol=1e-7)
    assert strategy.report.metrics["aggregator-set-aside"] == 0.0  # all at the norm C: none clipped


@pytest.mark.parametrize("aggregator,set_aside", [("krum", 4.0), ("median", 4.0), ("trimmed-mean", 2.0),
                                                  ("mean", None)])
def test_each_aggregator_says_how_many_replies_it_set_aside(aggregator, set_aside) -> None:
    strategy = _strategy("fedavg", aggregator=aggregator, min_replies=5)
    _round(strategy, {n: _honest(strategy, n) for n in range(1, 6)})
    assert strategy.report.metrics.get("aggregator-set-aside") == set_aside


def test_refusals_every_other_round_abort_within_the_window() -> None:
    """Main counted only consecutive skips: 4 of 8 rounds refused ended with exit 0."""
    guard = SkipGuard(limit=3)  # window 2 × 3
    for rnd in range(1, 6):
        guard.after_round(rnd, rnd % 2 == 0, "round refused: x", {}, [])
    with pytest.raises(RunAborted, match=r"after round 6: 3 of the last 6 rounds skipped"):
        guard.after_round(6, True, "round refused: x", {}, [])
    wide = SkipGuard(limit=3, window=20)
    with pytest.raises(RunAborted, match=r"3 of the last 9 rounds"):
        for rnd in range(1, 10):
            wide.after_round(rnd, rnd % 4 == 1, "", {}, [])
    honest = SkipGuard(limit=3)  # one refusal now and then stays within the window
    for rnd in range(1, 30):
        honest.after_round(rnd, rnd % 7 == 0, "", {}, [])


# --- issue 21 §3: aggregators sized from one declared tolerance ------------------------------------
def test_hostile_fraction_sizes_each_rule_and_refuses_what_min_replies_cannot_support() -> None:
    """Main: 2 hostile of 7 under trimmed-mean β = 0.2 (⌊1.4⌋ = 1 cut) and Krum f = 1 ended at
    0.078 / 0.090. hostile-fraction = 0.2 of 7 is ceil(1.4) = 2 for both."""
    assert hostile_count(0.2, 7) == 2 and hostile_count(0.2, 5) == 1 and hostile_count(0.0, 7) == 0
    for aggregator in ("trimmed-mean", "krum"):  # 2 values cut at each end; 7 - f = 5 kept
        strategy = _strategy("fedavg", aggregator=aggregator, hostile_fraction=0.2, min_replies=7,
                             **({"krum_select": 0} if aggregator == "krum" else {}))
        grid = InProcessGrid(7, {})
        sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(
            1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)}
        strategy.aggregate_train(1, [_message(sent[n], _honest(strategy, n)) for n in range(1, 8)])
        assert strategy.report.metrics["aggregator-set-aside"] == (4.0 if aggregator == "trimmed-mean"
                                                                   else 2.0), aggregator
    checks = [("mean", 5, "tolerates no hostile reply .*: set aggregator='trimmed-mean' min-replies=3"),
              ("clip", 5, "tolerates no hostile reply"), ("median", 2, "fewer than half.*min-replies=3"),
              ("trimmed-mean", 2, "cut 1 hostile.*: set min-replies=3"),
              ("krum", 5, "needs at least 7 .*: set min-replies=7")]
    for aggregator, min_replies, message in checks:
        cfg = RunConfig.of(algorithm="fedavg", aggregator=aggregator, hostile_fraction=0.25,
                           min_replies=min_replies)
        with pytest.raises(ValueError, match=message):
            check_tolerance(cfg)


# --- issue 21 §3: a reply the checks set aside is not a missing one ---------------------------------
def _malformed(reply: dict) -> None:
    reply["metrics"][wire.NUM_EXAMPLES] = [1, 2]  # issue 21 §1's reply: dropped as undecodable


@pytest.mark.parametrize("attack", [_flip, _malformed], ids=["flip", "malformed"])
@pytest.mark.parametrize("aggregator", ["krum", "mean"])
def test_a_reply_set_aside_does_not_skip_a_round_whose_min_replies_is_every_node(aggregator, attack) -> None:
    """Main: Krum (f = 1) with min-replies = 5 = the nodes; one screened or undecodable reply left
    4 accepted < 5, every round was skipped and the run aborted (exit 3) by one client. Now the
    five replied: the round goes on with the four, the set-aside one counted as Krum's one hostile
    reply (Krum with f = 0 on the four, the same bytes); a missing or failed reply still skips."""
    strategy = _strategy("fedavg", aggregator=aggregator, min_replies=5)
    replies = {n: _honest(strategy, n) for n in range(1, 6)}
    attack(replies[HOSTILE])
    _round(strategy, replies)
    assert list(strategy.report.rejected) == [str(HOSTILE)] and not strategy.report.skipped
    assert strategy.report.metrics.get("krum-byzantine-used") == (0.0 if aggregator == "krum" else None)
    four = _strategy("fedavg", aggregator=aggregator, min_replies=4,
                     **({"krum_byzantine": 0} if aggregator == "krum" else {}))
    _round(four, {n: replies[n] for n in range(1, 5)})
    _forget(strategy, HOSTILE)  # a decoded reply binds its partition
    assert _same_state(strategy, four)
    missing = _strategy("fedavg", aggregator=aggregator, min_replies=5)
    _round(missing, {n: replies[n] for n in range(1, 5)})  # node 5 silent: it may be honest
    assert missing.report.skipped and "4 replies < min-replies=5" in missing.report.skip_reason
    failed = _strategy("fedavg", aggregator=aggregator, min_replies=5)
    sent = {m.metadata.dst_node_id: m for m in failed.configure_train(
        1, ArrayRecord(failed.state.model), ConfigRecord(), GRID)}
    failed.aggregate_train(1, [*(_message(sent[n], replies[n]) for n in range(1, 5)),
                               Message(Error(code=2, reason="disk full"), reply_to=sent[HOSTILE])])
    assert failed.report.skipped and "4 replies < min-replies=5" in failed.report.skip_reason


def test_krum_refuses_a_round_with_more_replies_set_aside_than_it_supports() -> None:
    """Krum f = 1 of 5: three set aside leave two, too few for Krum even with f = 0 (3)."""
    strategy = _strategy("fedavg", aggregator="krum", min_replies=5)
    replies = {n: _honest(strategy, n) for n in range(1, 6)}
    for node in (3, 4, 5):
        _malformed(replies[node])
    _round(strategy, replies)
    assert strategy.report.skipped and "Krum" in strategy.report.skip_reason


@pytest.mark.slow
def test_the_engine_ends_a_run_below_its_initial_model_with_the_warning_line(
        tiny_data, tmp_path, monkeypatch, capsys) -> None:
    """`python -m adaptfl.engine` end to end, screens off: round 1 honest, then one client's reply
    claiming 2**62 examples sets the model to predict class 5 alone (16 of the 200 test images:
    0.0800, below the initial MLP's). The run completes (exit 0) and its last line says so and
    names round 2."""
    from adaptfl.client_app.app import train_or_refuse
    from adaptfl.engine import __main__ as engine
    from adaptfl.engine import inprocess
    from adaptfl.server_app.loop import run_federated

    def handler(msg: Message, context) -> Message:  # noqa: ANN001
        reply = train_or_refuse(msg, context)
        if msg.content.config_records[wire.CONFIG]["server-round"] < 2 or \
                context.node_config["partition-id"] != 0:
            return reply
        x = msg.content.array_records[wire.ARRAYS].to_torch_state_dict()
        last_bias = [n for n in x if n.endswith("bias")][-1]
        target = {n: torch.zeros_like(t) for n, t in x.items()}
        target[last_bias][5] = 1.0  # every logit 0 but class 5's
        reply.content[wire.DELTA] = ArrayRecord({n: target[n] - x[n] for n in x})
        metrics = dict(reply.content.metric_records[wire.METRICS])
        reply.content[wire.METRICS] = MetricRecord({**metrics, wire.NUM_EXAMPLES: 2**62})
        return reply

    monkeypatch.setattr(inprocess, "run_inprocess", lambda cfg, nodes, on_round=None: run_federated(
        inprocess.InProcessGrid(nodes, cfg.to_flower(), handler=handler), cfg, on_round=on_round))
    engine.main(["--num-nodes", "3", "--quiet", "algorithm='fedavg'", "model='mlp'",
                 "num-server-rounds=2", "local-steps=3", "batch-size=16", "partitioning='iid'",
                 f"data-dir='{tiny_data['fashion-mnist']}'", f"results-dir='{tmp_path}'",
                 "run-name='t'", "screen-ratio=0", "max-weight-ratio=0", "max-contribution-ratio=0",
                 "seed=1"])  # returns: exit 0
    lines = capsys.readouterr()

    rows = [json.loads(r) for r in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["test-accuracy"] > 0.08 < rows[1]["test-accuracy"], rows  # or it proves nothing
    assert rows[-1]["test-accuracy"] == pytest.approx(16 / 200)
    assert lines.out.strip().splitlines()[-1].startswith("results: ")
    assert lines.err.strip().splitlines()[-1] == (
        f"warning: the final model's test accuracy 0.0800 is below the initial model's "
        f"{rows[0]['test-accuracy']:.4f}: it fell below in round 2 and stayed there (see that "
        "round's rejected replies, screen-ratio-max and weights-capped in metrics.jsonl)")
