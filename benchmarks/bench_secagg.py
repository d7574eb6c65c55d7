"""adaptfl's SecAgg+ against the same FedAvg run without it (and against Flower's legacy SecAgg+).

    python benchmarks/bench_secagg.py --clients 10 100 --models mlp cnn [--rounds 3]
                                      [--out docs/results-data/secagg.csv] [--profile]
                                      [--no-flower]

For each model and number of clients, two in-process runs of adaptfl's FedAvg over
`InProcessGrid` (fraction-train 1.0, weighting 'uniform', screen-ratio 0): plain, and with
`secagg='secagg+'` (its defaults: secagg-shares 11, threshold 0.66, modulus 2^32, clip 8).
Per client: 2 local steps of plain SGD (lr 0.01) at batch 32, the closest adaptfl setting to
the Flower reference's one epoch over 64 examples at batch 32 (benchmarks/bench_secagg_flower.py);
data: the first 64 x clients Fashion-MNIST training images (iid, 64 per client at the largest
size) and 200 test images, written once to a temporary data dir.

Measures. Round seconds: the median over `rounds` measured rounds after one warm-up round of the
metrics row's `seconds` minus its `eval-seconds` (the central evaluation, which Flower's side
does not run). Bytes: two counts. `row B`: the row's `bytes-down + bytes-up` (adaptfl's own
accounting; plain counts the arrays, secagg+ every message's arrays and config values). `proto B`:
like the Flower reference, the sum over every message of the round, both ways, of
`recorddict_to_proto(content).ByteSize()`; each message also goes through
`message_to_proto`/`message_from_proto` both ways, as on Flower's wire and as in the reference's
grid, so both sides pay the same serialisation. Ratios are secagg+/plain; the proto counts are
the ones compared with Flower's.

The clients run one after another in this process: a round's seconds are the sum of every
client's work plus the server's. torch runs on one thread. `--profile` adds a cProfile of one
secagg+ mlp round at the largest size (top 15 by cumulative and by own time, and the time in
adaptfl/secagg by stage).
"""

from __future__ import annotations

import contextlib
import cProfile
import csv
import io
import json
import logging
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.common.serde import message_from_proto, message_to_proto, recorddict_to_proto

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_secagg_flower import mib, size_arguments  # noqa: E402
from machine import describe  # noqa: E402

from adaptfl.algorithms.config import RunConfig  # noqa: E402
from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.server_app import loop  # noqa: E402
from adaptfl.server_app.loop import run_federated  # noqa: E402
from adaptfl.workloads.idx import read_idx_file  # noqa: E402

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
EXAMPLES = 64  # per client at the largest size, as in the Flower reference
BATCH = 32
STEPS = 2  # 64 examples / batch 32: one epoch
LR = 0.01
TEST_IMAGES = 200
MODELS = ("mlp", "cnn")
GOAL_TIME, GOAL_BYTES = 1.5, 1.3


def write_idx(path: Path, array: np.ndarray) -> None:  # as tests/conftest.py's _write_idx
    import gzip
    import struct

    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def make_data(root: Path, train: int, test: int = TEST_IMAGES) -> Path:
    """The first `train` training and `test` test images of Fashion-MNIST, as idx files."""
    root.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("t10k", test)):
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            name = f"{split}-{kind}"
            write_idx(root / f"{name}.gz", read_idx_file(FASHION_MNIST_DIR / f"{name}.gz")[:count])
    return root


class WireGrid(InProcessGrid):
    """InProcessGrid whose every message, both ways, is serialised and parsed as on Flower's
    wire, its content counted as `recorddict_to_proto(content).ByteSize()` (what the Flower
    reference's FlowerWireGrid counts)."""

    def __init__(self, num_nodes: int, run_config: dict) -> None:
        super().__init__(num_nodes, run_config, handler=self._over_the_wire)
        self.bytes_down = self.bytes_up = 0

    @staticmethod
    def _size(msg: Message) -> int:
        return recorddict_to_proto(msg.content).ByteSize() if msg.has_content() else 0

    def _over_the_wire(self, msg: Message, context: Context) -> Message:
        self.bytes_down += self._size(msg)
        reply = train_or_refuse(message_from_proto(message_to_proto(msg)), context)
        self.bytes_up += self._size(reply)
        return message_from_proto(message_to_proto(reply))


