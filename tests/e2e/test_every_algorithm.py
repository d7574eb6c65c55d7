"""Every algorithm of the catalog, end to end on small real data (marked slow: ~1 minute):

- runs 2 rounds on an image task (Fashion-MNIST) and on a text task (fortunes), every reply
  accepted;
- its wire contract is tight: every record it declares goes down by round 2, and perturbing
  any one of them changes what the client sends back (so no record is sent and ignored);
- a client refuses a record its algorithm does not consume, in one line.
"""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.codec.versions import record_version
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run, run_federated
from tests.support.run_outputs import metric_rows

pytestmark = pytest.mark.slow
ALGORITHMS = sorted(catalog())
TASKS = {"fashion-mnist": "mlp", "fortunes": "llama-tiny"}


def _config(algorithm: str, task: str, tiny_data: dict[str, str], tmp_path, **kw) -> RunConfig:
    extra = {"muon_routing": "all-2d"} if algorithm.endswith("muon") else \
        {"max_precond_dim": 100} if algorithm.endswith("soap") else {}
    if algorithm == "mimelite" and task == "fortunes":  # ∇f_i(x) on a seeded sample of 64 windows,
        extra["mime_grad_examples"] = 64  # not the whole partition (Fashion-MNIST keeps that path)
    return RunConfig.of(algorithm=algorithm, num_server_rounds=2, local_steps=2, batch_size=8,
                        task=task, model=TASKS[task], data_dir=tiny_data[task], run_name="t",
                        results_dir=str(tmp_path / "out"), client_state_dir=str(tmp_path / "state"),
                        partitioning="iid", accept_small_rounds=True, figures=False, **{**extra, **kw})


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_runs_two_rounds(algorithm: str, task: str, tiny_data, tmp_path) -> None:
    cfg = _config(algorithm, task, tiny_data, tmp_path)
    rows = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))
    assert [r["replies-accepted"] for r in rows] == [2, 2], rows[-1]["rejected"]
    assert all(math.isfinite(r["test-loss"]) and math.isfinite(r["train-loss"]) for r in rows)
    assert 0.0 <= rows[-1]["pos-ratio"] <= 1.0  # diagnostics are real for every algorithm


# every record a catalog algorithm shares through a lossy codec both ways, error feedback on the
# replies: one algorithm per record (v and v̄, c and Δc, Θ, Θ_i and g_G, g, f̂ and |D|, m and
# ∇f_i(x), DiLoCo's kept inner state, FedDyn's server h, a server optimizer's v)
CODECS = {"codec": "int8", "codec_delta": "top10%:nf4+ef"}
SHARING = ["fedact", "scaffold", "fedpac-muon", "fedmixp-sophia", "fedpac-soap", "hafedho", "mimelite",
           "diloco", "feddyn", "fedadam"]
PSD = ("fedpac-soap", "fedmixp-soap")  # they share SOAP's statistics in Θ: fp32 (refused else)


def test_the_compressed_set_covers_every_shared_record() -> None:
    """The list above holds an algorithm for every record the catalog shares."""
    shared = set().union(*(catalog()[a].shared_records() for a in ALGORITHMS))
    assert set().union(*(catalog()[a].shared_records() for a in SHARING)) == shared


@pytest.mark.parametrize("algorithm", SHARING)
def test_runs_two_rounds_with_every_record_compressed(algorithm: str, tiny_data, tmp_path) -> None:
    keep = {"codec_theta": "fp32", "codec_theta_i": "fp32"} if algorithm in PSD else {}
    cfg = _config(algorithm, "fashion-mnist", tiny_data, tmp_path, **CODECS, **keep)
    rows = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))
    assert [r["replies-accepted"] for r in rows] == [2, 2], rows[-1]["rejected"]
    assert all(math.isfinite(r["test-loss"]) for r in rows)
    assert rows[-1]["compression-ratio"] > 1.5, rows[-1]["bytes"]
    assert rows[-1]["bytes"]["up"][wire.DELTA] < rows[-1]["bytes"]["down"][wire.ARRAYS] / 4


def _client_reply(msg: Message, node_config: dict, state_dir: str) -> RecordDict:
    """One client's reply to `msg`, in a fresh process-like context (durable state on disk)."""
    context = Context(run_id=1, node_id=1, node_config=dict(node_config), state=RecordDict(), run_config={})
    reply = train_or_refuse(msg, context)
    assert not reply.has_error(), reply.error.reason
    return reply.content


def _perturbed(record: ArrayRecord) -> ArrayRecord:
    tensors = record.to_torch_state_dict()
    return ArrayRecord({k: v * 1.5 + 0.25 if v.is_floating_point() else v for k, v in tensors.items()})


def _differs(a: RecordDict, b: RecordDict) -> bool:
    for name in a.array_records:
        x, y = a.array_records[name].to_torch_state_dict(), b.array_records[name].to_torch_state_dict()
        if any(not torch.equal(x[k], y[k]) for k in x):
            return True
    return dict(a.metric_records[wire.METRICS]) != dict(b.metric_records[wire.METRICS])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_record_sent_down_changes_the_clients_reply(algorithm: str, tiny_data, tmp_path) -> None:
    cfg = _config(algorithm, "fashion-mnist", tiny_data, tmp_path)
    grid = InProcessGrid(2, cfg.to_flower())
    strategy, _, _ = build_run(cfg)
    for server_round in (1, 2):
        messages = list(strategy.configure_train(server_round, ArrayRecord(strategy.state.model),
                                                 ConfigRecord(), grid))
        if server_round == 1:
            strategy.aggregate_train(1, list(grid.send_and_receive(messages)))
    msg = messages[0]
    sent = set(msg.content.array_records) - {wire.ARRAYS}
    assert sent == set(strategy.contract().down)  # by round 2 every declared record goes down
    node_config = grid.contexts[msg.metadata.dst_node_id].node_config
    reference = _client_reply(msg, node_config, str(tmp_path))
    assert not _differs(reference, _client_reply(msg, node_config, str(tmp_path)))  # deterministic
    for name in sorted(sent):
        content = RecordDict(dict(msg.content.items()))
        content[name] = _perturbed(msg.content.array_records[name])
        versions = msg.content.config_records.get(wire.VERSIONS)
        if versions is not None and name in versions:  # the instruction names what it sends
            content[wire.VERSIONS] = ConfigRecord({**dict(versions), name: record_version(content[name])})
        changed = Message(content=content, dst_node_id=msg.metadata.dst_node_id,
                          message_type=msg.metadata.message_type)
        assert _differs(reference, _client_reply(changed, node_config, str(tmp_path))), \
            f"{algorithm}: record {name!r} goes down but changes nothing the client sends back"


@pytest.mark.parametrize("extra", ["array", "config", "metrics"])
def test_a_record_the_algorithm_does_not_consume_is_refused(extra: str, tiny_data, tmp_path) -> None:
    cfg = _config("fedavg", "fashion-mnist", tiny_data, tmp_path)
    grid = InProcessGrid(1, cfg.to_flower())
    strategy, _, _ = build_run(cfg)
    (msg,) = strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    name, record = {"array": (wire.DELTA_G, ArrayRecord({"x": torch.zeros(1)})),
                    "config": ("lr-override", ConfigRecord({"lr": 0.5})),
                    "metrics": ("server-metrics", MetricRecord({"round-loss": 1.0}))}[extra]
    msg.content[name] = record
    reply = train_or_refuse(msg, grid.contexts[1])
    assert reply.has_error()
    assert f"[{name!r}]" in reply.error.reason and "fedavg" in reply.error.reason
    assert "\n" not in reply.error.reason
