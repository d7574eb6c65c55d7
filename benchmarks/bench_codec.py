"""What the wire codecs cost a client and the server, against a client's round compute, in one
process (issue 34's goals: encode + decode ≤ 5 % of a client's round on CPU; the server decodes
record by record, its peak no larger than today's plus one record).

    python benchmarks/bench_codec.py [--model cnn] [--steps 50] [--batch 50] [--device cpu]

The round compute is K FedACT local steps (forward, backward, update) of the model on
preloaded batches. A client's codec work per round is decoding the broadcast (Δ_G and v̄) and
encoding its reply (Δ and v, with error feedback where the codec says +ef, whose residual
round trip is part of it); each is timed as the median of repeats. The server's decode of one
reply (its size check, metadata, decode and today's validation: strategies/validation.py) is
timed on the same records, and its peak memory above the encoded reply measured with
tracemalloc-free arithmetic: the largest decoded record next to the encoded reply.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from adaptfl.codec.codec import spec_bytes
from adaptfl.codec.feedback import encode_reply
from adaptfl.codec.settings import Compression
from adaptfl.core import wire
from adaptfl.local_update import LocalUpdate
from adaptfl.strategies.validation import decode_content
from adaptfl.workloads import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

CODECS = ("fp32", "bf16", "int8", "nf4", "fp4", "top10%+ef", "top1%:fp4+ef", "int2+ef", "top5%:int2+ef",
          "rtop5%:int2+ef", "rand5%:int2+ef")
GOAL = 0.05


class Store:
    """A client's durable state, in memory (what the ClientApp keeps on disk too)."""

    def __init__(self) -> None:
        self.kept: dict = {}

    def load(self, name, expect=None):  # noqa: ANN001, ANN201 - ClientStateStore's interface
        return self.kept.get(name), 1

    def save(self, name, tensors) -> None:  # noqa: ANN001
        self.kept[name] = tensors


def median_seconds(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def round_seconds(model: torch.nn.Module, steps: int, batch: int, device: str) -> float:
    opt = LocalUpdate(model.named_parameters(), lr=1e-3, rho=0.5, trust="act", tau=0.5,
                      diagnostics_every=10)
    opt.set_global_direction({n: torch.zeros_like(p) for n, p in model.named_parameters()})
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def one_round() -> None:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()

    one_round()  # warm-up
    return median_seconds(one_round, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--codecs", default=",".join(CODECS), help="comma-separated codecs to measure")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(args.model, 10, 1, 28).to(args.device)
    params = {n: p.detach() for n, p in model.named_parameters()}
    spec = {n: (tuple(p.shape), p.dtype) for n, p in params.items()}
    compute = round_seconds(model, args.steps, args.batch, args.device)
    print(f"{describe(args.device)}\n{args.model}: {sum(p.numel() for p in params.values()):,} "
          f"parameters; a client's round (K={args.steps}, batch {args.batch}): {compute * 1e3:.0f} ms")
    print("| codec | reply bytes (Δ+v) | client decode + encode | share of the round | "
          "server decode of one reply | goal ≤ 5 % |")
    print("|---|---|---|---|---|---|")
    delta = {n: torch.randn_like(p) * 1e-3 for n, p in params.items()}
    v = {n: torch.rand_like(p) * 1e-6 for n, p in params.items()}
    for text in args.codecs.split(","):
        size, client_s, server_s = measure(text, spec, delta, v)
        share = client_s / compute
        print(f"| {text} | {size / 1e3:.1f} KB (fp32 {2 * spec_bytes(spec) / 1e3:.1f}) | "
              f"{client_s * 1e3:.2f} ms | {share:.2%} | {server_s * 1e3:.2f} ms | "
              f"{'met' if share <= GOAL else 'NOT met'} |")


def measure(text: str, spec: dict, delta: dict, v: dict) -> tuple[int, float, float]:
    """(the reply's bytes, a client's decode + encode seconds, the server's decode seconds)."""
    compression = Compression(codec_delta=text, codec_v=text)  # the replies' codec (rand: replies only)
    codec = compression.of(wire.DELTA)  # positions as the run would send them (codec-positions)
    # the broadcast: the same codec without +ef (random-k is for replies: top-k there)
    down = dataclasses.replace(codec, ef=False, select="top" if codec.select == "rand" else codec.select)
    broadcast = {wire.DELTA_G: down.encode(delta, 64), wire.V_BAR: down.encode(v, 64)}
    store = Store()

    def client() -> dict:
        for encoded in broadcast.values():
            down.decode(encoded, spec, 64)
        out, _ = encode_reply({wire.DELTA: delta, wire.V_LOCAL: v}, compression, store, lambda r: None)
        return out

    client_s = median_seconds(client, 5)
    content = RecordDict({name: ArrayRecord(t) for name, t in client().items()})
    content[wire.METRICS] = MetricRecord({wire.NUM_EXAMPLES: 100})
    expected = {wire.DELTA: spec, wire.V_LOCAL: spec}
    codecs = ({wire.DELTA: codec, wire.V_LOCAL: codec}, 64)
    server_s = median_seconds(lambda: decode_content(content, expected, 1 << 40, codecs=codecs), 5)
    size = sum(len(a.data) for r in content.array_records.values() for a in r.values())
    return size, client_s, server_s

if __name__ == "__main__":
    main()
