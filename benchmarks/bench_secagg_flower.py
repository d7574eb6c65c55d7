"""The reference for adaptfl's SecAgg+: Flower's own legacy SecAgg+ against plain FedAvg, per
round, in seconds and in bytes, over adaptfl's in-process transport.

    python benchmarks/bench_secagg_flower.py --clients 10 100 --models mlp cnn --rounds 3

What runs is Flower's code, unchanged: a `ServerApp` whose `@app.main()` builds a
`LegacyContext` around a legacy `flwr.server.strategy.FedAvg` and calls
`DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))` (or Flower's `default_fit_workflow` for
plain FedAvg) with the grid; the clients are a legacy `NumPyClient` behind
`ClientApp(client_fn=..., mods=[secaggplus_mod])` (no mod for plain FedAvg). The grid is
adaptfl's `InProcessGrid` (adaptfl/engine/inprocess.py) with its handler set to that ClientApp,
so adaptfl's own SecAgg+ can later run over the very same transport and be compared like for
like. `FlowerWireGrid` below adds the two things the legacy workflow needs that InProcessGrid
lacks (see its docstring).

Settings. Every client is sampled every round (fraction_fit 1.0; no federated evaluation,
fraction_evaluate 0.0; no central evaluation). SecAgg+: num_shares = min(11, clients) and
reconstruction_threshold = ceil(2/3 * num_shares) (3 clients: 3 and 2; 10: 10 and 7; 100: 11
and 8), clipping_range 8.0, quantization_range 2**22, modulus_range 2**32 and max_weight 1000
(Flower's defaults), no timeout, no dropouts.

Workload. adaptfl's `mlp` or `cnn` for Fashion-MNIST (`adaptfl.workloads.build_model(name, 10,
1, 28)`: 50,890 and 184,586 parameters), on RANDOM data of the right shape: 64 examples of
1x28x28 with labels in 0..9 per client (fixed by the client's partition id), one local epoch
of plain SGD (lr 0.01, batch 32). The benchmark times the protocol, not learning: the accuracy
of the model means nothing. torch runs on one thread (torch.set_num_threads(1)); the clients
run one after another in this process, so a round's seconds are the SUM of the clients' work
plus the server's (a deployment runs the clients in parallel).

Measures. `seconds`: the median over `rounds` rounds, after one warm-up round that is not
counted, of the wall time of one fit round (the fit workflow from the server's first message
to the new global model); `cpu_seconds`, the median of the process's CPU time in the same
window (all of it is this process's work: clients and server run here, torch on one thread),
which a loaded machine disturbs far less than the wall time. `bytes`: per round (the same
every measured round), the sum over every message of the round, server to client and client
to server, of the serialized size of its content,
`flwr.common.serde.recorddict_to_proto(message.content).ByteSize()` (every ArrayRecord,
ConfigRecord and MetricRecord the message carries; the metadata, ~100 bytes a message, is not
counted). Over Flower's gRPC transport the arrays travel as separately pushed objects, so the
wire there differs by framing; both halves of the comparison are counted this same way.

Flower's SecAgg+ hands FedAvg a float64 aggregate (`dequantize` returns float64), so from the
second round on its global model, and every copy of it sent to a client, is float64: twice the
float32 model's bytes down. That is the reference's real cost, so it is counted (the warm-up
round, with the float32 initial model, is not); the table shows bytes down and up apart.
Up, each client's masked vector travels as .npy bytes of 8-byte integers (values below
modulus_range = 2**32) in a ConfigRecord: twice a float32 model's bytes too. The key
exchange (public keys, encrypted shares, unmask shares) adds little beside either.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import subprocess
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Context, Message, RecordDict
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.serde import message_from_proto, message_to_proto, recorddict_to_proto
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.compat import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_PARAMS_RECORD
from flwr.server.workflow.default_workflows import default_fit_workflow
from flwr.serverapp import Grid, ServerApp

from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.workloads import build_model

EXAMPLES = 64  # per client
BATCH = 32
LR = 0.01
MAX_SHARES = 11
CLIPPING_RANGE = 8.0
QUANTIZATION_RANGE = 2**22
MODULUS_RANGE = 2**32
MAX_WEIGHT = 1000.0  # Flower's default
MODELS = ("mlp", "cnn")


def secagg_settings(num_clients: int) -> tuple[int, int]:
    """(num_shares, reconstruction_threshold) for `num_clients` sampled clients."""
    shares = min(MAX_SHARES, num_clients)
    return shares, math.ceil(2 * shares / 3)


# --- the clients: a legacy NumPyClient behind a ClientApp -----------------------------------

_DATA: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_MODELS: dict[str, torch.nn.Module] = {}


def client_data(partition: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The client's random Fashion-MNIST-shaped examples, fixed by its partition id."""
    if partition not in _DATA:
        gen = torch.Generator().manual_seed(1000 + partition)
        _DATA[partition] = (torch.randn(EXAMPLES, 1, 28, 28, generator=gen),
                            torch.randint(0, 10, (EXAMPLES,), generator=gen))
    return _DATA[partition]


