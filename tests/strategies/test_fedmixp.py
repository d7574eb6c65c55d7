"""FedMIX-P's mixing on the client (spec §4): λ=1 is FedPAC's alignment without correction;
λ=0 applies the frozen reference for the whole round (hand-checked on tiny tensors). The
optimizers are built from the run config exactly as a client builds them from the recipe."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.session import build_optimizer
from adaptfl.local_update import LocalUpdate
from tests.local_update.test_local_update import _max_diff, _mlp, _train


def _client_optimizer(model: nn.Module, server_round: int = 3, **kw) -> LocalUpdate:
    cfg = RunConfig.of(muon_routing="all-2d" if kw["algorithm"].endswith("muon") else "preset", **kw)
    return build_optimizer(model, cfg.algorithm, cfg.round_info(server_round))


@pytest.mark.parametrize("x", ["sophia", "muon", "soap"])
def test_lambda_one_equals_fedpac_alignment_without_correction(x: str) -> None:
    extra = {"sophia": dict(hessian_interval=2), "soap": dict(precondition_frequency=2), "muon": {}}[x]
    base = _mlp()
    warm = LocalUpdate(base.named_parameters(), preconditioner=x, lr=0.01,
                       **({"muon_routing": "all-2d"} if x == "muon" else {}))
    _train(base, warm, 4)
    theta = warm.export_theta()

    def run(algorithm: str, **kw) -> nn.Module:
        model = copy.deepcopy(base)
        opt = _client_optimizer(model, algorithm=algorithm, lr=0.01, lr_schedule="constant", **extra, **kw)
        opt.import_theta(theta, keep_reference=opt.mix_lambda < 1.0)
        _train(model, opt, 5, start=4)
        return model

    mixed_one = run(f"fedmixp-{x}", mix_lambda=1.0)
    assert _max_diff(mixed_one, run(f"fedpac-{x}", fedpac_beta=0.0)) == 0.0
    # and mixing does change the trajectory (the test can fail): λ = 0.5
    assert _max_diff(mixed_one, run(f"fedmixp-{x}", mix_lambda=0.5)) > 0.0


class Tiny(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(shape))


def _step(model: Tiny, opt: LocalUpdate, g: torch.Tensor, g_hat: torch.Tensor | None = None) -> None:
    model.w.grad = g.clone()
    opt.step(g_hat=None if g_hat is None else {"w": g_hat})


def test_lambda_zero_sophia_divides_by_the_frozen_reference_h() -> None:
    model = Tiny((3,))
    h_ref = torch.tensor([1.0, 2.0, 4.0])
    opt = LocalUpdate(model.named_parameters(), preconditioner="sophia", lr=1.0, sophia_beta1=0.5,
                      sophia_beta2=0.5, sophia_rho=0.5, weight_decay=0.0, mix_lambda=0.0,
                      hessian_interval=1)
    opt.import_theta({"w/hessian": h_ref}, keep_reference=True)
    opt.bs = 1
    g = torch.tensor([0.1, -0.2, 0.3])
    _step(model, opt, g, g_hat=torch.tensor([10.0, 10.0, 10.0]))  # own h jumps to (h_ref+100)/2
    # m = 0.5·g = [0.05, -0.1, 0.15]; d = m / (ρ·bs·h_ref) = m / [0.5, 1, 2]
    torch.testing.assert_close(model.w.detach(), -torch.tensor([0.1, -0.1, 0.075]))
    assert torch.equal(opt.state[model.w]["hessian"], 0.5 * h_ref + 50.0)  # P_i updated after use
    _step(model, opt, g)
    # m = 0.5·m + 0.5·g = [0.075, -0.15, 0.225]; still divided by h_ref, not by the own h
    torch.testing.assert_close(model.w.detach(), -torch.tensor([0.1, -0.1, 0.075])
                               - torch.tensor([0.15, -0.15, 0.1125]))


def test_lambda_zero_muon_blends_the_frozen_reference_momentum() -> None:
    model = Tiny((2, 3))
    m_ref = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    opt = LocalUpdate(model.named_parameters(), preconditioner="muon", lr=1.0, muon_momentum=0.5,
                      weight_decay=0.0, mix_lambda=0.0, muon_routing="all-2d")
    opt.import_theta({"w/momentum_buffer": m_ref}, keep_reference=True)
    g = torch.tensor([[0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    _step(model, opt, g)
    # U = 0.5·g + 0.5·M^r = [[.5, 0, 1.5], [0, 1, 0]]: orthogonal rows, so NS5 ≈ row-normalised
    # (singular values pushed to ~[0.7, 1.2]); the own momentum 0.5·M^r + 0.5·g is not used.
    oracle = torch.optim._muon._zeropower_via_newtonschulz(
        torch.tensor([[0.5, 0.0, 1.5], [0.0, 1.0, 0.0]]), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    # the same bf16 calls as torch's on the same input; a GEMM that accumulates in another order
    # (AMX, GPUs) may still round an entry of O one bf16 ulp apart: |O| <= ~1.5
    torch.testing.assert_close(model.w.detach(), -oracle.float(), rtol=0,
                               atol=1.5 * torch.finfo(torch.bfloat16).eps)
    assert torch.equal(opt.state[model.w]["momentum_buffer"], 0.5 * m_ref + 0.5 * g)
    w = model.w.detach()
    assert w[0, 1] == 0 and w[1, 0] == 0 and w[1, 2] == 0  # the zero pattern of U survives


def test_lambda_zero_soap_keeps_the_reference_eigenbasis_for_the_whole_round() -> None:
    """Diagonal reference factors: the eigenbasis is a signed permutation, so SOAP in it is
    plain elementwise Adam; the client's own (non-diagonal) statistics must not leak in."""
    model = Tiny((2, 2))
    ref = {"w/gg0": torch.diag(torch.tensor([4.0, 1.0])), "w/gg1": torch.diag(torch.tensor([1.0, 9.0]))}
    opt = LocalUpdate(model.named_parameters(), preconditioner="soap", lr=0.1, soap_beta1=0.5,
                      soap_beta2=0.5, eps=1e-8, weight_decay=0.0, mix_lambda=0.0, precondition_frequency=2)
    opt.import_theta(ref, keep_reference=True)
    m, v, x = torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2)
    for k in range(1, 6):
        g = torch.tensor([[1.0, 2.0], [2.0, 1.0]]) * k  # correlated rows: own gg is not diagonal
        _step(model, opt, g)
        m, v = 0.5 * m + 0.5 * g, 0.5 * v + 0.5 * g * g
        x = x - 0.1 * ((1 - 0.5**k) ** 0.5 / (1 - 0.5**k)) * m / (v.sqrt() + 1e-8)
        torch.testing.assert_close(model.w.detach(), x)
    assert float(opt.state[model.w]["gg0"][0, 1].abs()) > 0.1  # own L updated (after use)


def test_lambda_schedules() -> None:
    def lam(value: float, schedule: str, server_round: int) -> float:
        cfg = RunConfig.of(algorithm="fedmixp-soap", mix_lambda=value, lambda_schedule=schedule,
                           num_server_rounds=16)
        return cfg.algorithm.sharing.round_lambda(cfg.round_info(server_round))

    assert lam(0.5, "constant", 9) == 0.5
    assert lam(0.8, "lambda0-sqrt-r", 4) == pytest.approx(0.4)
    assert lam(1.0, "c-sqrt-R", 1) == pytest.approx(0.25)
    assert lam(0.9, "lambda0-sqrt-r", 1) == 0.9
    fedpac = RunConfig.of(algorithm="fedpac-soap")
    assert fedpac.algorithm.sharing.round_lambda(fedpac.round_info(1)) == 1.0  # no mixing
