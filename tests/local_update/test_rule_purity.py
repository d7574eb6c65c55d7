"""A local rule's direction must be a fresh tensor: the chain scales u in place, so a rule that
returns its own state (as torch's SGD returns its momentum buffer) would have that state rescaled.
The chain refuses such a rule with a one-line error naming it; a pure rule is exact."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptfl.core import params as registry
from adaptfl.local_update.rules import Direction, Preconditioner, Step
from adaptfl.local_update.shell import LocalUpdate
from adaptfl.local_update.step import fused as fused_directions


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


def _documented_rule() -> type:
    """The worked local rule of docs/contributing.md, registered for the test only."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "contributing.md").read_text()
    block = text.split("# adaptfl/local_update/rules/heavy_ball.py\n", 1)[1].split("```", 1)[0]
    module = types.ModuleType("heavy_ball_doc")
    sys.modules[module.__name__] = module  # dataclasses resolve the annotations through it
    try:
        exec(compile(block, "docs/contributing.md", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module.HeavyBall


@pytest.fixture
def heavy_ball():
    cls = _documented_rule()
    yield cls
    registry._REGISTRY["preconditioner"].pop("heavy-ball", None)


def _train(groups: int, bucket: bool, **cfg: Any) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    xs = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (7, 5, 3)]
    params = [{"params": xs}] if groups == 1 else [{"params": xs[:1]}, {"params": xs[1:]}]
    opt = LocalUpdate(params, lr=0.05, weight_decay=0.01, parameters_as_bucket_view=bucket, **cfg)
    for _ in range(4):
        for x in xs:
            x.grad = torch.randn(x.shape, generator=gen)
        opt.step()
    return [x.detach().clone() for x in xs]


def test_documented_rule_matches_torch_sgd_momentum(heavy_ball):
    x = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    ref = torch.nn.Parameter(x.detach().clone())
    opt = LocalUpdate([x], lr=0.1, weight_decay=0.0, preconditioner="heavy-ball")
    sgd = torch.optim.SGD([ref], lr=0.1, momentum=0.9)
    for grad in ([0.5, 0.25, -1.0], [-1.0, 0.5, 0.0], [0.25, 0.25, 0.25]):
        x.grad, ref.grad = torch.tensor(grad), torch.tensor(grad)
        opt.step()
        sgd.step()
        torch.testing.assert_close(x.detach(), ref.detach())


@pytest.mark.parametrize("rule", ["heavy-ball", "sgd", "adamw", "adam"])
@pytest.mark.parametrize("cfg", [{}, {"rho": 0.5, "trust": "act"}], ids=["alone", "fedact"])
def test_every_path_of_the_chain_agrees(heavy_ball, rule, cfg):
    """The reference chain (several groups: per-block, concatenated) against the one-vector
    path of a single group, with and without the flat parameter bucket."""
    reference = _train(2, False, preconditioner=rule, **cfg)
    for bucket in (False, True):
        for got, want in zip(_train(1, bucket, preconditioner=rule, **cfg), reference, strict=True):
            torch.testing.assert_close(got, want)


def _rule_and_state(name: str, n: int = 1000) -> tuple[Preconditioner, dict[str, Any]]:
    rule = registry.lookup("preconditioner", name)()
    gen = torch.Generator().manual_seed(1)
    state = {slot: torch.rand(n, generator=gen) for slot in rule.slots}  # v >= 0
    return rule, state


@pytest.mark.parametrize("name", sorted(fused_directions.FUSED_NAMES))
@pytest.mark.parametrize("correct", [False, True], ids=["plain", "corrected"])
def test_each_fused_pass_equals_its_rules_own_direction(name: str, correct: bool) -> None:
    """The fast pass of a listed rule (fused_directions.py) computes what the rule's pure
    `direction` does, the correction folded in: u = addend + mix·scale·d, state alike."""
    rule, state = _rule_and_state(name)
    gen = torch.Generator().manual_seed(2)
    g, addend = torch.randn(1000, generator=gen), torch.randn(1000, generator=gen)
    step = Step(3, 10)
    own_state = {k: v.clone() for k, v in state.items()}
    d, scale = rule.direction(g, own_state, step)
    fusion = fused_directions.Fusion(torch.empty(1000), 0.7, addend if correct else None)
    fused = fused_directions.direction(rule, g, state, step, fusion)
    assert fused.corrected == correct and fused.d is fusion.out
    want = addend + 0.7 * scale * d if correct else scale * d
    torch.testing.assert_close(fused.d * (1.0 if correct else fused.scale), want)
    for slot in state:
        torch.testing.assert_close(state[slot], own_state[slot])


def test_a_subclass_of_a_fused_rule_runs_its_own_direction(registered) -> None:
    """Listed by exact class: a rule derived from AdamW that changes `direction` keeps its own
    (inheriting AdamW's fast pass would compute AdamW's direction instead)."""
    from adaptfl.local_update.rules.adam import AdamW

    @dataclass(frozen=True)
    class DoubledAdamW(AdamW):
        def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
            d, scale = super().direction(g, st, step)
            return Direction(2.0 * d, scale)

    registered(DoubledAdamW, "doubled-adamw")
    rule, state = _rule_and_state("adamw")
    g = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    plain = fused_directions.direction(rule, g, {k: v.clone() for k, v in state.items()}, Step(1, 1),
                                       fused_directions.Fusion(torch.empty(1000)))
    doubled = fused_directions.direction(DoubledAdamW(), g, state, Step(1, 1),
                                         fused_directions.Fusion(torch.empty(1000)))
    assert not doubled.corrected and doubled.d is not None and plain.d is not None
    torch.testing.assert_close(doubled.d * doubled.scale, 2.0 * plain.d * plain.scale)
