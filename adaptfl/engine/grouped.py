"""C copies of a plain feed-forward model as one: batched matmuls and grouped convolutions.

The `grouped` gradient form of the cohort (engine/cohort_steps.py): the C clients' weights are
rows of one tensor, the forward pass runs every client's batch through its own weights in a
few large kernels, and one ordinary `autograd.grad` of the summed per-client losses gives every
client its own gradient (the clients share no weight, so no client's loss reaches another's
row). The kernels:
  Linear   `torch.baddbmm` over [C, B, in] with each client's [out, in]
  Conv2d   one convolution with `groups=C` over [B, C·in, H, W] (the clients' channels side by
           side, the usual way to run an ensemble of convolutions as one)
  pools and activations act on either layout as they do on one client's; Flatten and
  Unflatten (from the batch axis on) reshape each client's part.
Same arithmetic as each client's own forward (the same products, summed in the kernel's
order), so the numbers agree to floating-point round-off; no functorch transform, so none of
its per-call dispatch cost (vmap(grad(...)) spends more on that than on a small MLP's
matmuls on a CPU: docs/scale.md).

Models outside this list (buffers, dropout, attention, a user's own module) are not grouped;
`GroupedModel.of` returns None and the cohort uses vmap or the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: F.relu, nn.GELU: F.gelu, nn.Tanh: torch.tanh, nn.Sigmoid: torch.sigmoid,
    nn.SiLU: F.silu, nn.Identity: lambda h: h,
}


def _layers(model: nn.Module) -> list[nn.Module] | None:
    """The model's layers in call order, or None where it is not a tree of `nn.Sequential`s of
    the supported layers (a Sequential calls its children in order; nothing else is assumed)."""
    if not isinstance(model, nn.Sequential):
        return None
    layers: list[nn.Module] = []
    for child in model:
        if isinstance(child, nn.Sequential):
            inner = _layers(child)
            if inner is None:
                return None
            layers += inner
        elif _supported(child):
            layers.append(child)
        else:
            return None
    return layers


def _supported(m: nn.Module) -> bool:
    if type(m) in ACTIVATIONS or type(m) in (nn.Linear, nn.MaxPool2d, nn.AvgPool2d):
        return True
    if type(m) is nn.Flatten:
        return m.start_dim == 1 and m.end_dim == -1
    if type(m) is nn.Unflatten:
        return isinstance(m.dim, int) and m.dim >= 1
    if type(m) is nn.Conv2d:
        return m.groups == 1 and m.padding_mode == "zeros" and not isinstance(m.padding, str)
    return False


def _pool(m: nn.Module, h: torch.Tensor, grouped: bool) -> torch.Tensor:
    """A 2-d pool on either layout: the stacked one's [C, B] folded into its batch axis."""
    t = h if grouped else h.reshape(-1, *h.shape[2:])
    if isinstance(m, nn.MaxPool2d):
        out = F.max_pool2d(t, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
    else:
        assert isinstance(m, nn.AvgPool2d)
        out = F.avg_pool2d(t, m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad,
                           m.divisor_override)
    return out if grouped else out.view(*h.shape[:2], *out.shape[1:])


class GroupedModel:
    """`forward(params, x)`: params in `model.parameters()` order, each [C, *shape]; x [C, B, ...]
    (each client's own batch); returns [C, B, ...] (each client's logits)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        self.layers = layers

    @classmethod
    def of(cls, model: nn.Module) -> GroupedModel | None:
        layers = _layers(model)
        if layers is None or any(True for _ in model.buffers()):
            return None
        owned = [p for m in layers for p in m.parameters(recurse=False)]
        if [id(p) for p in owned] != [id(p) for p in model.parameters()]:
            return None  # shared or unregistered weights: not the plain chain assumed here
        grouped = False  # a Linear right after a convolution (no Flatten) acts on a map's last axis
        for m in layers:
            if type(m) in (nn.Linear, nn.Unflatten) and grouped:
                return None
            grouped = (grouped or type(m) is nn.Conv2d) and type(m) is not nn.Flatten
        return cls(layers)

    def forward(self, params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        weights = iter(params)
        c = x.shape[0]
        h, grouped = x, False  # grouped: [B, C·channels, H, W]; else [C, B, ...]
        for m in self.layers:
            if type(m) is nn.Conv2d:
                if not grouped:
                    h, grouped = h.transpose(0, 1).reshape(h.shape[1], -1, *h.shape[3:]), True
                h = _conv(m, h, weights, c)
            elif type(m) is nn.Linear:
                h = _linear(m, h, weights, c)
            elif type(m) is nn.Flatten:
                h = h.reshape(h.shape[0], c, -1).transpose(0, 1) if grouped else h.reshape(c, h.shape[1], -1)
                grouped = False
            elif type(m) is nn.Unflatten:  # on [C, B, ...]: one axis further in
                h = torch.unflatten(h, m.dim + 1, m.unflattened_size)
            elif type(m) in (nn.MaxPool2d, nn.AvgPool2d):
                h = _pool(m, h, grouped)
            else:
                h = ACTIVATIONS[type(m)](h)
        if grouped:
            h = h.reshape(h.shape[0], c, -1, *h.shape[2:]).transpose(0, 1)
        return h


def _conv(m: nn.Conv2d, h: torch.Tensor, weights: Iterator[torch.Tensor], c: int) -> torch.Tensor:
    w = next(weights)
    b = next(weights) if m.bias is not None else None
    return F.conv2d(h, w.reshape(-1, *w.shape[2:]), None if b is None else b.reshape(-1),
                    m.stride, m.padding, m.dilation, groups=c)


def _linear(m: nn.Linear, h: torch.Tensor, weights: Iterator[torch.Tensor], c: int) -> torch.Tensor:
    w = next(weights)
    b = next(weights) if m.bias is not None else None
    flat = h.reshape(c, -1, h.shape[-1])
    out = torch.bmm(flat, w.transpose(1, 2)) if b is None else \
        torch.baddbmm(b.unsqueeze(1), flat, w.transpose(1, 2))
    return out.view(*h.shape[:-1], w.shape[1])