def fresh_model(name: str) -> torch.nn.Module:
    """One model object per architecture, shared by the clients (they run one after another and
    each loads the global parameters first), so building it is not timed in every client."""
    if name not in _MODELS:
        torch.manual_seed(0)
        _MODELS[name] = build_model(name, 10, 1, 28)
    return _MODELS[name]


def initial_ndarrays(name: str) -> list[np.ndarray]:
    torch.manual_seed(0)
    return [p.detach().numpy().copy() for p in build_model(name, 10, 1, 28).parameters()]


class RandomDataClient(NumPyClient):
    """One local epoch of SGD on the client's random examples."""

    def __init__(self, model_name: str, partition: int) -> None:
        self.model_name, self.partition = model_name, partition

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]
            ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        model = fresh_model(self.model_name)
        with torch.no_grad():
            for p, value in zip(model.parameters(), parameters, strict=True):
                p.copy_(torch.from_numpy(value))
        x, y = client_data(self.partition)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        model.train()
        for start in range(0, EXAMPLES, BATCH):
            opt.zero_grad()
            F.cross_entropy(model(x[start:start + BATCH]), y[start:start + BATCH]).backward()
            opt.step()
        return [p.detach().numpy().copy() for p in model.parameters()], EXAMPLES, {}


def client_app(model_name: str, secagg: bool) -> ClientApp:
    def client_fn(context: Context):
        return RandomDataClient(model_name, int(context.node_config["partition-id"])).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod] if secagg else [])


# --- the transport: InProcessGrid plus what the legacy workflow needs ----------------------

class _Run:
    """What the legacy client-manager thread reads of `grid.run`: the run id."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id


class FlowerWireGrid(InProcessGrid):
    """adaptfl's InProcessGrid, with the ClientApp as its handler, plus two things Flower's
    legacy workflow needs that it lacks (adaptfl/engine is left as it is):

    1. `run`. `DefaultWorkflow` starts Flower's client-manager thread
       (flwr/server/compat/app_utils.py), which wraps every node id in a `GridClientProxy(...,
       run_id=grid.run.run_id)`; InProcessGrid's `run` raises NotImplementedError (it has no
       Flower Run object). Here `run` is an object with the grid's run id.
    2. A copy of every message, made by serializing it. InProcessGrid hands the server's own
       Message object to the handler, and the client's own reply back. Flower's
       SecAggPlusWorkflow sends ONE RecordDict to all nodes in its setup stage and
       `secaggplus_mod` pops the stage key out of it, so the second node would get a message
       without a stage (KeyError); over any real transport each node gets its own deserialized
       copy. So each message, both ways, goes through `flwr.common.serde.message_to_proto` /
       `message_from_proto`, as it would on the wire, and that is also where its bytes are
       counted (`recorddict_to_proto(content).ByteSize()`, the content only).
    """

    def __init__(self, num_nodes: int, app: ClientApp, run_id: int = 1) -> None:
        super().__init__(num_nodes, {}, handler=self._over_the_wire, run_id=run_id)
        self.app = app
        self._run = _Run(run_id)
        self.reset_counts()

    @property
    def run(self) -> Any:
        return self._run

    def reset_counts(self) -> None:
        self.bytes_down = self.bytes_up = self.messages = 0

    @staticmethod
    def _size(msg: Message) -> int:
        return recorddict_to_proto(msg.content).ByteSize() if msg.has_content() else 0

    def _over_the_wire(self, msg: Message, context: Context) -> Message:
        self.bytes_down += self._size(msg)
        reply = self.app(message_from_proto(message_to_proto(msg)), context)
        self.bytes_up += self._size(reply)
        self.messages += 2
        return message_from_proto(message_to_proto(reply))


# --- the server: Flower's legacy workflow in a ServerApp ------------------------------------

class TimedFit:
    """A fit workflow (Flower's SecAggPlusWorkflow or default_fit_workflow) timed per round,
    with the grid's byte counts of the round."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.rounds: list[dict[str, float]] = []

    def __call__(self, grid: Grid, context: Context) -> None:
        assert isinstance(grid, FlowerWireGrid)
        grid.reset_counts()
        started, cpu_started = time.perf_counter(), time.process_time()
        self.inner(grid, context)
        self.rounds.append({"seconds": time.perf_counter() - started,
                            "cpu_seconds": time.process_time() - cpu_started,
                            "bytes": grid.bytes_down + grid.bytes_up,
                            "bytes_down": grid.bytes_down, "bytes_up": grid.bytes_up,
                            "messages": grid.messages})


def server_app(model_name: str, num_clients: int, secagg: bool, num_rounds: int,
               timed: TimedFit, out: dict[str, Any]) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=num_clients,
                          min_available_clients=num_clients,
                          initial_parameters=ndarrays_to_parameters(initial_ndarrays(model_name)))
        legacy = LegacyContext(context, config=ServerConfig(num_rounds=num_rounds),
                               strategy=strategy)
        DefaultWorkflow(fit_workflow=timed)(grid, legacy)
        out["parameters"] = parameters_to_ndarrays(compat.arrayrecord_to_parameters(
            legacy.state.array_records[MAIN_PARAMS_RECORD], keep_input=True))

    return app


