"""Sophia, Muon and SOAP: one parametrised suite, plus oracles no one here wrote.

Oracles (test-only dependencies, pinned in pyproject's `test` extra):
  Muon   `torch.optim.Muon` on the Muon-routed matrices + `torch.optim.AdamW` on the rest.
         Named difference: torch's Muon takes only the matrices it is given; the parameter
         split is ours (local_update/routing.py) and the test hands the oracle the same split.
  SOAP   `pytorch_optimizer.SOAP` 4.1.0 (the authors' algorithm: first step only initialises,
         ε before the bias correction, decay after the step, QR refresh every f steps with
         v re-sorted). No difference at merge_dims=False, precondition_1d=False.
  Sophia `sophia_opt.SophiaG` 0.2.2 (the authors' SophiaG). Named differences: (1) the
         authors' loop refreshes h after the step with a NEW forward at the updated weights on
         iterations ≡ k_h-1 (0-based); ours reuses the step's own forward (one extra backward,
         no extra forward) and refreshes after local steps 1, 1+k_h, … — the test feeds the
         oracle our ĝ on our schedule via `update_hessian()`. (2) the denominator is
         max(ρ·bs·h, 1e-15) (spec) where the authors add 1e-15; identical unless ρ·bs·h < 1e-13.
"""

from __future__ import annotations

import copy

import pytest
import torch
from adaptfl.local_update.second_order import SecondOrderConfig, SecondOrderUpdate
from adaptfl.local_update.sophia import gnb_loss
from torch import nn
from torch.nn import functional as F

VARIANTS = {
    "sophia": SecondOrderConfig("sophia", lr=0.01, beta1=0.9, beta2=0.99, hessian_interval=2),
    "muon": SecondOrderConfig("muon", lr=0.02, beta1=0.9, adam_lr=0.01, routing="all-2d"),
    "soap": SecondOrderConfig("soap", lr=0.02, precondition_frequency=3),
    "soap-small-dim": SecondOrderConfig("soap", lr=0.02, precondition_frequency=2, max_precond_dim=5),
    "soap-act": SecondOrderConfig("soap", lr=0.02, trust="act"),
    "sophia-corrected-mixed": SecondOrderConfig("sophia", lr=0.01, rho=0.3, lam=0.5),
    "muon-trust-opt-in": SecondOrderConfig("muon", lr=0.02, trust="cautious", trust_on_muon=True),
}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 4))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3), nn.Tanh(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5))


