"""The radix top-k selects exactly torch.topk's set, ties to the lower index, on any input.

Two independent oracles: `torch.topk`'s k-th value with the ties at it taken from the lowest
index up, and a stable descending sort (which keeps index order among equal values). Inputs
are random and adversarial (heavy ties, all equal, constant blocks, ±0.0, ±inf, denormals,
values that differ only in the lowest bits, sorted runs), D from 1 to over a million, every
supported dtype, and k from 0 to D; each through the CPU branches (the band of band.py) and the
accelerator's (the radix selection alone), the `either_path` fixture.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from adaptfl.local_update import topk, trust
from adaptfl.local_update.workspace import Workspace

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def topk_oracle(x: torch.Tensor, k: int, top: torch.Tensor | None = None) -> torch.Tensor:
    """torch.topk's set, the ties at its k-th value taken from the lowest index. `top`: the
    values of torch.topk(x, K) for some K >= k, computed once for all the k of one x."""
    if k == 0:
        return torch.zeros(x.numel(), dtype=torch.bool)
    t = (torch.topk(x, k).values if top is None else top)[k - 1]
    tied = x == t
    need = k - int((x > t).sum())
    return (x > t) | (tied & (tied.cumsum(0) <= need))


def sort_oracle(x: torch.Tensor, k: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """The first k of a stable descending sort; `order`: that sort's indices, computed once."""
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    order = torch.sort(x, descending=True, stable=True).indices if order is None else order
    mask[order[:k]] = True
    return mask


def _tiny(dtype: torch.dtype) -> float:
    """The smallest positive denormal of dtype."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


INPUTS: dict[str, Callable[[int, torch.Generator, torch.dtype], torch.Tensor]] = {
    "gaussian": lambda n, g, dt: torch.randn(n, generator=g, dtype=torch.float64),
    "heavy ties": lambda n, g, dt: torch.randint(-5, 5, (n,), generator=g).double(),
    "all equal": lambda n, g, dt: torch.full((n,), -1.5, dtype=torch.float64),
    "constant blocks": lambda n, g, dt: torch.randn(n // 97 + 1, generator=g, dtype=torch.float64)
    .repeat_interleave(97)[:n],
    "signed zeros and infs": lambda n, g, dt: torch.tensor(
        [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf], dtype=torch.float64)[
        torch.randint(0, 6, (n,), generator=g)],
    "mostly zero": lambda n, g, dt: torch.where(
        torch.rand(n, generator=g) < 0.9, torch.where(torch.rand(n, generator=g) < 0.5, -0.0, 0.0),
        torch.randn(n, generator=g, dtype=torch.float64)),
    "mostly -inf": lambda n, g, dt: torch.where(torch.rand(n, generator=g) < 0.7, -math.inf,
                                                torch.randn(n, generator=g, dtype=torch.float64)),
    "negative": lambda n, g, dt: -torch.rand(n, generator=g, dtype=torch.float64) - 1.0,
    "denormals": lambda n, g, dt: torch.randint(-40, 40, (n,), generator=g).double() * _tiny(dt),
    "wide range": lambda n, g, dt: torch.randn(n, generator=g, dtype=torch.float64).sign()
    * torch.exp(8.0 * torch.randn(n, generator=g, dtype=torch.float64)),
    "lowest bits": lambda n, g, dt: 1.0 + torch.randint(0, 1 << 17, (n,), generator=g).double()
    * torch.finfo(dt).eps,
    "ascending": lambda n, g, dt: torch.linspace(-3.0, 3.0, n, dtype=torch.float64),
    "descending with ties": lambda n, g, dt: torch.arange(n, 0, -1, dtype=torch.float64) // 3,
}


def _input(name: str, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return INPUTS[name](n, g, dtype).to(dtype)


def _ks(n: int) -> list[int]:
    return sorted({0, 1, 2, n // 3, n // 2, n - 1, n, max(n - 2, 0)} & set(range(n + 1)))


def _check_all(x: torch.Tensor, k: int, ws: Workspace | None = None,
               oracles: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """`oracles`: (torch.topk's values, the stable sort's indices) of x, for every k of x."""
    top, order = oracles if oracles is not None else (None, None)
    expected = topk_oracle(x, k, top)
    assert torch.equal(expected, sort_oracle(x, k, order))  # the two oracles agree
    assert torch.equal(topk.topk_mask(x, k, ws), expected)
    buf = x.clone()
    ind = topk.topk_indicator_(buf, k, ws)
    assert ind.data_ptr() == buf.data_ptr()  # written over x
    assert torch.equal(ind, expected.to(x.dtype))
    if k >= 1:
        t = topk.kth_largest(x, k, ws)
        assert t.dim() == 0 and torch.equal(t, torch.topk(x, k).values[-1] if top is None else top[k - 1])


def _oracles(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both oracles' work done once for every k of x (torch.topk's k-th value is the k-th of
    its values for the largest k)."""
    return torch.topk(x, x.numel()).values, torch.sort(x, descending=True, stable=True).indices


