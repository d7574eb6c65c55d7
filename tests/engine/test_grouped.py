"""engine/grouped.py: C copies of a model run as one give each client's own logits and, through
one autograd call, each client's own gradient (float64 against each copy run alone)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adaptfl.engine.grouped import GroupedModel
from adaptfl.workloads import build_model

C, B = 3, 5


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.Tanh(), nn.Sequential(nn.Linear(7, 4)))


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Unflatten(1, (2, 6, 6)), nn.Conv2d(2, 3, 3, padding=1, stride=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(3, 4, 2, bias=False), nn.GELU(),
                         nn.AvgPool2d(2, ceil_mode=True), nn.Flatten(), nn.Linear(4, 5))


def _copies(build, inputs: tuple[int, ...]) -> tuple[list[nn.Module], torch.Tensor]:
    torch.manual_seed(0)
    models = [build().double() for _ in range(C)]  # each copy its own weights
    return models, torch.randn(C, B, *inputs, dtype=torch.float64)


@pytest.mark.parametrize("build,inputs", [(_mlp, (12,)), (_cnn, (72,)),
                                          (lambda: build_model("cnn", 10, 1, 28), (1, 28, 28))])
def test_each_client_gets_its_own_logits_and_gradient(build, inputs) -> None:
    models, x = _copies(build, inputs)
    grouped = GroupedModel.of(models[0])
    assert grouped is not None
    leaves = [torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_()
              for n, _ in models[0].named_parameters()]
    logits = grouped.forward(leaves, x)
    y = torch.randint(0, logits.shape[-1], (C, B))
    losses = torch.stack([nn.functional.cross_entropy(logits[i], y[i]) for i in range(C)])
    grads = torch.autograd.grad(losses.sum(), leaves)
    for i, model in enumerate(models):
        alone = model(x[i])
        torch.testing.assert_close(logits[i], alone, rtol=1e-12, atol=1e-12)
        nn.functional.cross_entropy(alone, y[i]).backward()
        for g, p in zip(grads, model.parameters(), strict=True):
            torch.testing.assert_close(g[i], p.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("model,why", [
    (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), "a layer with buffers"),
    (nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), "randomness"),
    (nn.Sequential(nn.Conv2d(1, 2, 3), nn.Linear(2, 2)), "a Linear on a feature map"),
    (nn.Sequential(nn.Conv2d(2, 2, 3, groups=2)), "a grouped convolution"),
    (nn.Sequential(nn.Conv2d(1, 2, 3, padding="same")), "string padding"),
    (nn.Sequential(nn.Flatten(0)), "a Flatten over the batch axis"),
    (build_model("vit-tiny", 10, 1, 28), "not a Sequential chain"),
])
def test_models_outside_the_plain_chain_are_not_grouped(model: nn.Module, why: str) -> None:
    assert GroupedModel.of(model) is None, why


def test_shared_weights_are_not_grouped() -> None:
    layer = nn.Linear(4, 4)
    assert GroupedModel.of(nn.Sequential(layer, nn.ReLU(), layer)) is None


def test_the_cohort_loss_is_each_clients_own_mean_over_its_counted_targets() -> None:
    """per_client_loss's one call equals task_loss client by client, masked tokens (-100) left
    out of each client's mean as F.cross_entropy's mean reduction leaves them."""
    from adaptfl.engine.cohort_steps import per_client_loss
    from adaptfl.workloads.losses import task_loss

    torch.manual_seed(0)
    logits = torch.randn(C, B, 4, 6, dtype=torch.float64)
    targets = torch.randint(0, 6, (C, B, 4))
    targets[0, :2] = -100
    targets[2, 0, 1] = -100
    got = per_client_loss(task_loss)(logits, targets)
    want = torch.stack([task_loss(logits[i], targets[i]) for i in range(C)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
