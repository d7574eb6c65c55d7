"""A local rule's direction must be a fresh tensor: the chain scales u in place, so a rule that
returns its own state (as torch's SGD returns its momentum buffer) would have that state rescaled.
The chain refuses such a rule with a one-line error naming it; a pure rule is exact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from adaptfl.algorithms import params as registry
from adaptfl.local_update.rules import Direction, Preconditioner, Step
from adaptfl.local_update.shell import LocalUpdate


@dataclass(frozen=True)
class AliasingHeavyBall(Preconditioner):
    """m = β·m + g, d = m — returning the buffer itself (wrong: not a fresh tensor)."""

    beta: float = registry.param(0.9, "heavy-ball momentum", within=(0.0, 1.0), open_high=True)
    slots = ("momentum_buffer",)

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        m = st["momentum_buffer"].mul_(self.beta).add_(g)
        return Direction(m)


@dataclass(frozen=True)
class PureHeavyBall(AliasingHeavyBall):
    """The same rule, pure: d is a fresh tensor."""

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        m = st["momentum_buffer"].mul_(self.beta).add_(g)
        return Direction(m.clone())


@pytest.fixture
def registered():
    made = []

    def register(cls: type, name: str) -> None:
        registry.component("preconditioner", name)(cls)
        made.append(name)

    yield register
    for name in made:
        registry._REGISTRY["preconditioner"].pop(name, None)


def _two_steps(rule: Preconditioner, **cfg: Any) -> torch.Tensor:
    x = torch.nn.Parameter(torch.zeros(4))
    opt = LocalUpdate([x], lr=0.1, weight_decay=0.0, preconditioner=rule, **cfg)
    for _ in range(2):
        x.grad = torch.ones(4)
        opt.step()
    return opt.state[x]["momentum_buffer"]


@pytest.mark.parametrize("cfg", [{}, {"rho": 0.5, "trust": "act"}], ids=["alone", "fedact"])
def test_heavy_ball_aliasing_its_state_is_refused_or_exact(registered, cfg):
    registered(AliasingHeavyBall, "test-aliasing-heavy-ball")
    try:
        m = _two_steps(AliasingHeavyBall(), **cfg)
    except ValueError as e:
        assert "test-aliasing-heavy-ball" in str(e) and "\n" not in str(e)
        return
    assert torch.allclose(m, torch.full((4,), 1.9))


@pytest.mark.parametrize("cfg", [{}, {"rho": 0.5, "trust": "act"}], ids=["alone", "fedact"])
def test_pure_heavy_ball_keeps_its_momentum(registered, cfg):
    registered(PureHeavyBall, "test-pure-heavy-ball")
    assert torch.allclose(_two_steps(PureHeavyBall(), **cfg), torch.full((4,), 1.9))
