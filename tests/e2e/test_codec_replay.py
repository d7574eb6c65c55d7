"""Stochastic rounding on the wire is seeded (the run seed, the round, the sender, the record):
a run replays bit for bit, and its rounding is not nearest's (the key is read)."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from tests.support.run_outputs import final_model

pytestmark = pytest.mark.slow  # three 2-round engine runs (~10 s)


def _run(tmp_path, name: str, **kw) -> dict[str, torch.Tensor]:  # noqa: ANN001
    cfg = RunConfig.of(algorithm="fedact", num_server_rounds=2, local_steps=2, batch_size=8,
                       model="mlp", partitioning="iid", codec="nf4", codec_delta="top10%:fp4+ef",
                       run_name=name, figures=False, results_dir=str(tmp_path / "out"),
                       client_state_dir=str(tmp_path / f"state-{name}"), accept_small_rounds=True, **kw)
    return final_model(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))


def test_stochastic_rounding_replays_and_is_not_nearest(tiny_data, tmp_path) -> None:
    data = {"data_dir": tiny_data["fashion-mnist"]}
    first = _run(tmp_path, "a", codec_rounding="stochastic", **data)
    again = _run(tmp_path, "b", codec_rounding="stochastic", **data)
    nearest = _run(tmp_path, "c", **data)
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert any(not torch.equal(first[n], nearest[n]) for n in first)