def config(model: str, rounds: int, data: Path, results: Path, secagg: bool, steps: int = 2) -> RunConfig:
    extra = {"secagg": "secagg+"} if secagg else {}
    return RunConfig.of(model=model, algorithm="fedavg", num_server_rounds=rounds, local_steps=steps,
                        batch_size=BATCH, lr=LR, lr_schedule="constant", num_threads=1,
                        diagnostics_every=0, partitioning="iid", data_dir=str(data),
                        results_dir=str(results), run_name="secagg" if secagg else "plain",
                        overwrite=True, fraction_train=1.0, weighting="uniform", screen_ratio=0,
                        max_contribution_ratio=0,
                        client_state_dir=str(results / "state"), **extra)


def adaptfl_rounds(num_clients: int, model: str, secagg: bool, rounds: int, data: Path,
                   work: Path, profile_round: int = 0, steps: int = STEPS) -> dict:
    """`rounds` measured rounds after one warm-up of adaptfl's FedAvg, with or without SecAgg+.
    With `profile_round` r, that round runs under cProfile (returned as "profile")."""
    cfg = config(model, rounds + 1, data, work, secagg, steps)
    grid = WireGrid(num_clients, cfg.to_flower())
    proto: dict[int, tuple[int, int]] = {}
    prof = cProfile.Profile() if profile_round else None

    # the grid's counts per round: reset when a round's row arrives (on_round), read there
    # CPU seconds of a round: from the previous round's end (on_round) to this round's central
    # evaluation (the process's CPU time: clients and server run here, torch on one thread)
    cpu_marks: dict[str, list[float]] = {"eval": [], "done": []}
    evaluate_all = loop.evaluate_all

    def timed_evaluate(*a, **k):  # noqa: ANN002, ANN003, ANN202
        cpu_marks["eval"].append(time.process_time())
        return evaluate_all(*a, **k)

    def on_round(row: dict) -> None:
        cpu_marks["done"].append(time.process_time())
        proto[int(row["round"])] = (grid.bytes_down, grid.bytes_up)
        grid.bytes_down = grid.bytes_up = 0
        if prof is not None and int(row["round"]) == profile_round - 1:
            prof.enable()
        elif prof is not None and int(row["round"]) == profile_round:
            prof.disable()

    if prof is not None and profile_round == 1:
        prof.enable()
    loop.evaluate_all = timed_evaluate
    try:
        out = run_federated(grid, cfg, on_round=on_round)
    finally:
        loop.evaluate_all = evaluate_all
    # eval marks: round 0, 1, 2, ...; done marks: round 1, 2, ...
    cpu = [cpu_marks["eval"][r] - cpu_marks["done"][r - 2] for r in range(2, rounds + 2)]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    done = [r for r in rows if r["round"] >= 1]
    if len(done) != rounds + 1 or any(r.get("skipped") for r in done):
        states = [(r["round"], r.get("skipped"), r.get("skip-reason")) for r in done]
        raise RuntimeError(f"{model} {num_clients} secagg={secagg}: rounds {states}")
    measured = done[1:]
    secs = [r["seconds"] - r.get("eval-seconds", 0.0) for r in measured]
    last = measured[-1]
    down, up = proto.get(int(last["round"]), (0, 0))
    result = {"seconds": statistics.median(secs), "rounds-s": secs,
              "cpu_seconds": statistics.median(cpu) if cpu else float("nan"),
              "eval-s": statistics.median(r.get("eval-seconds", 0.0) for r in measured),
              "row-bytes": int(statistics.median(r["bytes-down"] + r["bytes-up"] for r in measured)),
              "row-down": last["bytes-down"], "row-up": last["bytes-up"],
              "bytes": down + up, "bytes_down": down, "bytes_up": up,
              "accuracy": last.get("test-accuracy")}
    if prof is not None:
        result["profile"] = prof
    return result


