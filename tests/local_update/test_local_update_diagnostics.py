"""What LocalUpdate measures and keeps besides the step: diagnostics that never change the step
and are never a fake 0, the full state in torch's state_dict, parameters kept as views of one
flat buffer (a layout, never a change of the step), the units of the correction, and the keys of
Muon's AdamW half (each against an independent reference)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from adaptfl.local_update import LocalUpdate
from adaptfl.local_update.rules.muon import Muon
from tests.local_update.test_local_update import (
    VARIANTS,
    _cnn,
    _max_diff,
    _mlp,
    _model,
    _muon_synced_steps,
    _opt,
    _train,
)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("every", [1, 3])
def test_diagnostics_never_change_the_step(name: str, every: int) -> None:
    """Measuring PosRatio/TopMass takes another code path than the rule's own step when there is
    no trust rule; the parameters must come out bit for bit the same (SOAP's eigenbasis turns
    a last-bit difference into 1e-3 within a few steps)."""
    plain, measured = _model(name), _model(name)
    _train(plain, _opt(name, plain, diagnostics_every=0), 8)
    opt = _opt(name, measured, diagnostics_every=every)
    _train(measured, opt, 8)
    assert _max_diff(plain, measured) == 0.0
    got = opt.diagnostics()
    assert set(got) == {"pos-ratio", "top-mass"} and 0.0 < got["pos-ratio"] <= 1.0 and got["top-mass"] > 0.0


def test_a_step_without_a_direction_is_not_measured_as_zero() -> None:
    """A fresh SOAP tensor's first step only initialises its statistics: no scores exist, so
    nothing is recorded (it used to record PosRatio = TopMass = 0); the next step is measured."""
    model = _cnn()
    opt = LocalUpdate(model.named_parameters(), preconditioner="soap", lr=0.02, diagnostics_every=10)
    _train(model, opt, 1)
    assert opt.diagnostics() == {}
    _train(model, opt, 1, start=1)
    first = opt.diagnostics()
    assert 0.3 < first["pos-ratio"] < 1.0 and first["top-mass"] > 0.0
    _train(model, opt, 9, start=2)  # steps 3-11: step 11 is due again (1 + N), step 2 was the make-up
    assert opt._diag_count == 2


@pytest.mark.parametrize("name", ["soap", "muon", "adamw-corrected-act", "sophia"])
def test_state_dict_carries_the_diagnostics_and_the_chains_settings(name: str) -> None:
    """The diagnostics schedule and sums, ρ, the step offset and the trust rule round-trip too:
    a resumed optimizer measures and steps exactly as the uninterrupted one."""
    model = _model(name)
    opt = _opt(name, model, diagnostics_every=3)
    _train(model, opt, 4)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    twin = copy.deepcopy(model)
    other = {k: v for k, v in VARIANTS[name].items() if k not in ("rho", "step_offset", "trust", "tau")}
    opt_twin = LocalUpdate(twin.named_parameters(), **other)  # built without the chain's settings
    opt_twin.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    _train(model, opt, 5, start=4)
    _train(twin, opt_twin, 5, start=4)
    assert _max_diff(model, twin) == 0.0
    assert opt_twin.diagnostics() == opt.diagnostics() and opt_twin.steps == opt.steps == 9
    assert (opt_twin.rho, opt_twin.trust) == (opt.rho, opt.trust)


def test_fedpac_corrects_in_units_of_lr_when_muon_takes_no_matrix() -> None:
    """With only the AdamW half (no matrix routed to Muon), the first param group runs at
    muon-adam-lr; the correction x -= β·lr·g_G must still use lr (the server divides g_G by
    K·lr). Oracle: torch's AdamW at (1-β)·muon-adam-lr, then the correction by hand."""
    beta, lr, adam_lr = 0.5, 0.02, 3e-4
    ours, theirs = nn.Linear(6, 3), nn.Linear(6, 3)
    theirs.load_state_dict(ours.state_dict())
    rule = Muon(muon_adam_lr=adam_lr)
    groups = rule.groups([("bias", ours.bias), ("w", ours.weight)], 1.0)
    assert len(groups) == 1 and groups[0]["lr"] == adam_lr  # hidden routing: no Muon matrix here
    opt = LocalUpdate(groups, lr=lr, preconditioner=rule, weight_decay=0.01, rho=beta,
                      correction="after-step")
    gen = torch.Generator().manual_seed(3)
    g_g = {"bias": torch.randn(3, generator=gen), "w": torch.randn(3, 6, generator=gen)}
    opt.set_global_direction(g_g)
    oracle = torch.optim.AdamW([theirs.bias, theirs.weight], lr=(1 - beta) * adam_lr, betas=(0.9, 0.95),
                               eps=1e-10, weight_decay=0.01)
    for _ in range(5):
        x = torch.randn(8, 6, generator=gen)
        for model, o in ((ours, opt), (theirs, oracle)):
            o.zero_grad()
            model(x).square().sum().backward()
            o.step()
        with torch.no_grad():
            theirs.bias.add_(g_g["bias"], alpha=-beta * lr)
            theirs.weight.add_(g_g["w"], alpha=-beta * lr)
    assert opt.ref_lr == lr
    assert max(float((a - b).abs().max()) for a, b in zip(ours.parameters(), theirs.parameters(),
                                                          strict=True)) < 1e-6


