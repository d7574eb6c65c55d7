"""Strategies fed hand-built replies, checked against hand-computed results; every malformed
reply is dropped with its reason and leaves the server state untouched."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.codec.codec import array_bytes
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.abort import RunAborted
from adaptfl.strategies import AdaptiveStrategy, FedACT, FedAvg
from adaptfl.strategies.screen import HISTORY
from adaptfl.strategies.state import ServerState

F32 = torch.float32
SPEC = ModelSpec({"w": ((2,), F32), "b": ((1,), F32)}, ("w", "b"))
MODEL = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
GRID = InProcessGrid(3, {})  # nodes 1, 2, 3; also sets Flower's task identity for messages


def _strategy(**kw) -> AdaptiveStrategy:
    base = dict(algorithm="fedact", local_steps=2, lr=0.5, lr_schedule="constant", num_server_rounds=3)
    strategy = AdaptiveStrategy(RunConfig.of(**{**base, **kw}))
    strategy.initialize(MODEL, SPEC)
    return strategy


def _configure(strategy: AdaptiveStrategy, server_round: int, grid: InProcessGrid = GRID
               ) -> dict[int, Message]:
    messages = strategy.configure_train(server_round, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    return {m.metadata.dst_node_id: m for m in messages}


def _reply(to: Message, delta: dict, v: dict | None, num_examples: int,
           extra_metrics: dict | None = None) -> Message:
    content = RecordDict({
        wire.DELTA: ArrayRecord({k: torch.tensor(x) for k, x in delta.items()}),
        wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: num_examples, wire.TRAIN_LOSS: 1.0,
                                    **(extra_metrics or {})}),
    })
    if v is not None:
        content[wire.V_LOCAL] = ArrayRecord({k: torch.tensor(x) for k, x in v.items()})
    return Message(content=content, reply_to=to)


GOOD_A = dict(delta={"w": [1.0, 0.0], "b": [2.0]}, v={"w": [1.0, 1.0], "b": [1.0]}, num_examples=1)
GOOD_B = dict(delta={"w": [-1.0, 4.0], "b": [0.0]}, v={"w": [3.0, 5.0], "b": [9.0]}, num_examples=3)


def _tensors(d: dict) -> dict:
    return {k: v.tolist() for k, v in d.items()}


def _one_round(strategy: AdaptiveStrategy, server_round: int, *replies: tuple[int, dict]) -> None:
    sent = _configure(strategy, server_round)
    strategy.aggregate_train(server_round, [_reply(sent[node], **kw) for node, kw in replies])


def test_fedact_server_aggregates_to_hand_computed_values() -> None:
    strategy = _strategy()
    sent = _configure(strategy, 1)
    # B arrives first: the result must not depend on arrival order.
    strategy.aggregate_train(1, [_reply(sent[2], **GOOD_B), _reply(sent[1], **GOOD_A)])
    state = strategy.state
    # mean Δ (weights 1:3): w = [(1-3)/4, 12/4] = [-0.5, 3], b = 2/4 = 0.5
    assert _tensors(state.model) == {"w": [0.5, 5.0], "b": [3.5]}
    # Δ_G = -mean Δ / (K·lr) = -mean Δ / 1
    assert _tensors(state.extras[wire.DELTA_G]) == {"w": [0.5, -3.0], "b": [-0.5]}
    # v̄ = (1·v_A + 3·v_B) / 4
    assert _tensors(state.extras[wire.V_BAR]) == {"w": [2.5, 4.0], "b": [7.0]}
    assert state.server_round == 1
    assert strategy.report.accepted == 2 and not strategy.report.rejected


def test_keyword_constructors_with_the_papers_defaults() -> None:
    strategy = FedACT(fraction_train=0.5, rho=0.3, tau=0.3)
    algorithm = strategy.cfg.algorithm
    assert (algorithm.correction.rho, algorithm.trust.tau, algorithm.trust.trust_alpha) == (0.3, 0.3, 1 / 0.3)
    assert strategy.cfg.federation.fraction_train == 0.5
    with pytest.raises(ValueError, match="tau"):
        FedAvg(tau=0.3)  # FedAvg has no trust rule to read it


@pytest.mark.parametrize("key,value,instead", [("round_timeout", 30.0, r"start\(timeout=...\)"),
                                               ("results_dir", "/tmp/x", "Result"),
                                               ("resume", True, "Result")])
def test_settings_only_adaptfls_loop_reads_are_refused_by_start(key, value, instead) -> None:
    """Flower's Strategy.start runs its own loop: a setting only adaptfl's ServerApp loop reads
    would be silently ignored there, so start() refuses it in one line, saying what to use."""
    strategy = FedACT(fraction_train=1.0, **{key: value})  # fine for adaptfl's own ServerApp
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match=f"{key} \\(.*{instead}.*\\): read by adaptfl's own ServerApp"):
        strategy.start(grid=InProcessGrid(1, {}), initial_arrays=ArrayRecord(model.state_dict()),
                       num_rounds=1)


def test_uniform_weighting_and_fedavg_keeps_no_extras() -> None:
    strategy = _strategy(algorithm="fedavg", weighting="uniform", lr="preset")
    _one_round(strategy, 1, (1, {**GOOD_A, "v": None}), (2, {**GOOD_B, "v": None}))
    assert _tensors(strategy.state.model) == {"w": [1.0, 4.0], "b": [4.0]}
    assert list(strategy.state.extras) == [HISTORY]  # the screen's, for a lone reply (screen.py)


def test_extra_client_metrics_are_averaged_and_recorded() -> None:
    strategy = _strategy(algorithm="fedavg", lr="preset")
    _one_round(strategy, 1, (1, {**GOOD_A, "v": None, "extra_metrics": {"accuracy": 0.5}}),
               (2, {**GOOD_B, "v": None, "extra_metrics": {"accuracy": 0.9}}))
    assert strategy.report.accepted == 2
    assert strategy.report.metrics["accuracy"] == pytest.approx((0.5 + 3 * 0.9) / 4)
    assert "pos-ratio" not in strategy.report.metrics  # nobody reported it: no fake 0


def test_the_step_path_is_noted_per_client_by_name_and_never_averaged() -> None:
    strategy = _strategy(algorithm="fedavg", lr="preset")
    native, eager = wire.STEP_PATHS.index("native"), wire.STEP_PATHS.index("eager")
    _one_round(strategy, 1, (1, {**GOOD_A, "v": None, "extra_metrics": {wire.STEP_PATH: native}}),
               (2, {**GOOD_B, "v": None, "extra_metrics": {wire.STEP_PATH: native}}))
    assert wire.STEP_PATH not in strategy.report.metrics  # a code, not a mean
    assert strategy.report.step_path() == "native"
    assert {c[wire.STEP_PATH] for c in strategy.report.clients.values()} == {"native"}
    _one_round(strategy, 2, (1, {**GOOD_A, "v": None, "extra_metrics": {wire.STEP_PATH: eager}}),
               (2, {**GOOD_B, "v": None, "extra_metrics": {wire.STEP_PATH: native}}))
    assert strategy.report.step_path() == "eager+native"
    _one_round(strategy, 3, (1, {**GOOD_A, "v": None, "extra_metrics": {wire.STEP_PATH: 7}}),
               (2, {**GOOD_B, "v": None}))
    assert strategy.report.step_path() is None  # an unknown code, and nothing said: no path


def test_a_non_finite_extra_metric_is_left_out_not_the_reply() -> None:
    strategy = _strategy(algorithm="fedavg", lr="preset")
    _one_round(strategy, 1, (1, {**GOOD_A, "v": None, "extra_metrics": {"accuracy": float("nan"),
                                                                        "loss": 0.5}}),
               (2, {**GOOD_B, "v": None, "extra_metrics": {"accuracy": 0.9, "loss": 0.7}}))
    assert strategy.report.accepted == 2 and not strategy.report.rejected
    assert strategy.report.metrics["accuracy"] == pytest.approx(0.9)  # the finite one alone
    assert strategy.report.metrics["loss"] == pytest.approx((0.5 + 3 * 0.7) / 4)


def test_configure_train_ships_delta_g_and_v_bar_once_they_exist() -> None:
    grid = InProcessGrid(2, {})
    strategy = _strategy()
    first = _configure(strategy, 1, grid)
    assert len(first) == 2
    assert set(first[1].content.array_records) == {wire.ARRAYS}
    strategy.aggregate_train(1, [_reply(first[1], **GOOD_A), _reply(first[2], **GOOD_B)])
    content = _configure(strategy, 2, grid)[1].content
    assert set(content.array_records) == {wire.ARRAYS, wire.DELTA_G, wire.V_BAR}
    recipe = content.config_records[wire.RECIPE]
    assert recipe["correction.rho"] == 0.5 and recipe["round.step-offset"] == 2  # (r-1)·K
    assert content.config_records[wire.CONFIG]["server-round"] == 2
    # 3 records (x, Δ_G, v̄) of w (2 floats) and b (1), each array with its .npy header, to 2 clients
    assert strategy.report.bytes_down == 2 * 3 * (array_bytes((2,), F32) + array_bytes((1,), F32))


def _malformed(to: Message) -> dict[str, Message]:
    def reply(**kw) -> Message:
        return _reply(to, **{**GOOD_B, **kw})

    wrong_dtype = reply()
    wrong_dtype.content[wire.DELTA] = ArrayRecord({"w": torch.tensor([1.0, 1.0], dtype=torch.float64),
                                                   "b": torch.tensor([0.0])})
    return {
        "non-finite": reply(delta={"w": [float("nan"), 1.0], "b": [0.0]}),
        "inf": reply(v={"w": [1.0, float("inf")], "b": [0.0]}),
        "shape": reply(delta={"w": [1.0, 1.0, 1.0], "b": [0.0]}),
        "missing arrays": reply(delta={"w": [1.0, 1.0]}),
        "unknown arrays": reply(delta={"w": [1.0, 1.0], "b": [0.0], "extra": [1.0]}),
        "array records": reply(v=None),
        "dtype": wrong_dtype,
        "not a finite number": reply(extra_metrics={wire.PARTITION_ID: float("nan")}),  # one it reads
        "positive int": reply(num_examples=0),
    }


KINDS = sorted(_malformed(Message(RecordDict(), dst_node_id=2, message_type="train")))


@pytest.mark.parametrize("kind", KINDS)
def test_malformed_reply_is_dropped_and_state_is_untouched(kind: str) -> None:
    strategy = _strategy()
    _one_round(strategy, 1, (1, GOOD_A))
    bad = _malformed(_configure(strategy, 2)[2])[kind]
    before = strategy.state.to_bytes()  # after sampling, which moves the sampling RNG
    arrays, _ = strategy.aggregate_train(2, [bad])
    assert arrays is None and strategy.report.skipped
    assert strategy.state.to_bytes() == before
    reason = strategy.report.rejected["2"]
    if kind != "inf":
        assert kind in reason.replace("non-finite values", "non-finite"), reason
    assert strategy.report.metrics["replies-rejected"] == 1

    # Next to a good reply, the bad one contributes nothing.
    with_bad, alone = _strategy(), _strategy()
    sent = _configure(with_bad, 1)
    with_bad.aggregate_train(1, [_reply(sent[1], **GOOD_A), _malformed(sent[2])[kind]])
    _one_round(alone, 1, (1, GOOD_A))
    alone.state.run_key = with_bad.state.run_key  # a new job's key is random; all else must agree
    assert with_bad.state.to_bytes() == alone.state.to_bytes()


def test_replies_are_one_per_sampled_node() -> None:
    strategy = _strategy(fraction_train=0.3)
    sent = _configure(strategy, 1)
    (node,) = sent  # one of the three nodes sampled
    other = next(n for n in (1, 2, 3) if n != node)
    stranger = Message(RecordDict(), dst_node_id=other, message_type="train")
    strategy.aggregate_train(1, [_reply(sent[node], **GOOD_A), _reply(sent[node], **GOOD_B),
                                 _reply(stranger, **GOOD_B)])
    assert strategy.report.accepted == 0
    assert "2 replies from one node" in strategy.report.rejected[str(node)]
    assert "no instruction" in strategy.report.rejected["unknown"]


def test_error_reply_and_oversized_reply_are_dropped() -> None:
    strategy = _strategy(max_reply_mb=1e-6)
    sent = _configure(strategy, 1)
    err = Message(Error(code=2, reason="boom"), reply_to=sent[3])
    strategy.aggregate_train(1, [err, _reply(sent[1], **GOOD_A)])
    assert "boom" in strategy.report.rejected["3"]
    assert "exceeds the bound" in strategy.report.rejected["1"]
    assert strategy.report.skipped and strategy.state.server_round == 0


def test_min_replies_skips_the_round() -> None:
    strategy = _strategy(min_replies=2)
    sent = _configure(strategy, 1)
    before = strategy.state.to_bytes()
    strategy.aggregate_train(1, [_reply(sent[1], **GOOD_A)])
    assert strategy.report.skipped and strategy.state.to_bytes() == before


def test_block_v_sync_expects_one_value_per_tensor() -> None:
    strategy = _strategy(v_sync="block")
    _one_round(strategy, 1, (1, GOOD_A))
    assert "shape" in strategy.report.rejected["1"]
    _one_round(strategy, 1, (1, {**GOOD_A, "v": {"w": [2.0], "b": [1.0]}}))
    assert _tensors(strategy.state.extras[wire.V_BAR]) == {"w": [2.0], "b": [1.0]}


def test_state_round_trips_through_bytes() -> None:
    strategy = _strategy()
    _one_round(strategy, 1, (1, GOOD_A))
    again = ServerState.from_bytes(strategy.state.to_bytes())
    assert again.to_bytes() == strategy.state.to_bytes()
    assert _tensors(again.extras[wire.V_BAR]) == _tensors(strategy.state.extras[wire.V_BAR])


def test_flowers_train_config_reaches_the_clients() -> None:
    strategy = _strategy()
    messages = strategy.configure_train(1, ArrayRecord(strategy.state.model),
                                        ConfigRecord({"epochs-hint": 3, "note": "hi"}), GRID)
    config = next(iter(messages)).content.config_records[wire.CONFIG]
    assert (config["epochs-hint"], config["note"], config["server-round"]) == (3, "hi", 1)


@pytest.mark.parametrize("key", ["local-steps", "weight_decay"])
def test_a_train_config_setting_adaptfl_would_not_read_is_refused(key: str) -> None:
    """A Flower app's train_config key naming an adaptfl setting would reach the client as
    session.config and vanish (the optimizer takes the recipe's): one line naming the keyword
    instead, before any client runs. (The lr is the exception: the next tests.)"""
    calls = []

    def client(msg, context):  # noqa: ANN001, ANN202 - never reached
        calls.append(msg)
        raise AssertionError("a message was sent")

    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError) as err:
        FedACT(fraction_train=1.0).start(
            grid=InProcessGrid(1, {}, handler=client), initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=1, train_config=ConfigRecord({key: 0.05, "local-epochs": 2}))
    snake = key.replace("-", "_")
    assert str(err.value) == (f"train_config[{key!r}]=0.05: adaptfl's clients take "
                              f"{snake.replace('_', '-')} from the strategy, not from train_config; "
                              f"pass FedACT({snake}=0.05) instead")
    assert not calls


@pytest.mark.parametrize("key", ["lr", "learning_rate", "learning-rate"])
def test_a_train_config_lr_is_the_rounds_lr_on_both_sides(key: str) -> None:
    """Flower's habit (`train_config=ConfigRecord({"lr": …})`, changed in configure_train): the
    clients' recipe carries it, the row says it, and the server divides by it: FedACT's
    Δ_G = -mean Δ/(K·lr) at lr 0.25 is twice the one at the run's lr 0.5 (K = 2)."""
    by_config, by_run = _strategy(), _strategy()
    config = ConfigRecord({key: 0.25})
    sent = {m.metadata.dst_node_id: m for m in
            by_config.configure_train(1, ArrayRecord(by_config.state.model), config, GRID)}
    assert sent[1].content[wire.RECIPE]["round.lr"] == 0.25
    assert sent[1].content[wire.RECIPE]["round.lr-scale"] == 0.5  # against the run's lr 0.5
    assert by_config.round_info(1).lr == 0.25 and by_run.round_info(1).lr == 0.5
    _, metrics = by_config.aggregate_train(1, [_reply(sent[1], **GOOD_A), _reply(sent[2], **GOOD_B)])
    assert metrics is not None and metrics["lr"] == 0.25
    plain = _configure(by_run, 1)
    by_run.aggregate_train(1, [_reply(plain[1], **GOOD_A), _reply(plain[2], **GOOD_B)])
    halved, full = by_config.state.extras[wire.DELTA_G], by_run.state.extras[wire.DELTA_G]
    assert all(torch.equal(halved[n], 2 * full[n]) for n in full)
    assert _configure(by_config, 2)[1].content[wire.RECIPE]["round.lr"] == 0.5  # one round only


@pytest.mark.parametrize("value, why", [(0.0, "must be > 0.0"), (50.0, "outside the sane range"),
                                        ("fast", "expected a number")])
def test_a_bad_train_config_lr_is_refused_before_any_client_runs(value: object, why: str) -> None:
    strategy = _strategy()
    with pytest.raises(ValueError, match=rf"^train_config\['lr'\]={value!r}: {why}"):
        strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord({"lr": value}), GRID)


