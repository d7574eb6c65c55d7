"""The CPU's band selection (local_update/band.py): exact whether the band hits or misses, and
used in place of the radix selection when it hits. The oracle is a stable descending sort
(torch.topk's set, ties to the lower index); tests/local_update/test_topk_exact.py runs its adversarial
inputs through both branches as well."""

from __future__ import annotations

import math

import pytest
import torch

from adaptfl.local_update import band, radix, topk
from adaptfl.local_update.workspace import Workspace

N = 50_000  # above topk._SMALL: the band / radix path, not the small-D sort


def _oracle(x: torch.Tensor, k: int) -> torch.Tensor:
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[torch.sort(x, descending=True, stable=True).indices[:k]] = True
    return mask


@pytest.fixture
def radix_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = radix.threshold

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(radix, "threshold", counted)
    return calls


def test_drifting_scores_are_selected_in_the_band_exactly(radix_calls: list[int],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Scores that drift a little from one call to the next, written into the same buffer, as
    # an optimizer's are: after the first call every selection comes from the band around the
    # previous threshold (neither the sample nor the radix runs).
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(N, generator=gen) * torch.randn(N, generator=gen)
    ws, k, x = Workspace(), N // 2, torch.empty(N)
    samples: list[int] = []
    real = band._sample_band
    monkeypatch.setattr(band, "_sample_band", lambda *a: samples.append(1) or real(*a))
    for step in range(8):
        torch.add(base, torch.randn(N, generator=gen), alpha=0.02 * step, out=x)
        x[::50] = x[7]  # ties, some of them at the threshold's neighbourhood
        expected = _oracle(x, k)
        assert torch.equal(topk.topk_mask(x, k, ws), expected)
        assert torch.equal(topk.topk_indicator_(x, k, ws), expected.float())  # over x itself
    assert radix_calls == [] and samples == [1]
    centre, width = ws.hints[band._key(x, k)]
    assert math.isfinite(centre) and 0.0 < width < float(base.abs().max())


def test_slices_of_one_size_keep_their_own_bands() -> None:
    # per-tensor scope: equal-sized segments of one buffer, scores on different scales
    gen = torch.Generator().manual_seed(4)
    x = torch.cat([torch.randn(N, generator=gen) * 10.0 ** i for i in range(3)])
    ws, k = Workspace(), N // 4
    for part in x.split(N):
        assert torch.equal(topk.topk_mask(part, k, ws), _oracle(part, k))
    centres = sorted(c for c, _ in ws.hints.values())
    assert len(centres) == 3 and centres[0] < centres[1] < centres[2]


def test_a_band_that_misses_falls_back_to_the_sample_then_to_the_radix(
        radix_calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(N, generator=gen)
    ws, k = Workspace(), N // 3
    key = band._key(x, k)
    ws.hints[key] = (100.0, 1e-3)  # far above every score: the remembered band misses
    assert torch.equal(topk.topk_mask(x, k, ws), _oracle(x, k))  # the sample's band holds it
    assert radix_calls == []
    t = float(torch.topk(x, k).values[-1])
    assert ws.hints[key][0] == t  # re-centred
    monkeypatch.setattr(band, "_sample_band", lambda x, k: (50.0, 60.0))  # a sample misses too
    ws.hints[key] = (100.0, 1e-3)
    assert band.select(x, k, ws) is None
    assert torch.equal(topk.topk_mask(x, k, ws), _oracle(x, k))  # the radix selection, exact
    assert len(radix_calls) == 1
    centre, width = ws.hints[key]
    assert centre == t and width >= 2 * (100.0 - t)  # re-centred, wide enough to hold both
    assert torch.equal(topk.topk_mask(x, k, ws), _oracle(x, k))  # now inside the band
    assert len(radix_calls) == 1


@pytest.mark.parametrize("k", [1, 17, N // 2, N - 1])
def test_ties_at_the_threshold_keep_the_lowest_indices(k: int) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(-3, 3, (N,), generator=gen).float()  # 6 values: ties everywhere
    x[::11] = -0.0
    ws = Workspace()
    for _ in range(2):  # the sampled band, then the remembered one
        sel = band.select(x, k, ws)
        assert sel is not None
        assert sel.t == float(torch.topk(x, k).values[-1])
        assert not (sel.t == 0 and math.copysign(1.0, sel.t) < 0)  # a zero threshold is +0.0
        assert torch.equal(topk.topk_mask(x, k, ws), _oracle(x, k))


def test_infinite_thresholds_are_exact_and_not_remembered() -> None:
    x = torch.full((N,), math.inf)
    x[: N // 4] = torch.randn(N // 4)
    ws, k = Workspace(), N // 2  # the k-th largest is +inf
    for _ in range(2):
        assert torch.equal(topk.topk_mask(x, k, ws), _oracle(x, k))
        assert torch.equal(topk.kth_largest(x, k, ws), torch.tensor(math.inf))
    assert band._key(x, k) not in ws.hints


def test_the_accelerator_branch_never_reads_a_band(accelerator_paths: None,
                                                   radix_calls: list[int]) -> None:
    x = torch.randn(N, generator=torch.Generator().manual_seed(3))
    ws = Workspace()
    for _ in range(2):
        assert torch.equal(topk.topk_mask(x, N // 2, ws), _oracle(x, N // 2))
    assert ws.hints == {} and len(radix_calls) == 2
