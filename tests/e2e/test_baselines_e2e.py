"""Every algorithm of issue 4 runs end to end through the in-process engine (2 small rounds),
with its extra records on the wire counted in bytes down / up."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.codec.codec import array_bytes, spec_bytes
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import metric_rows

SMALL = dict(num_server_rounds=2, local_steps=3, batch_size=16, model="mlp", run_name="t")
MLP_PARAMS = 784 * 64 + 64 + 64 * 10 + 10  # floats in the tiny MLP
MODEL_BYTES = 4 * MLP_PARAMS
# the model as it goes over the wire: its four arrays with their .npy headers
MODEL_WIRE = spec_bytes({"0.w": ((64, 784), torch.float32), "0.b": ((64,), torch.float32),
                         "1.w": ((10, 64), torch.float32), "1.b": ((10,), torch.float32)})
NODES = 3

# algorithm -> (extra payloads down in round 2, extra payloads up per reply), in model sizes.
# HaFedHo also sends f̂ (4 bytes) down; SCAFFOLD's c and MimeLite's m / ∇f_i(x) are parameter-sized.
WIRE = {
    "fedavgm": (0, 0), "fedadam": (0, 0), "fedyogi": (0, 0), "fedadagrad": (0, 0),
    "fedadamom": (0, 0), "fedprox": (0, 0), "moon": (0, 0), "feddyn": (0, 0),
    "hafedho": (1, 0), "scaffold": (1, 1), "mimelite": (1, 1), "fedcm": (1, 0),
    "fedlada": (2, 1),
}

pytestmark = pytest.mark.slow  # the every-algorithm matrix covers the quick version

@needs_fashion_mnist
@pytest.mark.parametrize("algorithm", sorted(WIRE))
def test_runs_two_rounds_and_accounts_its_bytes(algorithm: str, tmp_path) -> None:
    cfg = RunConfig.of(algorithm=algorithm, figures=False, results_dir=str(tmp_path / "out"),
                    client_state_dir=str(tmp_path / "state"), **SMALL)
    out = run_federated(InProcessGrid(NODES, cfg.to_flower()), cfg)
    rows = metric_rows(out)
    assert [r["replies-accepted"] for r in rows] == [NODES, NODES], rows[-1]["rejected"]
    assert rows[-1]["test-accuracy"] > 0.15  # learnt something in 6 steps per client
    down, up = WIRE[algorithm]
    # HaFedHo also sends f̂ (one float32) and |D| = n-total (one float64: counts above 2^24 exact)
    extra_down = array_bytes((1,), torch.float32) + array_bytes((1,), torch.float64) \
        if algorithm == "hafedho" else 0
    assert rows[1]["bytes-down"] == NODES * ((1 + down) * MODEL_WIRE + extra_down)  # wire bytes
    # Up is counted as serialised (a ~128-byte header per tensor, 4 tensors per record).
    per_reply = rows[1]["bytes-up"] / NODES
    assert (1 + up) * MODEL_BYTES <= per_reply <= (1 + up) * (MODEL_BYTES + 4 * 160)
