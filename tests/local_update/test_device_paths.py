"""One round of every algorithm down the accelerator's branches, and on CUDA where there is one.

- On CPU (CI): one round of eight algorithms (one of each kind of local update; all 28 passed
  when this was written) with CPU tensors sent down the accelerator's branches
  (local_update/devices.py: the radix selection instead of the band, one digit kernel, no
  chunks) is bit for bit the round on the CPU's own branches: both selections are exact, so
  any logic error in a branch CUDA takes shows up here without a GPU.
- With a GPU: the same round with `device="cuda"` equals the CPU's to rounding (CUDA's kernels
  sum in other orders; a coordinate whose trust score ties the threshold to rounding may fall
  on the other side, so a few coordinates per million may move by one α-γ step), and torch's
  fused AdamW kernel, fed its step count as a device tensor and a negative lr as
  `adam_direction_` does, gives the eager formula on CUDA too.
`scripts/device_check.sh` runs this file on the GPU machine.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.local_update import devices
from adaptfl.local_update.rules import adam
from adaptfl.local_update.step import fused_adam
from adaptfl.server_app.loop import run_federated
from tests.conftest import FASHION_MNIST_DIR, TINY_FASHION_MNIST, _write_idx
from tests.support.run_outputs import final_model, metric_rows

ALGORITHMS = sorted(catalog())
# on CPU, one of each kind of local update (trust, correction, Θ, second order, plain): every
# algorithm's round measures PosRatio/TopMass, so each crosses both selections
ON_CPU = ["fedact", "fedact-local", "fedadamw", "fedavg", "fedmixp-soap", "fedpac-muon", "hafedho",
          "local-sophia"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def fashion_mnist(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Fashion-MNIST (conftest's sizes) cut from $ADAPTFL_FASHION_MNIST (the GPU
    machine's carried subset, set by scripts/device_check.sh) or the system's copy."""
    from adaptfl.workloads.idx import read_idx_file

    source = Path(os.environ.get("ADAPTFL_FASHION_MNIST", FASHION_MNIST_DIR))
    if not (source / "t10k-labels-idx1-ubyte.gz").is_file():
        pytest.skip(f"no Fashion-MNIST at {source} (apt-get install dataset-fashion-mnist)")
    out = tmp_path_factory.mktemp("fashion-mnist")
    for split, count in (("train", TINY_FASHION_MNIST[0]), ("t10k", TINY_FASHION_MNIST[1])):
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            _write_idx(out / f"{split}-{kind}.gz", read_idx_file(source / f"{split}-{kind}.gz")[:count])
    return str(out)


