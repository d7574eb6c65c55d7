"""One parametrised suite over the local optimizers, plus oracles no one here wrote."""

from __future__ import annotations

import copy

import pytest
import torch
from adaptfl.local_update import LocalUpdate, LocalUpdateConfig
from adaptfl.local_update.preconditioners import AdamHyper

VARIANTS = {
    "sgd": LocalUpdateConfig(preconditioner="sgd", lr=0.02),
    "adam": LocalUpdateConfig(preconditioner="adam", lr=0.05, weight_decay=1e-3),
    "adamw": LocalUpdateConfig(preconditioner="adamw", lr=0.05, weight_decay=1e-2),
    "adamw-act": LocalUpdateConfig(preconditioner="adamw", lr=0.05, trust="act", tau=0.5,
                                   alpha=2.0, gamma=0.5),
    "adamw-act-per-tensor": LocalUpdateConfig(preconditioner="adamw", lr=0.05, trust="act",
                                              trust_scope="per-tensor"),
    "adamw-cautious": LocalUpdateConfig(preconditioner="adamw", lr=0.05, trust="cautious"),
    "adamw-mgup": LocalUpdateConfig(preconditioner="adamw", lr=0.05, trust="mgup"),
    "adamw-corrected-act": LocalUpdateConfig(preconditioner="adamw", lr=0.05, rho=0.5,
                                             trust="act", adam=AdamHyper(bias_correction="paper"),
                                             step_offset=7),
}


class Quadratic(torch.nn.Module):
    """f(a, b) = ½‖A a - y‖² + ½‖b - c‖² with two tensors (a matrix and a vector)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(6, 4, generator=gen))
        self.b = torch.nn.Parameter(torch.randn(5, generator=gen))
        self.register_buffer("A", torch.randn(8, 6, generator=gen))
        self.register_buffer("y", torch.randn(8, 4, generator=gen))
        self.register_buffer("c", torch.randn(5, generator=gen))

    def loss(self) -> torch.Tensor:
        return 0.5 * ((self.A @ self.a - self.y) ** 2).sum() + 0.5 * ((self.b - self.c) ** 2).sum()


def _delta_g(model: Quadratic) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {n: 0.1 * torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def _run(model: Quadratic, opt: LocalUpdate, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model.loss()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_loss_decreases_on_a_quadratic(name: str) -> None:
    model = Quadratic()
    cfg = VARIANTS[name]
    opt = LocalUpdate(model.named_parameters(), cfg, delta_g=_delta_g(model))
    losses = _run(model, opt, 60)
    assert losses[-1] < 0.5 * losses[0], losses[::10]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_none_grad_changes_nothing(name: str) -> None:
    model = Quadratic()
    opt = LocalUpdate(model.named_parameters(), VARIANTS[name], delta_g=_delta_g(model))
    _run(model, opt, 3)
    frozen = model.b.detach().clone()
    state_before = {s: v.clone() for s, v in opt.flat_state.items()}
    opt.zero_grad(set_to_none=True)
    model.loss().backward()
    model.b.grad = None  # b gets no gradient this step
    opt.step()
    assert torch.equal(model.b.detach(), frozen)
    n_a = model.a.numel()
    for slot, before in state_before.items():  # b's state slots untouched, a's advanced
        assert torch.equal(opt.flat_state[slot][n_a:], before[n_a:]), slot
        assert not torch.equal(opt.flat_state[slot][:n_a], before[:n_a]), slot
    opt.zero_grad(set_to_none=True)  # all grads None: nothing moves at all
    a_before = model.a.detach().clone()
    opt.step()
    assert torch.equal(model.a.detach(), a_before)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_state_export_import_gives_the_identical_next_step(name: str) -> None:
    cfg = VARIANTS[name]
    model = Quadratic()
    opt = LocalUpdate(model.named_parameters(), cfg, delta_g=_delta_g(model))
    _run(model, opt, 5)
    twin = copy.deepcopy(model)
    twin_opt = LocalUpdate(twin.named_parameters(), cfg, delta_g=_delta_g(twin))
    twin_opt.local_step = opt.local_step
    for slot in opt.flat_state:
        twin_opt.import_state(slot, opt.export_state(slot))
    _run(model, opt, 1)
    _run(twin, twin_opt, 1)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("bad", [
    {"lr": 0.0}, {"lr": -1.0}, {"weight_decay": -0.1}, {"rho": 1.5}, {"rho": -0.1},
    {"tau": 0.0}, {"tau": 1.2}, {"alpha": 0.5, "gamma": 1.0}, {"gamma": 0.0},
    {"trust": "sometimes"}, {"preconditioner": "lion"}, {"trust_scope": "layer"},
    {"adam": "beta1"},
])
def test_bad_hyperparameters_raise(bad: dict) -> None:
    with pytest.raises((ValueError, TypeError)):
        if bad == {"adam": "beta1"}:
            AdamHyper(beta1=1.0)
        else:
            LocalUpdateConfig(**bad)


@pytest.mark.parametrize("bad", [{"beta1": 1.0}, {"beta2": -0.1}, {"eps": 0.0},
                                 {"bias_correction": "sometimes"}])
def test_bad_adam_hyperparameters_raise(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad)).replace("_", "-")):
        AdamHyper(**bad)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _compare_with_oracle(cfg: LocalUpdateConfig, oracle_cls, **oracle_kwargs) -> float:
    ours, ref = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), cfg)
    oracle = oracle_cls(ref.parameters(), **oracle_kwargs)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        x, y = torch.randn(32, 10, generator=gen), torch.randint(0, 3, (32,), generator=gen)
        for model, o in ((ours, opt), (ref, oracle)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            o.step()
    return max(float((p - q).abs().max()) for p, q in zip(ours.parameters(), ref.parameters(),
                                                          strict=True))


def test_adamw_reproduces_torch_adamw_over_20_steps() -> None:
    cfg = LocalUpdateConfig(preconditioner="adamw", lr=1e-2, weight_decay=0.01,
                            adam=AdamHyper(0.9, 0.999, 1e-8, "local"))
    diff = _compare_with_oracle(cfg, torch.optim.AdamW, lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    assert diff < 1e-6


def test_adam_with_coupled_l2_reproduces_torch_adam() -> None:
    cfg = LocalUpdateConfig(preconditioner="adam", lr=1e-2, weight_decay=1e-3,
                            adam=AdamHyper(0.9, 0.999, 1e-8, "local"))
    diff = _compare_with_oracle(cfg, torch.optim.Adam, lr=1e-2, weight_decay=1e-3)
    assert diff < 1e-6


def test_sgd_reproduces_torch_sgd() -> None:
    cfg = LocalUpdateConfig(preconditioner="sgd", lr=0.1, weight_decay=1e-3)
    diff = _compare_with_oracle(cfg, torch.optim.SGD, lr=0.1, weight_decay=1e-3)
    assert diff < 1e-6