class SilentGrid(InProcessGrid):
    """Nodes that never answer: every round under start() gets no reply at all."""

    def send_and_receive(self, messages, *, timeout=None):  # type: ignore[override]
        list(messages)
        return []


@pytest.mark.parametrize("limit", [2, 3])
def test_start_aborts_after_max_skipped_rounds_without_replies(limit: int) -> None:
    """Under Flower's Strategy.start a round with no replies is a skipped round, and
    max-skipped-rounds of them abort the run (RunAborted), as adaptfl's own loop does."""
    strategy = FedACT(fraction_train=1.0, max_skipped_rounds=limit)
    model = torch.nn.Linear(2, 1)
    rounds: list[int] = []
    expected = (f"after round {limit}: {limit} consecutive rounds skipped "
                rf"\(max-skipped-rounds={limit}\); last round: 0 replies")
    with pytest.raises(RunAborted, match=expected):
        strategy.start(grid=SilentGrid(2, {}), initial_arrays=ArrayRecord(model.state_dict()),
                       num_rounds=6, evaluate_fn=lambda rnd, _: rounds.append(rnd) or None)
    assert rounds == list(range(limit))  # round 0, then each round before the aborted one
    assert strategy.skip_guard is None  # start()'s alone: adaptfl's loop keeps its own