def _data(model: nn.Module, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    shape = (16, 2, 6, 6) if isinstance(model[0], nn.Conv2d) else (16, 8)
    classes = 5 if isinstance(model[0], nn.Conv2d) else 4
    return torch.randn(shape, generator=gen), torch.randint(0, classes, (16,), generator=gen)


def _train(model: nn.Module, opt: SecondOrderUpdate, steps: int, start: int = 0) -> list[float]:
    losses, params = [], dict(model.named_parameters())
    for k in range(start, start + steps):
        x, y = _data(model, k)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        g_hat = None
        opt.bs = y.numel()
        if opt.hessian_due():
            gen = torch.Generator().manual_seed(k)
            grads = torch.autograd.grad(gnb_loss(logits, F.cross_entropy, gen), list(params.values()),
                                        retain_graph=True)
            g_hat = dict(zip(params, grads, strict=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step(g_hat=g_hat)
        losses.append(float(loss.detach()))
    return losses


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters(),
                                                                           strict=True))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_loss_decreases(name: str) -> None:
    model = _cnn() if name.startswith("soap") else _mlp()
    ref = None
    if VARIANTS[name].lam < 1.0:  # a reference Θ^r: h of a first client run
        first = copy.deepcopy(model)
        o = SecondOrderUpdate(first.named_parameters(), VARIANTS[name].__class__("sophia", lr=0.01))
        _train(first, o, 4)
        ref = o.export_theta()
    dg = {n: 0.01 * torch.ones_like(p) for n, p in model.named_parameters()}
    opt = SecondOrderUpdate(model.named_parameters(), VARIANTS[name], reference=ref, delta_g=dg)
    x, y = _data(model, 0)
    before = float(F.cross_entropy(model(x), y))
    for _ in range(30):  # one fixed batch: the loss on it must go down
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        opt.step()
    assert float(F.cross_entropy(model(x), y)) < 0.8 * before


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_none_grad_changes_nothing(name: str) -> None:
    model = _cnn() if name.startswith("soap") else _mlp()
    opt = SecondOrderUpdate(model.named_parameters(), VARIANTS[name])
    _train(model, opt, 3)
    frozen = model[0].weight
    before = frozen.detach().clone()
    state_before = {k: v.clone() for k, v in opt.state[frozen].items() if torch.is_tensor(v)}
    x, y = _data(model, 9)
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    frozen.grad = None
    opt.step()
    assert torch.equal(frozen.detach(), before)
    for k, v in state_before.items():
        assert torch.equal(opt.state[frozen][k], v), k


@pytest.mark.parametrize("name", ["sophia", "muon", "soap", "soap-small-dim"])
def test_theta_export_import_gives_the_identical_next_steps(name: str) -> None:
    """A client warm-started from an exported Θ steps exactly like one given the same Θ^r."""
    model = _cnn() if name.startswith("soap") else _mlp()
    opt = SecondOrderUpdate(model.named_parameters(), VARIANTS[name])
    _train(model, opt, 4)
    theta = opt.export_theta()
    assert theta and all(v.dtype == torch.float32 for v in theta.values())
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    opt_a = SecondOrderUpdate(a.named_parameters(), VARIANTS[name], reference=theta)
    opt_b = SecondOrderUpdate(b.named_parameters(), VARIANTS[name])
    opt_b.import_theta({k: v.clone() for k, v in theta.items()})
    _train(a, opt_a, 3, start=4)
    _train(b, opt_b, 3, start=4)
    assert _max_diff(a, b) == 0.0
    assert not torch.equal(a[0].weight, model[0].weight)  # it did step (warm SOAP: from k=1)


@pytest.mark.parametrize("bad", [dict(lr=0.0), dict(beta1=1.0), dict(hessian_interval=0),
                                 dict(max_precond_dim=0), dict(lam=1.5), dict(rho=1.0),
                                 dict(optimizer="shampoo"), dict(trust="bogus"), dict(sophia_rho=0.0)])
def test_bad_hyperparameters_raise(bad: dict) -> None:
    with pytest.raises(ValueError, match=str(next(iter(bad.values())))):
        SecondOrderConfig(**{"optimizer": "soap", **bad})


def test_trust_on_muon_needs_an_explicit_opt_in() -> None:
    with pytest.raises(ValueError, match="trust-on-muon"):
        SecondOrderConfig("muon", trust="act")
    SecondOrderConfig("muon", trust="act", trust_on_muon=True)  # opted in: allowed


def test_import_rejects_wrong_shapes_and_names() -> None:
    model = _mlp()
    opt = SecondOrderUpdate(model.named_parameters(), VARIANTS["sophia"])
    with pytest.raises(ValueError, match="shape"):
        opt.import_theta({"0.weight/hessian": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="lacks"):
        opt.import_theta({"9.weight/hessian": torch.zeros(3, 3)})


# --- oracles ---------------------------------------------------------------------------------
def test_muon_reproduces_torch_muon_and_adamw_over_20_steps() -> None:
    ours, theirs = _mlp(), _mlp()
    cfg = SecondOrderConfig("muon", lr=0.02, beta1=0.95, weight_decay=0.01, adam_lr=3e-4)
    opt = SecondOrderUpdate(ours.named_parameters(), cfg)
    assert opt.muon == {"2.weight"}  # hidden matrix only: first layer and head go to AdamW
    named = dict(theirs.named_parameters())
    muon = torch.optim.Muon([named["2.weight"]], lr=0.02, weight_decay=0.01, momentum=0.95)
    adamw = torch.optim.AdamW([p for n, p in named.items() if n != "2.weight"], lr=3e-4,
                              betas=(0.9, 0.95), eps=1e-10, weight_decay=0.01)
    for k in range(20):
        x, y = _data(ours, k)
        for model, opts in ((ours, [opt]), (theirs, [muon, adamw])):
            for o in opts:
                o.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            for o in opts:
                o.step()
    assert _max_diff(ours, theirs) < 1e-6
    assert _max_diff(ours, _mlp()) > 1e-2  # and they moved


@pytest.mark.parametrize("max_dim", [10000, 5])  # 5: the head's 96 and the conv's 6 stay unrotated
def test_soap_reproduces_pytorch_optimizer_soap_over_25_steps(max_dim: int) -> None:
    soap_cls = pytest.importorskip("pytorch_optimizer").SOAP
    ours, theirs = _cnn(), _cnn()
    opt = SecondOrderUpdate(ours.named_parameters(), SecondOrderConfig(
        "soap", lr=3e-3, weight_decay=0.01, precondition_frequency=4, max_precond_dim=max_dim))
    oracle = soap_cls(theirs.parameters(), lr=3e-3, betas=(0.95, 0.95), shampoo_beta=0.95,
                      weight_decay=0.01, precondition_frequency=4, max_precondition_dim=max_dim)
    for k in range(25):
        x, y = _data(ours, k)
        for model, o in ((ours, opt), (theirs, oracle)):
            o.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            o.step()
    assert _max_diff(ours, theirs) < 2e-6
    assert _max_diff(ours, _cnn()) > 1e-2
    conv = opt.state[ours[0].weight]["gg"]
    assert [None if g is None else tuple(g.shape) for g in conv] == \
        ([(6, 6), (2, 2), (3, 3), (3, 3)] if max_dim > 6 else [None, (2, 2), (3, 3), (3, 3)])


def test_sophia_reproduces_the_authors_sophiag_over_20_steps() -> None:
    sophia_cls = pytest.importorskip("sophia_opt").SophiaG
    ours, theirs = _mlp(), _mlp()
    opt = SecondOrderUpdate(ours.named_parameters(), SecondOrderConfig(
        "sophia", lr=1e-3, beta1=0.965, beta2=0.99, weight_decay=0.1, hessian_interval=3))
    oracle = sophia_cls(theirs.parameters(), lr=1e-3, betas=(0.965, 0.99), rho=0.04, weight_decay=0.1)
    refreshes = 0
    for k in range(20):
        x, y = _data(ours, k)
        due = opt.hessian_due()
        _train(ours, opt, 1, start=k)
        logits = theirs(x)
        if due:  # difference (1): same ĝ (same sampled labels), our schedule
            gen = torch.Generator().manual_seed(k)
            g_hat = torch.autograd.grad(gnb_loss(logits, F.cross_entropy, gen), list(theirs.parameters()),
                                        retain_graph=True)
        oracle.zero_grad(set_to_none=True)
        F.cross_entropy(logits, y).backward()
        oracle.step(bs=y.numel())
        if due:
            for p, g in zip(theirs.parameters(), g_hat, strict=True):
                p.grad = g
            oracle.update_hessian()
            refreshes += 1
    assert refreshes == 7  # after local steps 1, 4, 7, …, 19
    assert _max_diff(ours, theirs) < 1e-6
    assert float(opt.state[ours[0].weight]["hessian"].abs().sum()) > 0.0  # the refresh ran


def test_routing_sends_hidden_matrices_to_muon_and_the_rest_to_adamw() -> None:
    from adaptfl.local_update.routing import route_muon
    from adaptfl.workloads import build_model
    vit = build_model("vit-tiny", 10, 1, 28)
    chosen = route_muon([(n, p.shape) for n, p in vit.named_parameters()])
    assert "conv_proj.weight" not in chosen and "heads.head.weight" not in chosen  # first layer, head
    assert "class_token" not in chosen and "encoder.pos_embedding" not in chosen  # tokens, positions
    assert all(vit.get_parameter(n).ndim == 2 for n in chosen) and len(chosen) == 4 * 12
    shapes = [(n, p.shape) for n, p in _cnn().named_parameters()]
    assert route_muon(shapes, "all-2d") == ["0.weight", "3.weight"]  # FedPAC's code: every ≥2-D weight
