"""FedACT's native step as prepared (`step/native.Steady`) against the general path that
prepares it, bit for bit, step after step, while every input it was prepared from changes in
turn: a step that reused a stale preparation (an old lr, weight decay, Δ_G, ρ, state or
parameter memory) ends on other bits and fails here."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from adaptfl.local_update import LocalUpdate, native
from adaptfl.local_update.step import native as native_form

SIZES = {"w": (64, 300), "b": (64,), "v": (10, 64)}  # ~20,000 coordinates: the native form's size
Event = Callable[[LocalUpdate, dict[str, torch.nn.Parameter]], None]


def _set_lr(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    opt.param_groups[0]["lr"] *= 0.5  # as a scheduler does


def _set_wd(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    opt.param_groups[0]["weight_decay"] = 0.2


def _set_betas(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    opt.param_groups[0]["betas"] = (0.8, 0.99)


def _new_direction(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    opt.set_global_direction({n: torch.full_like(p, 1e-3) for n, p in params.items()})


def _set_rho(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    opt.rho = 0.2


def _reload(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    state = opt.state_dict()
    for st in state["state"].values():
        st["exp_avg_sq"] = st["exp_avg_sq"] * 2.0
    opt.load_state_dict(state)


def _move_data(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    for p in params.values():  # as model.to(...) does: new memory for every parameter
        p.data = p.data.clone()


def _import_v(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    opt.import_state("exp_avg_sq", {n: torch.full_like(p, 1e-4) for n, p in params.items()})


def _set_steps(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    for p in params.values():  # the local step count the bias correction of m reads
        opt.state[p]["step"] += 100


def _set_offset(opt: LocalUpdate, params: dict[str, torch.nn.Parameter]) -> None:
    opt.step_offset = 500


EVENTS: dict[str, Event] = {"lr": _set_lr, "weight-decay": _set_wd, "betas": _set_betas,
                            "global-direction": _new_direction, "rho": _set_rho,
                            "load-state-dict": _reload, "parameter-memory": _move_data,
                            "import-state": _import_v, "step-offset": _set_offset,
                            "step-count": _set_steps}


def _run(prepared: bool, event: Event | None, monkeypatch: pytest.MonkeyPatch,
         diagnostics_every: int = 0) -> tuple[list[torch.Tensor], int]:
    """Twelve FedACT steps (the event before the seventh); the parameters and v after each, and
    how many steps the prepared step ran."""
    ran = [0]
    run = native_form.Steady.run

    def counted(self: native_form.Steady, opt: LocalUpdate, grads: list[torch.Tensor]) -> None:
        ran[0] += 1
        run(self, opt, grads)
    monkeypatch.setattr(native_form.Steady, "run", counted)
    if not prepared:
        monkeypatch.setattr(native_form.Steady, "fits", lambda self, opt: None)
    gen = torch.Generator().manual_seed(5)
    params = {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in SIZES.items()}
    opt = LocalUpdate(params.items(), lr=1e-2, weight_decay=0.01, preconditioner="adamw", trust="act",
                      tau=0.4, rho=0.5, step_offset=20, diagnostics_every=diagnostics_every,
                      parameters_as_bucket_view=True)
    opt.set_global_direction({n: 1e-3 * torch.randn(p.shape, generator=gen) for n, p in params.items()})
    base = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
    out = []
    for step in range(12):
        if step == 6 and event is not None:
            event(opt, params)
        for n, p in params.items():
            p.grad = base[n] + 0.05 * torch.randn(p.shape, generator=gen)
        opt.step()
        out.append(torch.cat([p.detach().reshape(-1) for p in params.values()]))
        out.append(torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in params.values()]))
    monkeypatch.undo()
    return out, ran[0]


def _native_adam() -> None:
    lib = native.library()
    if lib is None or lib.adam is None:
        pytest.skip("the native loops or their form of torch's AdamW kernel are not available here: "
                    "no prepared step to check (tests/local_update/test_native_trust_step.py says why)")


@pytest.mark.parametrize("event", [None, *EVENTS])
def test_the_prepared_step_is_the_general_one_bit_for_bit(event: str | None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _native_adam()
    change = None if event is None else EVENTS[event]
    general, none = _run(False, change, monkeypatch)
    steady, ran = _run(True, change, monkeypatch)
    assert none == 0
    # prepared after the first step, and again after the event's step where the event changed it
    assert ran >= 9, f"the prepared step ran {ran} of 12 steps"
    for i, (a, b) in enumerate(zip(general, steady, strict=True)):
        assert torch.equal(a, b), f"step {i // 2 + 1}, {'x' if i % 2 == 0 else 'v'}"


def test_diagnostics_steps_take_the_general_path_and_keep_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    _native_adam()
    general, _ = _run(False, None, monkeypatch, diagnostics_every=4)
    steady, ran = _run(True, None, monkeypatch, diagnostics_every=4)
    # steps 1, 5, 9 measure (the fused form keeps the scores) and leave the preparation valid;
    # step 2 prepares the native step: the other 8 run as prepared
    assert ran == 12 - 3 - 1
    for a, b in zip(general, steady, strict=True):
        assert torch.equal(a, b)


def test_a_missing_gradient_is_not_stepped_as_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    _native_adam()
    gen = torch.Generator().manual_seed(1)
    params = {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in SIZES.items()}
    opt = LocalUpdate(params.items(), lr=1e-2, preconditioner="adamw", trust="act", tau=0.4, rho=0.5,
                      parameters_as_bucket_view=True)
    opt.set_global_direction({n: torch.zeros_like(p) for n, p in params.items()})
    for step in range(3):
        for n, p in params.items():
            p.grad = None if (step == 2 and n == "b") else torch.randn(p.shape, generator=gen)
        before = params["b"].detach().clone()
        opt.step()
    assert opt.last_path is not None and opt.last_path.form == "eager"
    assert torch.equal(params["b"].detach(), before)  # no gradient: not moved
    for p in params.values():  # every gradient again: the step counts now differ, so the
        p.grad = torch.randn(p.shape, generator=gen)  # prepared step does not fit
    assert opt.steady is not None and opt.steady.fits(opt) is None