SIZES = [1, 2, 3, 17, topk._SMALL - 1, topk._SMALL, topk._SMALL + 1, 5 * topk._SMALL + 13]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(INPUTS))
def test_matches_the_oracles(name: str, dtype: torch.dtype, either_path: str) -> None:
    ws = Workspace()  # reused across sizes, as an optimizer does across calls
    for n in SIZES:
        x = _input(name, n, dtype)
        oracles = _oracles(x)
        for k in _ks(n):
            _check_all(x, k, ws, oracles)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gaussian", "heavy ties", "signed zeros and infs", "lowest bits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_matches_the_oracles_above_a_million(name: str, dtype: torch.dtype) -> None:
    n = 1_048_576 + 11
    x = _input(name, n, dtype, seed=1)
    for k in (1, n // 100, n // 2, n - 3):
        _check_all(x, k)


def test_random_inputs_and_ks(either_path: str) -> None:
    gen = torch.Generator().manual_seed(3)
    ws = Workspace()
    for trial in range(40):
        n = int(torch.randint(topk._SMALL, 8 * topk._SMALL, (1,), generator=gen))
        levels = int(torch.randint(1, 2000, (1,), generator=gen))  # few levels: many ties
        x = torch.randint(-levels, levels, (n,), generator=gen).float() / levels
        k = int(torch.randint(0, n + 1, (1,), generator=gen))
        _check_all(x, k, ws if trial % 2 else None)


def test_ties_straddling_blocks_keep_the_lowest_indices(either_path: str) -> None:
    # All equal: the kept ties end inside one block of the radix path; k = D - 1 leaves out
    # exactly the last index, k = 1 keeps exactly the first.
    n = 16 * topk._SMALL + 7
    x = torch.zeros(n)
    x[::2] = -0.0
    for k in (1, topk._SMALL + 5, n // 2 + 1, n - 1):
        got = topk.topk_mask(x, k)
        assert torch.equal(got, torch.arange(n) < k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_topk_sum_positive_matches_a_sort(dtype: torch.dtype, either_path: str) -> None:
    for name in ("gaussian", "heavy ties", "negative", "mostly zero"):
        x = _input(name, 3 * topk._SMALL + 1, dtype).double().to(dtype)
        ordered = torch.sort(x.double(), descending=True).values
        for k in (0, 1, x.numel() // 100, x.numel() // 2, x.numel()):
            expected = ordered[:k].clamp(min=0).sum()
            got = topk.topk_sum_positive(x, k)
            assert got.dim() == 0
            rel = 1e-12 if dtype == torch.float64 else 1e-2
            assert float(got) == pytest.approx(float(expected), rel=rel, abs=1e-30)


def test_act_phi_per_segment_ranks_within_each_segment() -> None:
    gen = torch.Generator().manual_seed(4)
    sizes = [topk._SMALL + 100, 1, 37, 2 * topk._SMALL]
    s = torch.randint(-3, 3, (sum(sizes),), generator=gen).float()
    phi = trust.act_phi_(s.clone(), 0.3, 2.0, 0.5, sizes)
    expected = torch.cat([torch.where(topk_oracle(part, math.floor(0.3 * part.numel())), 2.0, 0.5)
                          for part in s.split(sizes)])
    assert torch.equal(phi, expected)


def test_refuses_what_it_cannot_rank() -> None:
    with pytest.raises(TypeError, match="int64"):
        topk.topk_mask(torch.arange(10), 3)
    with pytest.raises(ValueError, match="1-D"):
        topk.topk_indicator_(torch.zeros(4, 4), 3)
    with pytest.raises(ValueError, match="k=0"):
        topk.kth_largest(torch.ones(3), 0)
    with pytest.raises(ValueError, match="k=4"):
        topk.kth_largest(torch.ones(3), 4)
