"""SecAgg+ between real protocol code on both sides (adaptfl/secagg/server.py and client.py) over
the in-process Grid, with a stand-in for training that returns chosen integers: the unmasked sum
is their sum exactly, with nodes vanishing at every stage up to the threshold; beyond it the
round is refused; a malformed masked reply is dropped; an honest node refuses to give both
shares of one node; what the server gets from one node does not depend on its input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.secagg import client as secagg_client
from adaptfl.secagg import fixedpoint
from adaptfl.secagg import protocol as p
from adaptfl.secagg.server import SecAggServer, SecureRefused

SIZE = 40
BITS = 32


def slots(bound: int) -> list[fixedpoint.Slot]:
    """Δ and v of 40 + 3 values, and one averaged metric; range c = B, so a value x is the
    integer x itself (the rounding has nothing to round)."""
    return [fixedpoint.Slot("delta", "w", (SIZE,), torch.float32, float(bound)),
            fixedpoint.Slot("delta", "b", (3,), torch.float32, float(bound)),
            fixedpoint.Slot("v", "w", (SIZE,), torch.float32, float(bound)),
            fixedpoint.Slot("f-hat", fixedpoint.METRIC, (1,), torch.float64, float(bound))]


def inputs(node: int, bound: int) -> dict:
    gen = torch.Generator().manual_seed(node)
    ints = lambda n: torch.randint(-bound, bound + 1, (n,), generator=gen).to(torch.float32)  # noqa: E731
    return {"delta": {"w": ints(SIZE), "b": ints(3)}, "v": {"w": ints(SIZE).abs()},
            "f-hat": float(torch.randint(0, bound, (1,), generator=gen))}


class Nodes:
    """The handler of every node: SecAgg+'s client, training replaced by `inputs`; `fail` makes
    a node answer one stage with an error (a node that vanished), `tamper` rewrites a reply."""

    def __init__(self, bound: int, fail: dict[int, str] | None = None, tamper=None) -> None:  # noqa: ANN001
        self.bound, self.fail, self.tamper = bound, fail or {}, tamper
        self.seen: dict[int, list[Message]] = {}

    def train(self, msg: Message, context: Context) -> Message:
        x = inputs(context.node_id, self.bound)
        content = RecordDict({"delta": ArrayRecord(x["delta"]), "v": ArrayRecord(x["v"]),
                              wire.METRICS: MetricRecord({wire.NUM_EXAMPLES: 10, "f-hat": x["f-hat"]})})
        return Message(content, reply_to=msg)

    def __call__(self, msg: Message, context: Context) -> Message:
        stage = msg.content.config_records[wire.SECAGG][p.STAGE]
        if self.fail.get(context.node_id) == stage:
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="gone"), reply_to=msg)
        reply = secagg_client.handle(msg, context, self.train)
        self.seen.setdefault(context.node_id, []).append(reply)
        return self.tamper(stage, context.node_id, reply) if self.tamper else reply


def run_round(num_nodes: int = 5, fail=None, tamper=None, shares: int = 11, noise_std: float = 0.0):  # noqa: ANN001, ANN201
    bound = fixedpoint.budget(BITS, num_nodes)
    grid = InProcessGrid(num_nodes, {})
    handler = Nodes(bound, fail, tamper)
    grid.handler = handler
    layout = slots(bound)
    share_count = min(shares, num_nodes)
    threshold = math.ceil(0.66 * share_count)
    server = SecAggServer(share_count, threshold, BITS, bound, noise_std, None, seed=3, server_round=1)
    instruction = RecordDict({wire.RECIPE: ConfigRecord({"round.seed": 1})})
    try:
        out = server.run(grid, list(range(1, num_nodes + 1)), instruction, layout,
                         {"delta": float(bound), "v": float(bound), "f-hat": float(bound)})
    except SecureRefused as why:
        return None, server.out, str(why), bound
    return out, server.out, "", bound


def plain_sum(nodes: list[int], bound: int) -> np.ndarray:
    parts = []
    for node in nodes:
        x = inputs(node, bound)
        parts.append(np.concatenate([x["delta"]["w"].numpy(), x["delta"]["b"].numpy(), x["v"]["w"].numpy(),
                                     [x["f-hat"]]]).astype(np.int64))
    return np.sum(parts, axis=0)


def test_the_unmasked_sum_is_the_plain_sum_of_the_integers() -> None:
    out, _, why, bound = run_round()
    assert why == "" and out.live == [1, 2, 3, 4, 5]
    assert np.array_equal(out.total, plain_sum(out.live, bound))
    records, metrics = fixedpoint.decode_mean(out.total, slots(bound), bound, 5)
    expected = torch.from_numpy(plain_sum(out.live, bound) / 5.0)
    assert torch.allclose(records["delta"]["w"].double(), expected[:SIZE].float().double())
    assert metrics["f-hat"] == pytest.approx(float(expected[-1]))


def test_each_node_adds_its_share_of_the_discrete_noise_before_masking() -> None:
    """dp='client': the sum carries five shares of N_Z(0, σ²): integer noise of std σ√5."""
    sigma = 2000.0
    out, _, why, bound = run_round(noise_std=sigma)
    noise = out.total - plain_sum(out.live, bound)
    assert why == "" and noise.dtype == np.int64 and np.any(noise != 0)
    assert 0.7 < float(noise.std()) / (sigma * math.sqrt(5)) < 1.3  # 84 values: ±8 % a std error


def test_the_sum_over_a_sparse_ring_of_twelve_nodes() -> None:  # SecAgg+ proper: 4 neighbours each
    out, _, why, bound = run_round(num_nodes=12, shares=5)
    assert why == "" and np.array_equal(out.total, plain_sum(out.live, bound))


@pytest.mark.parametrize("stage", p.STAGES)
def test_a_node_that_vanishes_at_any_stage_leaves_the_survivors_sum(stage: str) -> None:
    out, state, why, bound = run_round(fail={3: stage})
    assert why == "", why
    alive = [1, 2, 4, 5] if stage != p.UNMASK else [1, 2, 3, 4, 5]  # after y: its input counts
    assert out.live == alive and np.array_equal(out.total, plain_sum(alive, bound))
    assert state.dropped == {3: f"{stage}: gone"}


def test_beyond_the_threshold_the_round_is_refused_never_a_wrong_sum() -> None:
    out, state, why, _ = run_round(fail={2: p.MASKED_INPUT, 4: p.MASKED_INPUT})  # t=4 of 5
    assert out is None and state.total is None
    assert "fewer than 3 live neighbours" in state.dropped[1] or "nodes left" in why


def test_too_few_unmask_answers_refuse_the_round() -> None:
    out, _, why, _ = run_round(fail={2: p.UNMASK, 4: p.UNMASK})
    assert out is None and "of the 4 shares it needs" in why


@pytest.mark.parametrize("change", ["length", "dtype", "extra-record"])
def test_a_malformed_masked_reply_is_dropped_and_the_rest_summed(change: str) -> None:
    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage != p.MASKED_INPUT or node != 2:
            return reply
        y = reply.content.array_records[wire.MASKED][p.MASKED_ARRAY].numpy()
        if change == "length":
            reply.content[wire.MASKED] = ArrayRecord({p.MASKED_ARRAY: Array(y[:-1])})
        elif change == "dtype":
            reply.content[wire.MASKED] = ArrayRecord({p.MASKED_ARRAY: Array(y.astype(np.int64))})
        else:
            reply.content["delta"] = ArrayRecord({"w": torch.zeros(SIZE)})
        return reply

    out, state, why, bound = run_round(tamper=tamper)
    assert why == "" and out.live == [1, 3, 4, 5]
    assert np.array_equal(out.total, plain_sum([1, 3, 4, 5], bound))
    assert state.dropped[2].startswith("masked-input: ")


def _up_to_masked_input(bound: int) -> tuple[Nodes, InProcessGrid]:
    nodes = Nodes(bound)
    grid = InProcessGrid(5, {})
    grid.handler = nodes
    return nodes, grid


def test_an_honest_node_refuses_to_give_both_shares_of_one_node() -> None:
    """A server that names node 2 alive to get its self-mask seed's share and dead to get its
    mask key's share could unmask node 2's input: node 1 refuses; asked properly, it answers."""
    captured: dict[str, Context] = {}

    def tamper(stage: str, node: int, reply: Message) -> Message:
        return reply

    bound = fixedpoint.budget(BITS, 5)
    nodes = Nodes(bound, tamper=tamper)
    grid = InProcessGrid(5, {})
    grid.handler = nodes
    server = SecAggServer(5, 4, BITS, bound, 0.0, None, seed=3, server_round=1)
    # run the protocol but stop before unmasking: the unmask exchange is replaced
    original = server._exchange

    def exchange(grid_, contents, stage):  # noqa: ANN001, ANN202
        if stage == p.UNMASK:
            captured["contexts"] = grid.contexts  # type: ignore[assignment]
            raise SecureRefused("stopped before unmask")
        return original(grid_, contents, stage)

    server._exchange = exchange  # type: ignore[method-assign]
    with pytest.raises(SecureRefused):
        server.run(grid, [1, 2, 3, 4, 5], RecordDict({wire.RECIPE: ConfigRecord({})}), slots(bound),
                   {"delta": float(bound), "v": float(bound), "f-hat": float(bound)})
    context = grid.contexts[1]
    ask = lambda active, dead: Message(RecordDict({wire.SECAGG: ConfigRecord(  # noqa: E731
        {p.STAGE: p.UNMASK, p.ROUND: 1, p.ACTIVE: active, p.DEAD: dead})}), dst_node_id=1,
        message_type="train")
    with pytest.raises(ValueError, match="named both alive and dead"):
        secagg_client.handle(ask([1, 2, 3], [2]), context, nodes.train)
    reply = secagg_client.handle(ask([1, 2, 3, 4], [5]), context, nodes.train)
    assert set(reply.content.config_records[wire.SECAGG]) == {"b:1", "b:2", "b:3", "b:4", "s:5"}
    with pytest.raises(ValueError, match="out of order"):  # one unmask per round
        secagg_client.handle(ask([1, 2, 3, 4], [5]), context, nodes.train)


def test_stages_out_of_order_are_refused() -> None:
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    msg = Message(RecordDict({wire.SECAGG: ConfigRecord({p.STAGE: p.MASKED_INPUT, p.ROUND: 1})}),
                  dst_node_id=1, message_type="train")
    with pytest.raises(ValueError, match="out of order"):
        secagg_client.handle(msg, context, Nodes(10).train)


def test_a_setup_with_a_threshold_at_half_is_refused_by_the_node() -> None:
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    msg = Message(RecordDict({wire.SECAGG: ConfigRecord({p.STAGE: p.SETUP, p.ROUND: 1, p.SHARES: 4,
                                                         p.THRESHOLD: 2, p.NEIGHBOURS: [2, 3, 4]})}),
                  dst_node_id=1, message_type="train")
    with pytest.raises(ValueError, match="not above half"):
        secagg_client.handle(msg, context, Nodes(10).train)


def _bins(values: np.ndarray, bins: int = 16) -> np.ndarray:
    return np.bincount((values >> np.uint64(BITS - 4)).astype(np.int64), minlength=bins)


@pytest.mark.slow
def test_what_the_server_gets_from_a_node_does_not_depend_on_its_input() -> None:
    """Node 1's masked vector, over 12 rounds of fresh keys, once with its input and once with
    the input replaced by its negation: both are uniform on [0, 2^32) (χ² over 16 bins of the
    top bits, 15 dof: p < 1e-4 beyond 42.3), and the two samples are indistinguishable (a χ²
    two-sample test on the same bins)."""
    samples = {1: [], -1: []}
    for sign in (1, -1):
        for seed in range(12):
            bound = fixedpoint.budget(BITS, 5)
            nodes = Nodes(bound)
            base = nodes.train
            nodes.train = lambda msg, ctx, s=sign, b=base: _scaled(b(msg, ctx), s)  # type: ignore[method-assign]
            grid = InProcessGrid(5, {})
            grid.handler = nodes
            server = SecAggServer(5, 4, BITS, bound, 0.0, None, seed=seed, server_round=1)
            server.run(grid, [1, 2, 3, 4, 5], RecordDict({wire.RECIPE: ConfigRecord({})}), slots(bound),
                       {"delta": float(bound), "v": float(bound), "f-hat": float(bound)})
            reply = next(r for r in nodes.seen[1] if wire.MASKED in r.content.array_records)
            samples[sign].append(reply.content.array_records[wire.MASKED][p.MASKED_ARRAY].numpy()
                                 .astype(np.uint64))
    counts = {s: _bins(np.concatenate(v)) for s, v in samples.items()}
    for c in counts.values():
        expected = c.sum() / 16
        assert ((c - expected) ** 2 / expected).sum() < 42.3
    a, b = counts[1], counts[-1]
    two_sample = (((a - b) ** 2) / np.maximum(a + b, 1)).sum()
    assert two_sample < 42.3
    # the inputs themselves are far from uniform: unmasked, the same test would fail
    plain = fixedpoint.to_ring(plain_sum([1], fixedpoint.budget(BITS, 5)), BITS)
    c = _bins(np.tile(plain, 12))
    assert ((c - c.sum() / 16) ** 2 / (c.sum() / 16)).sum() > 42.3


def _scaled(reply: Message, sign: int) -> Message:
    if sign > 0:
        return reply
    for name in ("delta", "v"):
        arrays = reply.content.array_records[name].to_torch_state_dict()
        reply.content[name] = ArrayRecord({k: -t if name == "delta" else t * 0 for k, t in arrays.items()})
    return reply


@pytest.mark.parametrize("kind", ["b", "s"])
def test_a_spoiled_share_names_its_holder_never_a_wrong_sum(kind: str) -> None:
    """Node 1 answers the unmask with one byte of each share flipped: each fails its owner's
    hash, so node 1 is named and its changed shares unused. Its self-mask seed shares (b): the
    others' t = 4 remain, the round completes with the exact sum. Its mask-key shares of a dead
    node 3 (s): 3 remain of the 4 needed, so the round is refused, naming node 1."""
    def tamper(stage: str, node: int, reply: Message) -> Message:
        rec = reply.content.config_records.get(wire.SECAGG)
        if stage == p.UNMASK and node == 1:
            for key, value in list(rec.items()):
                if key.startswith(kind + ":") and key != f"{kind}:1":
                    rec[key] = value[:10] + bytes([value[10] ^ 0xFF]) + value[11:]
        return reply

    fail = {3: p.MASKED_INPUT} if kind == "s" else None  # a dead node: its mask key is rebuilt
    out, state, why, bound = run_round(fail=fail, tamper=tamper)
    assert state.dropped[1].startswith("unmask: returned a share of node ")
    if kind == "b":
        assert why == "" and np.array_equal(out.total, plain_sum([1, 2, 3, 4, 5], bound))
    else:
        assert out is None and state.total is None
        assert "3 of the 4 shares" in why and "nodes [1] returned changed shares" in why, why
