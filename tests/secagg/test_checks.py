"""What SecAgg+ refuses before round 1 (one line naming the setting and what to use), what it
composes with, and the nodes' own refusals of a plain instruction."""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import SECURE
from adaptfl.client_app.app import handle
from adaptfl.core import wire
from adaptfl.core.secagg_settings import SecAgg, clip_key
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies.fedavg import FedAvg
from tests.support.counting_grid import counting_grid

OK = dict(secagg="secagg+", weighting="uniform", screen_ratio=0, max_contribution_ratio=0)


@pytest.mark.parametrize(("setting", "says"), [
    ({"aggregator": "median"}, "aggregator='median'"),
    ({"screen_ratio": 5}, "screen-ratio=5"),
    ({"max_weight_share": 0.5}, "max-weight-share=0.5"),
    ({"max_contribution_ratio": 3}, "max-contribution-ratio=3"),
    ({"hostile_fraction": 0.2, "aggregator": "mean"}, "hostile-fraction=0.2"),
    ({"dp": "central"}, "dp='central'"),
    ({"codec_delta": "int8"}, "lossy codec 'int8' on 'delta'"),
])
def test_what_needs_one_reply_alone_is_refused_in_one_line(setting: dict, says: str) -> None:
    with pytest.raises(ValueError, match="secagg='secagg\\+'") as err:
        RunConfig.of(**{**OK, **setting})
    assert says in str(err.value) and "\n" not in str(err.value)


def test_secagg_alone_runs_with_the_defaults_that_read_one_reply_switched_off(caplog) -> None:  # noqa: ANN001
    """`secagg='secagg+'` alone: the screen, the contribution bound and weighting by examples
    (defaults that read each reply) give way, in one log line; a value of the user's (not the
    default) is still refused, both screens named together."""
    with caplog.at_level("INFO", logger="adaptfl.algorithms.secagg_checks"):
        fed = RunConfig.of(secagg="secagg+").federation
    assert (fed.screen_ratio, fed.max_contribution_ratio, fed.weighting) == (0.0, 0.0, "uniform")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["secagg='secagg+': screen-ratio=0.0, max-contribution-ratio=0.0, weighting='uniform' "
                     "(the server holds only the sum, so nothing can read one reply)"], lines
    with pytest.raises(ValueError, match="secagg") as err:
        RunConfig.of(secagg="secagg+", screen_ratio=5, max_contribution_ratio=3)
    line = str(err.value)
    assert "screen-ratio=5, max-contribution-ratio=3: they read" in line, line
    assert "use screen-ratio=0 max-contribution-ratio=0" in line and "\n" not in line, line


@pytest.mark.parametrize("static", [True, False])
def test_fewer_than_three_nodes_are_refused_before_round_1(tmp_path, tiny_data, static: bool) -> None:  # noqa: ANN001
    """With the nodes known (the engine), or at round 1 under Flower, before anything is sent."""
    from adaptfl.server_app.loop import run_federated

    cfg = RunConfig.of(secagg="secagg+", model="mlp", num_server_rounds=1, local_steps=1, batch_size=8,
                       data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), run_name="t")
    grid, calls = counting_grid(2, cfg, static)
    with pytest.raises(ValueError, match=r"secagg='secagg\+' with 2 of 2 nodes a round: a secure sum "
                                         "needs 3 or more"):
        run_federated(grid, cfg)
    assert calls == []


def test_what_composes_is_accepted() -> None:
    RunConfig.of(**OK, algorithm="fedact", server_opt="adam")
    RunConfig.of(**OK, algorithm="scaffold", codec_c="int8")  # broadcast codecs
    RunConfig.of(**{**OK, "screen_ratio": 10, "max_contribution_ratio": 3}, dp="client",
                 num_server_rounds=2)  # dp: both off


@pytest.mark.parametrize(("values", "says"), [
    ({"secagg_clip_v": 0.1}, "secagg-clip-v with secagg='none'"),
    ({"secagg_liars": 1}, "secagg-liars=1 with secagg='none'"),
    ({**OK, "secagg_liars": 0}, "secagg-liars"),
    ({**OK, "algorithm": "fedavg", "secagg_clip_v": 0.1},
     "secagg-clip-v: algorithm 'fedavg' shares no such record"),
    ({**OK, "dp": "client", "algorithm": "fedact", "secagg_clip_v": 0.1}, "under dp each record's range"),
    ({**OK, "secagg_threshold": 0.5}, "secagg-threshold"),
])
def test_per_record_ranges_must_be_read(values: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        RunConfig.of(**values)


def test_a_range_per_record_is_declared_for_every_reply_record() -> None:
    keys = {f.name for f in SecAgg.__dataclass_fields__.values()}
    assert {clip_key(r).replace("-", "_") for r in wire.SHARED_UP} <= keys
    cfg = RunConfig.of(**OK, algorithm="fedact", secagg_clip_v=0.01)
    assert cfg.secagg.clip_of(wire.V_LOCAL) == 0.01 and cfg.secagg.clip_of(wire.DELTA) == 8.0


def test_the_round_shares_and_threshold() -> None:
    secagg = RunConfig.of(**OK).secagg
    assert secagg.round_shares(100) == (11, 8) and secagg.round_shares(5) == (5, 4)


def test_flowers_own_start_refuses_secagg() -> None:
    strategy = FedAvg(**OK)
    with pytest.raises(ValueError, match="secagg .*round loop"):
        strategy.refuse_loop_only_settings()


def _plain(recipe: dict, node_config: dict) -> tuple[Message, Context]:
    InProcessGrid(1, {})  # a Message needs Flower's task identity, which the grid sets
    msg = Message(RecordDict({wire.RECIPE: ConfigRecord(recipe), wire.ARRAYS: ArrayRecord()}),
                  dst_node_id=1, message_type="train")
    return msg, Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={})


@pytest.mark.parametrize(("recipe", "node_config"), [({SECURE: True}, {}),
                                                     ({}, {wire.NODE_SECAGG_REQUIRED: "true"})])
def test_a_node_refuses_a_plain_instruction_where_secagg_is_due(recipe: dict, node_config: dict) -> None:
    """A server that sends a SecAgg+ run's recipe, or asks a node that requires SecAgg+, for a
    plain reply would get the update in the clear: the node refuses before training."""
    msg, context = _plain(recipe, node_config)
    with pytest.raises(ValueError, match="only inside SecAgg\\+"):
        handle(msg, context)