def test_start_refuses_an_evaluate_config_no_client_reads() -> None:
    """Without fraction_evaluate no evaluate message goes out, so no client would read it."""
    strategy = FedACT(fraction_train=1.0)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="evaluate_config: no evaluate message is sent unless "
                                         "fraction_evaluate > 0"):
        strategy.start(grid=InProcessGrid(1, {}), initial_arrays=ArrayRecord(model.state_dict()),
                       num_rounds=1, evaluate_config=ConfigRecord({"batch": 8}))


def test_local_epochs_divide_each_reply_by_its_own_k() -> None:
    """local-epochs=1, batch 10: A claims 10 rows (K_A = 1), B 30 (K_B = 3); weights 1:3.
    Δ_G = -(¼·Δ_A/1 + ¾·Δ_B/3)/lr with lr = 0.5, by hand: w = -([1,0] + [-1,4])/2 = [0, -2],
    b = -(2 + 0)/2 = [-1]; the model's step is the plain weighted mean of Δ, as without epochs."""
    strategy = _strategy(local_epochs=1.0, batch_size=10, local_steps=50)  # 50: not set
    sent = _configure(strategy, 1)
    strategy.aggregate_train(1, [_reply(sent[1], **{**GOOD_A, "num_examples": 10}),
                                 _reply(sent[2], **{**GOOD_B, "num_examples": 30})])
    state = strategy.state
    assert strategy.report.accepted == 2 and not strategy.report.rejected
    assert _tensors(state.model) == {"w": [0.5, 5.0], "b": [3.5]}
    delta_g = _tensors(state.extras[wire.DELTA_G])  # float32: ¼·1 + ¾·(-1/3) is 0 to 1.5e-8
    assert delta_g["w"] == pytest.approx([0.0, -2.0], abs=1e-6) and delta_g["b"] == [-1.0]


