"""MimeLite's ∇f_i(x^r) is bounded by mime-grad-examples: over at most that many of the client's
examples, a seeded sample without replacement that is fresh each round and the same in every
process; the whole partition where it is smaller (or with 0). Checked against autograd on the
very rows, computed here without adaptfl."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.components.mimelite import full_gradient, sample_rows
from adaptfl.algorithms.config import RunConfig
from adaptfl.core.stage import ClientData, ClientRound

N, CHUNK = 100, 16
X = torch.randn(N, 3, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 4, (N,), generator=torch.Generator().manual_seed(1))


class Counted(torch.nn.Linear):
    """A linear classifier that counts the rows it saw."""

    seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Counted.seen += len(x)
        return super().forward(x)


def model() -> Counted:
    torch.manual_seed(2)
    return Counted(3, 4)


def data(sample_seed: int = 0, sampled: bool = True) -> ClientData:
    chunks = lambda rows: [(X[r], Y[r]) for r in rows.split(CHUNK)]  # noqa: E731
    return ClientData(num_examples=N, loss=torch.nn.functional.cross_entropy,
                      full_batches=lambda: chunks(torch.arange(N)),
                      batches_of=chunks if sampled else None, sample_seed=sample_seed)


def ctx(net: torch.nn.Module, server_round: int = 2, **kw) -> ClientRound:
    cfg = RunConfig.of(algorithm="mimelite")
    return ClientRound(net, cfg.algorithm, cfg.round_info(server_round), {}, None, data(**kw))


def reference(net: torch.nn.Module, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The mean cross-entropy gradient over exactly `rows`, by plain autograd."""
    loss = torch.nn.functional.cross_entropy(net(X[rows]), Y[rows])
    grads = torch.autograd.grad(loss, list(net.parameters()))
    return {n: g for (n, _), g in zip(net.named_parameters(), grads, strict=True)}


# float32 sums in another order (chunks weighted by size vs one mean): a few ulps of values ~1
TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.mark.parametrize("limit", [0, N, 10 * N])
def test_no_bound_or_a_larger_one_is_the_full_gradient(limit: int) -> None:
    net = model()
    torch.testing.assert_close(full_gradient(net, ctx(net), limit), reference(net, torch.arange(N)), **TOL)


def test_a_bound_is_a_gradient_over_that_many_distinct_sampled_rows() -> None:
    net = model()
    round_ctx = ctx(net)
    rows = sample_rows(round_ctx, 30)
    assert len(rows) == len(set(rows.tolist())) == 30  # without replacement
    Counted.seen = 0
    got = full_gradient(net, round_ctx, 30)
    assert Counted.seen == 30  # the bound on the work
    torch.testing.assert_close(got, reference(net, rows), **TOL)
    full = reference(net, torch.arange(N))
    assert any(not torch.allclose(got[n], full[n]) for n in full)  # a sample, not the whole


def test_the_sample_is_seeded_fresh_each_round_and_own_to_each_client() -> None:
    net = model()
    same = [sample_rows(ctx(net, 2), 30).tolist() for _ in range(2)]
    assert same[0] == same[1]  # the same in every process for (seed, round, client)
    assert sample_rows(ctx(net, 3), 30).tolist() != same[0]
    assert sample_rows(ctx(net, 2, sample_seed=7), 30).tolist() != same[0]


def test_without_batches_of_a_bound_reads_the_first_chunks() -> None:
    net = model()
    Counted.seen = 0
    got = full_gradient(net, ctx(net, sampled=False), 40)
    assert Counted.seen == 48  # whole chunks of 16 until 40 rows were read
    torch.testing.assert_close(got, reference(net, torch.arange(48)), **TOL)


def test_the_key_defaults_to_1024_reaches_start_and_refuses_negatives() -> None:
    assert RunConfig.of(algorithm="mimelite").algorithm.correction.mime_grad_examples == 1024
    cfg = RunConfig.of(algorithm="mimelite", mime_grad_examples=20)
    net = model()
    round_ctx = ClientRound(net, cfg.algorithm, cfg.round_info(2), {}, None, data())
    part = cfg.algorithm.correction.start(round_ctx)
    torch.testing.assert_close(part.grad_at_x, reference(net, sample_rows(round_ctx, 20)), **TOL)
    with pytest.raises(ValueError, match="mime-grad-examples"):
        RunConfig.of(algorithm="mimelite", mime_grad_examples=-1)
