"""Every algorithm of issue 3 runs 2 rounds through the in-process engine (tiny MLP, 2 local
steps), writes drift and byte metrics; nonsense combinations are refused before round 1."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.codec.codec import spec_bytes
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from tests.support.run_outputs import metric_rows

NAMES = [f"{a}-{x}" for a in ("local", "fedpac", "fedmixp") for x in ("sophia", "muon", "soap")]
CASES = [(n, {}) for n in NAMES] + [
    ("fedpac-muon", {"light": True}), ("fedmixp-soap", {"light": True, "lambda-schedule": "c-sqrt-R"}),
    ("fedpac-soap", {"trust": "act"}),  # FedACT's trust modulation on SOAP
    ("fedpac-muon", {"trust": "cautious", "trust-on-muon": True}),
]
# the MLP's four arrays as they go over the wire (data and .npy headers)
MODEL_BYTES = spec_bytes({"0.w": ((64, 784), torch.float32), "0.b": ((64,), torch.float32),
                          "1.w": ((10, 64), torch.float32), "1.b": ((10,), torch.float32)})


@pytest.mark.slow  # an in-process run per variant; the fast subset keeps the unit checks
@pytest.mark.parametrize(("algorithm", "extra"), CASES, ids=[f"{a}{'+' if e else ''}{'+'.join(e)}"
                                                            for a, e in CASES])
def test_runs_two_rounds_with_drift_and_bytes(algorithm: str, extra: dict, tiny_data, tmp_path) -> None:
    base = dict(algorithm=algorithm, num_server_rounds=2, local_steps=2, batch_size=16, model="mlp",
                run_name="t",
                figures=False, results_dir=str(tmp_path / "out"), client_state_dir=str(tmp_path / "s"),
                data_dir=tiny_data["fashion-mnist"], accept_small_rounds=True)
    if algorithm.endswith("soap"):
        base["max_precond_dim"] = 100  # the MLP's 784-wide mode stays unrotated: a fast test
    if algorithm.endswith("muon"):
        base["muon_routing"] = "all-2d"  # the MLP has no hidden matrix: Muon takes both
    cfg = RunConfig.from_flower({**{k.replace("_", "-"): v for k, v in base.items()}, **extra})
    out = run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    rows = metric_rows(out)
    assert [r["replies-accepted"] for r in rows] == [2, 2], rows[-1]["rejected"]
    assert rows[-1]["test-accuracy"] > 0.1
    if algorithm.startswith("local"):
        assert rows[1]["bytes-down"] == 2 * MODEL_BYTES and "preconditioner-drift" not in rows[1]
    else:  # Θ^r (and g_G for FedPAC) go down in round 2; Θ_i comes up every round
        assert rows[1]["bytes-down"] > rows[0]["bytes-down"] == 2 * MODEL_BYTES
        assert rows[0]["bytes-up"] > 2 * MODEL_BYTES
        assert rows[1]["preconditioner-drift"] >= 0.0
        assert (rows[1]["theta-compression"] < 0.5) == bool(extra.get("light"))


def test_bad_second_order_config_values_raise() -> None:
    for algorithm, kw in (("fedmixp-soap", dict(mix_lambda=1.5)),
                          ("local-sophia", dict(hessian_interval=0)),
                          ("local-muon", dict(muon_routing="some")),
                          ("fedmixp-soap", dict(lambda_schedule="cosine")),
                          ("local-soap", dict(soap_beta2=1.0))):
        with pytest.raises(ValueError, match=str(next(iter(kw.values())))):
            RunConfig.of(algorithm=algorithm, **kw)