def test_local_epochs_on_equal_clients_is_one_k_for_all() -> None:
    """20 rows each at batch 10, 1 epoch: K = 2 for both, the same Δ_G as local-steps=2."""
    by_epochs, by_steps = _strategy(local_epochs=1.0, batch_size=10, local_steps=50), _strategy(batch_size=10)
    for strategy in (by_epochs, by_steps):
        sent = _configure(strategy, 1)
        strategy.aggregate_train(1, [_reply(sent[1], **{**GOOD_A, "num_examples": 20}),
                                     _reply(sent[2], **{**GOOD_B, "num_examples": 20})])
    assert _tensors(by_epochs.state.extras[wire.DELTA_G]) == _tensors(by_steps.state.extras[wire.DELTA_G])


@pytest.mark.parametrize("keywords,said", [
    ({"learning_rate": 0.01}, "unknown keyword learning_rate= (did you mean lr=?)"),
    ({"taau": 0.3}, "unknown keyword taau= (did you mean tau=?)"),
    ({"epochs": 1}, "unknown keyword epochs= (did you mean local_epochs=?)"),
    ({"fraction_evaluate": 1.5}, "invalid fraction-evaluate=1.5: must be <= 1.0"),
])
def test_keyword_errors_are_in_the_callers_words(keywords: dict, said: str) -> None:
    """The strategy's Python API says "keyword" and the closest one, not a run-config key."""
    with pytest.raises(ValueError) as refused:
        FedACT(**keywords)
    assert str(refused.value).startswith(said), str(refused.value)


def test_the_reply_intake_and_aggregation_run_on_one_torch_thread_and_restore_the_count() -> None:
    """Flower's simulation leaves the ServerApp torch's thread per core, whose threads wait for
    each other at every short op on a shared CPU (docs/scale.md): the intake takes one."""
    strategy = _strategy()
    sent = _configure(strategy, 1)
    seen: list[int] = []
    accept, combine = strategy._accept, strategy._next_state
    strategy._accept = lambda *a: (seen.append(torch.get_num_threads()), accept(*a))[1]
    strategy._next_state = lambda *a: (seen.append(torch.get_num_threads()), combine(*a))[1]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        strategy.aggregate_train(1, [_reply(sent[2], **GOOD_B), _reply(sent[1], **GOOD_A)])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1] and strategy.report.accepted == 2