def print_profile(prof: cProfile.Profile, title: str) -> None:
    print(f"\n### cProfile: {title}\n")
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats(key).print_stats(15)
        text = buf.getvalue()
        start = text.find("   ncalls")
        print(f"top 15 by {key}:\n```\n{text[start:].rstrip()}\n```")
    # cumulative time of the protocol's stages (client: summed over every client)
    stats = pstats.Stats(prof)
    cum: dict[tuple[str, str], float] = {}
    for (filename, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = ("/".join(Path(filename).parts[-2:]), func)
        cum[key] = cum.get(key, 0.0) + ct
    get = lambda f, fn: cum.get((f, fn), 0.0)  # noqa: E731
    train = get("client_app/app.py", "handle_train")
    stages = [
        ("whole secure round (server + every client)", get("secagg/aggregate.py", "secure_round")),
        ("client setup: key pairs (secagg/client.py _setup)", get("secagg/client.py", "_setup")),
        ("client share keys: Shamir shares + encryption (_share_keys)",
         get("secagg/client.py", "_share_keys")),
        ("client check shares: decrypt and hash the shares sent to it (_check_shares)",
         get("secagg/client.py", "_check_shares")),
        ("client masked input, without local training (_masked_input - handle_train)",
         get("secagg/client.py", "_masked_input") - train),
        ("  of which key agreement (crypto.py shared_key)", get("secagg/crypto.py", "shared_key")),
        ("  of which PRG masks (crypto.py mask)", get("secagg/crypto.py", "mask")),
        ("  of which fixed-point encode (fixedpoint.py encode)", get("secagg/fixedpoint.py", "encode")),
        ("client unmask: shares for the server (_unmask)", get("secagg/client.py", "_unmask")),
        ("local training (client_app/app.py handle_train)", train),
        ("server: all but the exchanges (server.py run - _exchange)",
         get("secagg/server.py", "run") - get("secagg/server.py", "_exchange")),
        ("  of which Shamir rebuild (server.py _rebuild)", get("secagg/server.py", "_rebuild")),
        ("  of which decode mean (fixedpoint.py decode_mean)", get("secagg/fixedpoint.py", "decode_mean")),
        ("serialisation on the wire (serde message_to/from_proto)",
         get("common/serde.py", "message_to_proto") + get("common/serde.py", "message_from_proto")),
        ("byte counting (serde recorddict_to_proto, all calls)",
         get("common/serde.py", "recorddict_to_proto")),
    ]
    print("\nwhere the round's time goes (cumulative s, clients summed; rows overlap where indented):\n")
    print("| stage | s |\n|---|---:|")
    for name, t in stages:
        print(f"| {name} | {t:.3f} |")
    # own time by source area, so the protocol's share is visible at once
    stats = pstats.Stats(prof)
    areas: dict[str, float] = {}
    total = 0.0
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        if "adaptfl/secagg/" in filename:
            area = "adaptfl/secagg/" + Path(filename).name
        elif "cryptography" in filename or func.startswith("<method") and "cryptography" in func:
            area = "cryptography"
        elif "flwr/common/secure_aggregation" in filename:
            area = "flwr secure_aggregation"
        elif "torch" in filename or "torch" in func:
            area = "torch"
        elif "flwr/" in filename:
            area = "flwr (other)"
        elif "adaptfl/" in filename:
            area = "adaptfl (other)"
        elif filename == "~":
            area = "builtins: " + func[:60]
        else:
            area = "other"
        areas[area] = areas.get(area, 0.0) + tt
    print(f"\nown time by area (total {total:.2f} s):\n")
    print("| area | own s | share |\n|---|---:|---:|")
    for area, t in sorted(areas.items(), key=lambda kv: -kv[1])[:15]:
        print(f"| {area} | {t:.3f} | {t / total:.0%} |")


def flower_side(num_clients: int, model: str, rounds: int) -> tuple[dict, dict] | None:
    try:
        from bench_secagg_flower import flower_rounds  # benchmarks/ (branch flsec)
    except ImportError:
        return None
    return (flower_rounds(num_clients, model, False, rounds),
            flower_rounds(num_clients, model, True, rounds))


def write_csv(path: str, rows: list[dict]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    parser = size_arguments(__doc__)
    parser.add_argument("--out", default="", help="CSV of the table")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile one secagg+ mlp round at the largest size")
    parser.add_argument("--no-flower", action="store_true", help="adaptfl only")
    parser.add_argument("--local-steps", type=int, default=STEPS,
                        help="adaptfl's local steps per client (Flower's side: one epoch of 64); with "
                             "--no-flower, e.g. 50 (the main job's) for the protocol's share of a real round")
    parser.add_argument("--skip", nargs="*", default=[], help="model:clients pairs to leave out")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    for name in ("flwr", "adaptfl"):
        logging.getLogger(name).setLevel(logging.WARNING)
    print(describe("cpu") + f"; torch threads {torch.get_num_threads()}")
    print(f"adaptfl FedAvg, plain vs secagg+ (and Flower legacy FedAvg plain vs SecAgg+), "
          f"InProcessGrid, fraction 1.0, {args.local_steps} SGD steps at batch {BATCH} per client, median "
          f"of {args.rounds} round(s) after 1 warm-up; seconds exclude adaptfl's central evaluation")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-secagg-") as tmp:
        data = make_data(Path(tmp) / "fm", EXAMPLES * max(args.clients))
        for model in args.models:
            for n in args.clients:
                if f"{model}:{n}" in args.skip:
                    continue
                started = time.perf_counter()
                plain = adaptfl_rounds(n, model, False, args.rounds, data, Path(tmp) / f"p-{model}-{n}",
                                       steps=args.local_steps)
                sec = adaptfl_rounds(n, model, True, args.rounds, data, Path(tmp) / f"s-{model}-{n}",
                                     steps=args.local_steps)
                fl = None if args.no_flower else flower_side(n, model, args.rounds)
                row = {"model": model, "clients": n,
                       "plain_s": plain["seconds"], "secagg_s": sec["seconds"],
                       "ratio_s": sec["seconds"] / plain["seconds"],
                       "plain_cpu_s": plain["cpu_seconds"], "secagg_cpu_s": sec["cpu_seconds"],
                       "ratio_cpu": sec["cpu_seconds"] / plain["cpu_seconds"],
                       "plain_B": plain["bytes"], "secagg_B": sec["bytes"],
                       "ratio_B": sec["bytes"] / plain["bytes"],
                       "plain_row_B": plain["row-bytes"], "secagg_row_B": sec["row-bytes"],
                       "ratio_row_B": sec["row-bytes"] / plain["row-bytes"],
                       "secagg_down_B": sec["bytes_down"], "secagg_up_B": sec["bytes_up"],
                       "plain_rounds_s": " ".join(f"{s:.3f}" for s in plain["rounds-s"]),
                       "secagg_rounds_s": " ".join(f"{s:.3f}" for s in sec["rounds-s"])}
                if fl is not None:
                    fp, fs = fl
                    row.update({"flower_plain_s": fp["seconds"], "flower_secagg_s": fs["seconds"],
                                "vs_flower_s": sec["seconds"] / fs["seconds"],
                                "flower_plain_cpu_s": fp["cpu_seconds"],
                                "flower_secagg_cpu_s": fs["cpu_seconds"],
                                "vs_flower_cpu": sec["cpu_seconds"] / fs["cpu_seconds"],
                                "flower_plain_B": fp["bytes"], "flower_secagg_B": fs["bytes"],
                                "vs_flower_B": sec["bytes"] / fs["bytes"]})
                rows.append(row)
                if args.out:  # after every size, so a run cut short keeps what it measured
                    write_csv(args.out, rows)
                print(f"  {model} {n} clients: {time.perf_counter() - started:.0f} s wall "
                      f"({json.dumps({k: v for k, v in row.items() if isinstance(v, float)}, default=str)})",
                      file=sys.stderr, flush=True)
        print("\n| model | clients | plain s | secagg+ s | ratio | Flower plain s | Flower SecAgg+ s | "
              "adaptfl/Flower secagg | plain MiB | secagg+ MiB | ratio | Flower plain MiB | "
              "Flower SecAgg+ MiB | adaptfl/Flower secagg |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            f = (lambda k, fmt, r=r: format(r[k], fmt) if k in r else "n/a")  # noqa: E731
            fmib = (lambda k, r=r: mib(r[k]) if k in r else "n/a")  # noqa: E731
            print(f"| {r['model']} | {r['clients']} | {r['plain_s']:.3f} | {r['secagg_s']:.3f} | "
                  f"{r['ratio_s']:.2f} | {f('flower_plain_s', '.3f')} | {f('flower_secagg_s', '.3f')} | "
                  f"{f('vs_flower_s', '.2f')} | {mib(r['plain_B'])} | {mib(r['secagg_B'])} | "
                  f"{r['ratio_B']:.3f} | {fmib('flower_plain_B')} | {fmib('flower_secagg_B')} | "
                  f"{f('vs_flower_B', '.3f')} |")
        print("\nCPU seconds per round (the process's; less disturbed by the shared machine's load):\n")
        print("| model | clients | plain cpu s | secagg+ cpu s | ratio | Flower plain cpu s | "
              "Flower SecAgg+ cpu s | adaptfl/Flower secagg |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            f = (lambda k, fmt, r=r: format(r[k], fmt) if k in r else "n/a")  # noqa: E731
            print(f"| {r['model']} | {r['clients']} | {r['plain_cpu_s']:.3f} | {r['secagg_cpu_s']:.3f} | "
                  f"{r['ratio_cpu']:.2f} | {f('flower_plain_cpu_s', '.3f')} | "
                  f"{f('flower_secagg_cpu_s', '.3f')} | {f('vs_flower_cpu', '.2f')} |")
        big = [r for r in rows if r["clients"] == max(args.clients)]
        if big:
            worst_s, worst_b = max(r["ratio_s"] for r in big), max(r["ratio_B"] for r in big)
            print(f"\nat {max(args.clients)} clients: worst time ratio {worst_s:.2f} (goal <= "
                  f"{GOAL_TIME}: {'met' if worst_s <= GOAL_TIME else 'NOT MET'}), worst bytes ratio "
                  f"{worst_b:.3f} (goal <= {GOAL_BYTES}: {'met' if worst_b <= GOAL_BYTES else 'NOT MET'})")
        if any("vs_flower_s" in r for r in rows):
            worst = max(r["vs_flower_s"] for r in rows if "vs_flower_s" in r)
            print(f"adaptfl secagg+ / Flower SecAgg+ round time: worst {worst:.2f} (goal <= 1: "
                  f"{'met' if worst <= 1 else 'NOT MET'})")
        print("row-accounting bytes (adaptfl's metrics rows): " + "; ".join(
            f"{r['model']} {r['clients']}: plain {mib(r['plain_row_B'])} MiB, secagg+ "
            f"{mib(r['secagg_row_B'])} MiB ({r['ratio_row_B']:.3f}x)" for r in rows))
        if args.out:
            write_csv(args.out, rows)
            print(f"wrote {args.out}")
        if args.profile:
            n = max(args.clients)
            with contextlib.redirect_stderr(io.StringIO()):
                res = adaptfl_rounds(n, "mlp", True, 1, data, Path(tmp) / f"prof-{n}", profile_round=2)
            print_profile(res["profile"], f"one secagg+ mlp round, {n} clients "
                          f"({res['seconds']:.2f} s without evaluation; profiler overhead included)")


if __name__ == "__main__":
    main()