def test_muons_adamw_half_reads_its_own_keys() -> None:
    """muon-adam-beta1/beta2/eps at values other than the defaults: the AdamW half equals torch's
    AdamW with them (a hard-coded 0.9/0.95/1e-10 would fail); the matrix goes to torch's Muon."""
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="muon", lr=0.02, muon_adam_lr=1e-3,
                      muon_adam_beta1=0.8, muon_adam_beta2=0.9, muon_adam_eps=1e-3, weight_decay=0.0)
    assert opt.param_groups[0]["param_names"] == ["2.weight"]  # the hidden matrix
    named = dict(theirs.named_parameters())
    oracles = [torch.optim.Muon([named["2.weight"]], lr=0.02, weight_decay=0.0, momentum=0.95),
               torch.optim.AdamW([p for n, p in named.items() if n != "2.weight"], lr=1e-3,
                                 betas=(0.8, 0.9), eps=1e-3, weight_decay=0.0)]
    _muon_synced_steps(ours, opt, theirs, oracles, 6)  # the AdamW half to 1e-6 at every step
    defaults = _mlp()  # the same steps with the default keys end elsewhere
    _train(defaults, LocalUpdate(defaults.named_parameters(), preconditioner="muon", lr=0.02,
                                 muon_adam_lr=1e-3, weight_decay=0.0), 6)
    assert float((defaults[0].bias - ours[0].bias).abs().max()) > 1e-4


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_parameters_as_bucket_view_change_no_step(name: str) -> None:
    """One flat buffer for an elementwise group's parameters is a layout, not a change: the
    steps are bit for bit those of the per-tensor calls, also after something replaced a
    parameter's .data (as model.to() does), which rebuilds the buffer."""
    plain, flat = _model(name), _model(name)
    _train(plain, _opt(name, plain), 8)
    opt = _opt(name, flat, parameters_as_bucket_view=True)
    _train(flat, opt, 4)
    first = next(flat.parameters())
    first.data = first.data.clone()  # no longer a view of the buffer
    _train(flat, opt, 4, start=4)
    assert _max_diff(plain, flat) == 0.0
    if opt.param_groups[0]["preconditioner"] in ("sgd", "adam", "adamw", "sophia"):
        (bucket, _), = opt._buckets.values()  # the parameters are views of it again
        assert all(p.data_ptr() == bucket[i:].data_ptr() for p, i in zip(
            opt.param_groups[0]["params"],
            [sum(q.numel() for q in opt.param_groups[0]["params"][:j])
             for j in range(len(opt.param_groups[0]["params"]))], strict=True))