def flower_rounds(num_clients: int, model: str, secagg: bool, rounds: int) -> dict:
    """`rounds` measured rounds (after one warm-up round) of Flower's legacy FedAvg, with or
    without SecAgg+, over the in-process grid. Returns {"seconds": the median seconds of a
    round, "bytes": the bytes of a round (both directions)}, plus "cpu_seconds" (the median
    CPU seconds of this process in a round), "bytes_down", "bytes_up",
    "messages" (of the last round), "rounds" (every round's, the warm-up first) and
    "parameters" (the global model after the last round, numpy arrays)."""
    if model not in MODELS:
        raise ValueError(f"model {model!r}: one of {MODELS}")
    if rounds < 1 or num_clients < 2:
        raise ValueError("rounds >= 1 and num_clients >= 2 (SecAgg+ needs two)")
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    if secagg:
        shares, threshold = secagg_settings(num_clients)
        fit = SecAggPlusWorkflow(num_shares=shares, reconstruction_threshold=threshold,
                                 max_weight=MAX_WEIGHT, clipping_range=CLIPPING_RANGE,
                                 quantization_range=QUANTIZATION_RANGE,
                                 modulus_range=MODULUS_RANGE)
    else:
        fit = default_fit_workflow
    timed, out = TimedFit(fit), {}
    grid = FlowerWireGrid(num_clients, client_app(model, secagg))
    app = server_app(model, num_clients, secagg, rounds + 1, timed, out)
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    if len(timed.rounds) != rounds + 1 or "parameters" not in out:
        raise RuntimeError(f"ran {len(timed.rounds)} of {rounds + 1} rounds")
    measured = timed.rounds[1:]
    if len({r["bytes"] for r in measured}) != 1:  # sizes vary only by a few bytes if at all
        logging.getLogger(__name__).info("bytes differ between rounds: %s",
                                         [r["bytes"] for r in measured])
    return {"seconds": statistics.median(r["seconds"] for r in measured),
            "cpu_seconds": statistics.median(r["cpu_seconds"] for r in measured),
            "bytes": int(statistics.median(r["bytes"] for r in measured)),
            "bytes_down": measured[-1]["bytes_down"], "bytes_up": measured[-1]["bytes_up"],
            "messages": measured[-1]["messages"], "rounds": timed.rounds,
            "parameters": out["parameters"]}


# --- the CLI --------------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in lines.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    import platform

    return platform.processor() or platform.machine()


def load() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except OSError:
        return "load unknown"


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def size_arguments(doc: str) -> argparse.ArgumentParser:
    """The clients, models and rounds both SecAgg+ benchmarks take (bench_secagg.py too)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (after 1 warm-up)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = size_arguments(__doc__)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"Flower legacy SecAgg+ vs plain FedAvg over InProcessGrid; CPU {cpu_name()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); median of "
          f"{args.rounds} round(s) after 1 warm-up; {EXAMPLES} random examples/client, 1 epoch; "
          f"{load()}")
    header = (f"| {'model':5} | {'clients':>7} | {'shares/thr':>10} | {'plain s':>8} | "
              f"{'secagg s':>8} | {'s ratio':>7} | {'plain cpu s':>11} | {'secagg cpu s':>12} | "
              f"{'cpu ratio':>9} | {'plain MiB':>9} | {'secagg MiB':>10} | "
              f"{'secagg down/up MiB':>18} | {'B ratio':>7} |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for model in args.models:
        for n in args.clients:
            plain = flower_rounds(n, model, False, args.rounds)
            sec = flower_rounds(n, model, True, args.rounds)
            shares, thr = secagg_settings(n)
            down_up = f"{mib(sec['bytes_down'])}/{mib(sec['bytes_up'])}"
            print(f"| {model:5} | {n:>7} | {f'{shares}/{thr}':>10} | {plain['seconds']:>8.3f} | "
                  f"{sec['seconds']:>8.3f} | {sec['seconds'] / plain['seconds']:>7.2f} | "
                  f"{plain['cpu_seconds']:>11.3f} | {sec['cpu_seconds']:>12.3f} | "
                  f"{sec['cpu_seconds'] / plain['cpu_seconds']:>9.2f} | "
                  f"{mib(plain['bytes']):>9} | {mib(sec['bytes']):>10} | {down_up:>18} | "
                  f"{sec['bytes'] / plain['bytes']:>7.3f} |", flush=True)


if __name__ == "__main__":
    main()
