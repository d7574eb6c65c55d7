"""FedMIX-P's mixing on the client (spec §4): λ=1 is FedPAC's alignment without correction;
λ=0 applies the frozen reference for the whole round (hand-checked on tiny tensors)."""

from __future__ import annotations

import copy

import pytest
import torch
from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import recipe_for_round, round_lambda
from adaptfl.client_app.second_order import second_order_config
from adaptfl.local_update.second_order import SecondOrderConfig, SecondOrderUpdate
from torch import nn

from tests.test_second_order import _max_diff, _mlp, _train


@pytest.mark.parametrize("x", ["sophia", "muon", "soap"])
def test_lambda_one_equals_fedpac_alignment_without_correction(x: str) -> None:
    mixp = second_order_config(recipe_for_round(RunConfig(algorithm=f"fedmixp-{x}", mix_lambda=1.0), 3))
    pac = second_order_config(recipe_for_round(RunConfig(algorithm=f"fedpac-{x}", fedpac_beta=0.0), 3))
    assert mixp == pac and mixp.lam == 1.0 and pac.rho == 0.0
    base = _mlp()
    warm = SecondOrderUpdate(base.named_parameters(), SecondOrderConfig(x, lr=0.01, routing="all-2d"))
    _train(base, warm, 4)
    theta = warm.export_theta()
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    cfg = SecondOrderConfig(x, lr=0.01, routing="all-2d", lam=1.0, hessian_interval=2,
                            precondition_frequency=2)
    _train(a, SecondOrderUpdate(a.named_parameters(), cfg, reference=theta), 5, start=4)
    pac_opt = SecondOrderUpdate(b.named_parameters(), cfg)  # FedPAC: plain warm start Θ_i <- Θ^r
    pac_opt.import_theta(theta)
    _train(b, pac_opt, 5, start=4)
    assert _max_diff(a, b) == 0.0
    # and mixing does change the trajectory (the test can fail): λ = 0.5
    c = copy.deepcopy(base)
    half = SecondOrderConfig(x, lr=0.01, routing="all-2d", lam=0.5, hessian_interval=2,
                             precondition_frequency=2)  # SOAP: mix enters at the refresh
    _train(c, SecondOrderUpdate(c.named_parameters(), half, reference=theta), 5, start=4)
    assert _max_diff(a, c) > 0.0


class Tiny(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(shape))


def _step(model: Tiny, opt: SecondOrderUpdate, g: torch.Tensor, g_hat: torch.Tensor | None = None) -> None:
    model.w.grad = g.clone()
    opt.step(g_hat=None if g_hat is None else {"w": g_hat})


def test_lambda_zero_sophia_divides_by_the_frozen_reference_h() -> None:
    model = Tiny((3,))
    h_ref = torch.tensor([1.0, 2.0, 4.0])
    cfg = SecondOrderConfig("sophia", lr=1.0, beta1=0.5, beta2=0.5, sophia_rho=0.5, weight_decay=0.0,
                            lam=0.0, hessian_interval=1)
    opt = SecondOrderUpdate(model.named_parameters(), cfg, reference={"w/hessian": h_ref})
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
    cfg = SecondOrderConfig("muon", lr=1.0, beta1=0.5, weight_decay=0.0, lam=0.0, routing="all-2d")
    opt = SecondOrderUpdate(model.named_parameters(), cfg, reference={"w/momentum_buffer": m_ref})
    g = torch.tensor([[0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    _step(model, opt, g)
    # U = 0.5·g + 0.5·M^r = [[.5, 0, 1.5], [0, 1, 0]]: orthogonal rows, so NS5 ≈ row-normalised
    # (singular values pushed to ~[0.7, 1.2]); the own momentum 0.5·M^r + 0.5·g is not used.
    oracle = torch.optim._muon._zeropower_via_newtonschulz(
        torch.tensor([[0.5, 0.0, 1.5], [0.0, 1.0, 0.0]]), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    torch.testing.assert_close(model.w.detach(), -oracle.float())
    assert torch.equal(opt.state[model.w]["momentum_buffer"], 0.5 * m_ref + 0.5 * g)
    w = model.w.detach()
    assert w[0, 1] == 0 and w[1, 0] == 0 and w[1, 2] == 0  # the zero pattern of U survives


def test_lambda_zero_soap_keeps_the_reference_eigenbasis_for_the_whole_round() -> None:
    """Diagonal reference factors: the eigenbasis is a signed permutation, so SOAP in it is
    plain elementwise Adam; the client's own (non-diagonal) statistics must not leak in."""
    model = Tiny((2, 2))
    ref = {"w/gg0": torch.diag(torch.tensor([4.0, 1.0])), "w/gg1": torch.diag(torch.tensor([1.0, 9.0]))}
    cfg = SecondOrderConfig("soap", lr=0.1, beta1=0.5, beta2=0.5, eps=1e-8, weight_decay=0.0,
                            lam=0.0, precondition_frequency=2)
    opt = SecondOrderUpdate(model.named_parameters(), cfg, reference=ref)
    m, v, x = torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2)
    for k in range(1, 6):
        g = torch.tensor([[1.0, 2.0], [2.0, 1.0]]) * k  # correlated rows: own gg is not diagonal
        _step(model, opt, g)
        m, v = 0.5 * m + 0.5 * g, 0.5 * v + 0.5 * g * g
        x = x - 0.1 * ((1 - 0.5**k) ** 0.5 / (1 - 0.5**k)) * m / (v.sqrt() + 1e-8)
        torch.testing.assert_close(model.w.detach(), x)
    assert float(opt.state[model.w]["gg"][0][0, 1].abs()) > 0.1  # own L updated (after use)


def test_lambda_schedules() -> None:
    assert round_lambda(0.5, "constant", 9, 16) == 0.5
    assert round_lambda(0.8, "lambda0-sqrt-r", 4, 16) == pytest.approx(0.4)
    assert round_lambda(2.0, "c-sqrt-R", 1, 16) == pytest.approx(0.5)
    assert round_lambda(0.9, "lambda0-sqrt-r", 1, 16) == 0.9
    assert recipe_for_round(RunConfig(algorithm="fedpac-soap"), 1).mix_lambda == 1.0  # no mixing
