"""SecAgg+ in whole in-process runs (tiny Fashion-MNIST, mlp, 3 nodes): for one algorithm per
shared record the server's state after a round equals the plain run's within the fixed point's
step (c/B per value, scaled as the state scales the mean); a stateful SecAgg+ run killed and
resumed equals one that was not; dp='client' accounts the discrete noise; what the row counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.secagg import fixedpoint
from adaptfl.server_app.loop import run_federated
from adaptfl.strategies.state import ServerState
from tests.support.run_outputs import assert_same_model, die_before_checkpoint, final_model, metric_rows

pytestmark = pytest.mark.slow
NODES = 3
LOCAL_STEPS = 2


def _cfg(tiny_data, tmp_path: Path, **kw) -> RunConfig:  # noqa: ANN001
    values = dict(model="mlp", num_server_rounds=1, local_steps=LOCAL_STEPS, batch_size=16,
                  data_dir=tiny_data["fashion-mnist"],
                  figures=False, results_dir=str(tmp_path), weighting="uniform",
                  screen_ratio=0, max_contribution_ratio=0,
                  client_state_dir=str(tmp_path / "state"))
    return RunConfig.of(**{**values, **kw})


def _state(cfg: RunConfig, name: str) -> ServerState:
    run = cfg.replace(run_name=name)
    return ServerState.load(run_federated(InProcessGrid(NODES, run.to_flower()), run) / "state.pt")


# one algorithm per shared record (Δ, v, Δc, Θ_i (Sophia's and an empty one: Muon routing
# nothing on the mlp), ∇f_i(x), HaFedHo's f̂_i): the state records that are means of them
FAMILIES = {"fedavg": [], "fedact": ["v-bar"], "scaffold": ["c"], "fedpac-sophia": ["theta"],
            "fedpac-muon": [], "mimelite": ["m"], "hafedho": ["f-hat"]}


@pytest.mark.parametrize("algorithm", sorted(FAMILIES))
def test_the_state_after_a_secure_round_is_the_plain_one_within_the_step(tiny_data, tmp_path,
                                                                         algorithm: str) -> None:
    cfg = _cfg(tiny_data, tmp_path, algorithm=algorithm)
    plain, secure = _state(cfg, "plain"), _state(cfg.replace(secagg="secagg+"), "secure")
    step = cfg.secagg.secagg_clip / fixedpoint.budget(32, NODES)  # c/B: the mean's largest error
    for name, t in plain.model.items():  # x + mean Δ (the server optimizer's lr is 1 here)
        assert (t - secure.model[name]).abs().max() <= step + 1e-7, name
    for record in FAMILIES[algorithm]:
        for name, t in plain.extras[record].items():
            gap = (t.double() - secure.extras[record][name].double()).abs().max()
            assert gap <= step + 1e-6 * float(t.abs().max()), (record, name, float(gap))
    assert secure.model.keys() == plain.model.keys()
    differs = any(not torch.equal(t, secure.model[n]) for n, t in plain.model.items())
    assert differs  # the sum went through fixed point, not around it


def test_a_killed_and_resumed_secure_run_equals_an_uninterrupted_one(tiny_data, tmp_path,
                                                                     monkeypatch) -> None:
    cfg = _cfg(tiny_data, tmp_path, algorithm="fedact", num_server_rounds=3, secagg="secagg+")
    whole = cfg.replace(run_name="whole")
    expected = final_model(run_federated(InProcessGrid(NODES, whole.to_flower()), whole))
    cut = cfg.replace(run_name="cut")
    with monkeypatch.context() as m:
        die_before_checkpoint(m, 2)
        with pytest.raises(KeyboardInterrupt):
            run_federated(InProcessGrid(NODES, cut.to_flower()), cut)
    out = run_federated(InProcessGrid(NODES, cut.to_flower()), cut.replace(resume=True))
    assert [r["round"] for r in metric_rows(out)] == [1, 2, 3]
    assert_same_model(final_model(out), expected)


def test_the_row_counts_the_masked_bytes_and_no_reply_is_dropped(tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_data, tmp_path, algorithm="fedact", secagg="secagg+", run_name="bytes")
    row = metric_rows(run_federated(InProcessGrid(NODES, cfg.to_flower()), cfg))[0]
    values = sum(t.numel() for t in final_model(tmp_path / "bytes").values())
    assert row["rejected"] == {} and not row["skipped"]
    # each node's y: Δ and v, 4 bytes a value, plus keys and shares; no plain Δ goes up
    assert NODES * 2 * values * 4 <= row["bytes-up"] <= 1.1 * NODES * 2 * values * 4 + 200_000
    assert set(row["bytes"]["up"]) == {"secagg+"}


def test_dp_client_under_secagg_accounts_the_whole_discrete_noise(tiny_data, tmp_path) -> None:
    import json

    cfg = _cfg(tiny_data, tmp_path, algorithm="fedavg", secagg="secagg+", dp="client", run_name="dp",
               min_replies=NODES, dp_accept_epsilon=1e3)  # booked at min-replies of the n shares: all
    out = run_federated(InProcessGrid(NODES, cfg.to_flower()), cfg)
    row = json.loads((out / "server-confidential.jsonl").read_text().splitlines()[-1])
    # the nodes' noise covers the rounding's reach (B + √d per record), so z is booked as it is
    assert row["dp-noise-multiplier"] == pytest.approx(cfg.privacy.dp_noise_multiplier, rel=1e-12)
    assert row["rejected"] == {}