def _one_round(algorithm: str, data: str, out: str, device: str) -> tuple[dict, dict]:
    """mlp (D = 50,890: above the small-D sort, so the band / radix selections run), 2 clients
    x 3 local steps, PosRatio/TopMass on every step; (final model, round-1 metrics). fp32
    forward passes on both devices: `precision='auto'` would autocast CUDA's to bf16, which
    no fp32 tolerance can compare with the CPU's (the first GPU run showed 10-90% of the
    coordinates moved)."""
    extra = {"muon_routing": "all-2d"} if algorithm.endswith("muon") else \
        {"max_precond_dim": 100} if algorithm.endswith("soap") else {}
    cfg = RunConfig.of(algorithm=algorithm, num_server_rounds=1, local_steps=3, batch_size=16,
                       model="mlp", data_dir=data, figures=False, results_dir=out, run_name="r",
                       client_state_dir=f"{out}/state", partitioning="iid", diagnostics_every=1,
                       device=device, precision="fp32", accept_small_rounds=True, **extra)
    run_dir = run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    (row,) = metric_rows(run_dir)
    assert row["replies-accepted"] == 2, row["rejected"]
    return final_model(run_dir), row


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ON_CPU)
def test_accelerator_branches_on_cpu_give_the_cpu_round_bit_for_bit(
        algorithm: str, fashion_mnist: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = fashion_mnist
    ours, row = _one_round(algorithm, data, str(tmp_path / "cpu"), "cpu")
    monkeypatch.setattr(devices, "ACCELERATOR_PATHS_ON_CPU", True)
    theirs, their_row = _one_round(algorithm, data, str(tmp_path / "acc"), "cpu")
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    for key in ("train-loss", "pos-ratio", "top-mass"):
        assert row[key] == their_row[key], key


def _device_exact(algorithm: str) -> bool:
    """Whether a round's local steps are fp32 arithmetic that only rounds otherwise on CUDA.
    Not so, by design, for three rules (the first GPU run, 2026-12-04: 250 to 50,684 of 50,890
    coordinates moved): Muon's NS5 runs in bf16 (as torch.optim.Muon), whose matmuls accumulate
    otherwise on CUDA; SOAP's eigenbasis is arbitrary where its statistics are degenerate (three
    steps: rank <= 3 x batch), and Adam in that basis turns float noise there into unit steps;
    Sophia's Hessian estimate samples labels from the device's own generator."""
    rule = catalog()[algorithm].preconditioner.name
    return rule not in ("soap", "sophia") and not algorithm.endswith("muon")  # all-2d routing


@needs_cuda
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_round_on_cuda_equals_the_cpu_round(algorithm: str, fashion_mnist: str, tmp_path) -> None:
    data = fashion_mnist
    cpu, cpu_row = _one_round(algorithm, data, str(tmp_path / "cpu"), "cpu")
    gpu, gpu_row = _one_round(algorithm, data, str(tmp_path / "cuda"), "cuda")
    if not _device_exact(algorithm):  # the losses only: the same descent, another rounding
        for key in ("train-loss", "test-loss"):
            assert math.isclose(cpu_row[key], gpu_row[key], rel_tol=2e-2), key
        return
    moved = total = 0
    for name, tensor in cpu.items():
        other = gpu[name].cpu()
        assert other.dtype == tensor.dtype, name
        if not tensor.is_floating_point():
            assert torch.equal(other, tensor), name
            continue
        # float32 rounding of 3 steps' sums, relative to the entry or the step size (lr·α ≈ 1e-2)
        far = (other - tensor).abs() > 1e-5 * tensor.abs() + 1e-5
        moved, total = moved + int(far.sum()), total + tensor.numel()
    assert moved <= max(3, total // 10_000), f"{moved} of {total} coordinates differ"
    for key in ("train-loss", "test-loss"):
        assert math.isclose(cpu_row[key], gpu_row[key], rel_tol=1e-3), key


@needs_cuda
@pytest.mark.parametrize("mode", adam.BIAS_MODES)
def test_the_fused_kernel_takes_a_device_step_count_and_a_negative_lr(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(3)
    n = 50_000
    grads = [torch.randn(n, generator=gen) * 10.0 ** -(i % 3) for i in range(4)]
    addend = 1e-3 * torch.randn(n, generator=gen)
    results = {}
    for eager, device in ((True, "cpu"), (False, "cuda")):
        monkeypatch.setattr(fused_adam, "EAGER", eager)
        m, v = torch.zeros(n, device=device), torch.zeros(n, device=device)
        for k, g in enumerate(grads, start=1):
            n_m, n_v = adam.bias_steps(mode, k, 40 + k)
            d, scale, _ = fused_adam.adam_direction_(m, v, g.to(device), 0.9, 0.999, 1e-8, n_m, n_v,
                                            out=torch.empty(n, device=device), mix=0.5,
                                            addend=addend.to(device))
        results[device] = (d * scale).cpu(), m.cpu(), v.cpu()
    (u_ref, m_ref, v_ref), (u, m, v) = results["cpu"], results["cuda"]
    # a few ulps of the terms summed, not of the result: the fused kernel's lerp
    # m + (1-β)(g-m) rounds otherwise than β·m + (1-β)·g, and m cancels to near 0 where g
    # changes sign (the first GPU run: relative errors far above 8 ulps on such entries)
    m_terms = torch.zeros(n, dtype=torch.float64)
    for g in grads:
        m_terms = 0.9 * m_terms + 0.1 * g.double().abs()
    eps32 = torch.finfo(torch.float32).eps  # a few ulps: CUDA's sqrt/div round on their own
    # and the CUDA kernel forms 1-β (and β^k) in float32, the eager pass in double: 1-0.999f is
    # 1.3e-5 off 0.001, far above 8 ulps of v (the first GPU run failed v's check on it)
    r1, r2 = _coefficient_rounding(0.9), _coefficient_rounding(0.999)
    assert float(((m - m_ref).abs().double() / m_terms.clamp(min=1e-30)).max()) < 8 * eps32 + r1
    assert torch.allclose(v, v_ref, rtol=8 * eps32 + r2, atol=0)  # v's terms are all >= 0
    # u: those, and the bias corrections 1-β^n of the last step from float32 β
    bias = _coefficient_rounding(0.9, n_m) + _coefficient_rounding(0.999, n_v) / 2
    terms = addend.abs() + (u_ref - addend).abs()
    assert float(((u - u_ref).abs() / terms.clamp(min=1e-30)).max()) < 16 * eps32 + r1 + r2 / 2 + bias


def _coefficient_rounding(beta: float, power: int = 1) -> float:
    """Relative error of 1-β^power when β is rounded to float32 first, as torch's fused CUDA
    kernel takes its betas (0 where the power is 0: no bias correction)."""
    if power == 0:
        return 0.0
    exact, rounded = 1 - beta**power, 1 - float(torch.tensor(beta, dtype=torch.float32)) ** power
    return abs(rounded - exact) / exact
