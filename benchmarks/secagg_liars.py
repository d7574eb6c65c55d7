"""`python benchmarks/secagg_liars.py`: the SecAgg+ rows of docs/robustness.md ("SecAgg+ clients
that lie or disrupt"). tests/e2e/test_hostile_e2e.py's setup (MLP, the first 600/200
Fashion-MNIST images, 5 nodes, 8 rounds of 10 local steps, seed 1), fedavg, `secagg=secagg+`
and its defaults; node 5 hostile in every round, one attack a run:

- "+1e9 on y": adds 1e9 to every value of its masked vector (mod 2^32);
- "in-range flip × 20": Δ × −20 before encoding (the encoder clips it into the range);
- "garbage ciphertexts" / "wrong commitment": its share-keys reply's ciphertexts replaced by
  random bytes / its commitment to b by zeros;
- "garbage to one peer": its ciphertext to node 1 alone replaced by random bytes;
- "bit-flipped unmask shares": one bit of every share it returns at unmask;
- "copied public keys": signs up with node 1's keys and proofs.

`--rounds R` (8), `--secagg-liars f` (2, the default) set the run. `--in-reach`: "+1eK on y" for
K = 3..7 (inside the sum check's reach at 5 nodes, 5·B ≈ 5.4e8)
against clean and +1e9 (beyond it: skipped until the search names node 5).

Per attack: final test accuracy (0 for a run that aborted), rounds skipped, and who the rows'
`rejected` name. About 20 s a run on 2 cores (one torch thread)."""

from __future__ import annotations

import argparse
import logging
import pathlib
import secrets
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, Message  # noqa: E402

from adaptfl.algorithms.config import RunConfig  # noqa: E402
from adaptfl.client_app import app  # noqa: E402
from adaptfl.core import wire  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.secagg import protocol as p  # noqa: E402
from adaptfl.server_app.abort import RunAborted  # noqa: E402
from adaptfl.server_app.loop import run_federated  # noqa: E402
from benchmarks.hostile_table import tiny_fashion_mnist  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from tests.support.run_outputs import metric_rows  # noqa: E402

LIAR = 5
Tamper = Callable[[str, Message], None]  # (stage, the liar's reply), in place


def add_on_y(amount: int) -> Tamper:
    """`amount` added to every value of the masked vector (mod 2^32): q + amount under the masks.
    Beyond the sum's reach (5·B ≈ 5.4e8 at 5 nodes) the check sees it; below, nothing can."""
    def tamper(stage: str, reply: Message) -> None:
        if stage == p.MASKED_INPUT and wire.MASKED in reply.content.array_records:
            y = reply.content.array_records[wire.MASKED][p.MASKED_ARRAY].numpy().astype(np.uint64)
            y = (y + np.uint64(amount)) & np.uint64(2 ** 32 - 1)
            reply.content[wire.MASKED] = ArrayRecord({p.MASKED_ARRAY: Array(y.astype(np.uint32))})
    return tamper


add_1e9 = add_on_y(10 ** 9)


def garbage_ciphertexts(stage: str, reply: Message) -> None:
    if stage == p.SHARE_KEYS:
        rec = reply.content.config_records[wire.SECAGG]
        for key in [k for k in rec if k.isdigit()]:
            rec[key] = secrets.token_bytes(len(rec[key]))  # type: ignore[arg-type]


def garbage_to_one(stage: str, reply: Message) -> None:
    if stage == p.SHARE_KEYS and "1" in reply.content.config_records.get(wire.SECAGG, {}):
        rec = reply.content.config_records[wire.SECAGG]
        rec["1"] = secrets.token_bytes(len(rec["1"]))  # type: ignore[arg-type]


def wrong_commitment(stage: str, reply: Message) -> None:
    if stage == p.SHARE_KEYS:
        reply.content.config_records[wire.SECAGG][p.COMMIT] = bytes(32)


def flipped_shares(stage: str, reply: Message) -> None:
    if stage == p.UNMASK and not reply.has_error():
        rec = reply.content.config_records[wire.SECAGG]
        for key, value in list(rec.items()):
            rec[key] = value[:-1] + bytes([value[-1] ^ 1])  # type: ignore[index, operator]


SEEN: dict[str, ConfigRecord] = {}


def copied_keys(stage: str, reply: Message) -> None:
    if stage == p.SETUP and not reply.has_error():
        rec, victim = reply.content.config_records[wire.SECAGG], SEEN["setup"]
        mine = [k for k in rec if k.startswith(p.PK_ENC)]
        theirs = [k for k in victim if k.startswith(p.PK_ENC)]
        for key, source in zip(mine, theirs, strict=True):
            rec[key], rec[f"{p.PROOF}:{key}"] = victim[source], victim[f"{p.PROOF}:{source}"]
        rec[p.PK_MASK], rec[f"{p.PROOF}:{p.PK_MASK}"] = victim[p.PK_MASK], victim[f"{p.PROOF}:{p.PK_MASK}"]


ATTACKS: dict[str, Tamper | None] = {
    "clean": None, "+1e9 on y": add_1e9, "in-range flip × 20": None,
    "garbage ciphertexts": garbage_ciphertexts, "garbage to one peer": garbage_to_one,
    "wrong commitment": wrong_commitment,
    "bit-flipped unmask shares": flipped_shares, "copied public keys": copied_keys,
    # inside the check's reach: what the server cannot tell from an honest sum (--in-reach)
    **{f"+1e{k} on y": add_on_y(10 ** k) for k in (3, 4, 5, 6, 7)}}
IN_REACH = ["clean", *(f"+1e{k} on y" for k in (3, 4, 5, 6, 7)), "+1e9 on y"]


def handler(tamper: Tamper | None):  # noqa: ANN201 - a ClientApp handler
    def handle(msg: Message, context) -> Message:  # noqa: ANN001
        cfg = msg.content.config_records.get(wire.SECAGG)
        stage = str(cfg[p.STAGE]) if cfg is not None else ""
        reply = app.train_or_refuse(msg, context)
        if stage == p.SETUP and context.node_id == 1 and not reply.has_error():
            SEEN["setup"] = ConfigRecord(dict(reply.content.config_records[wire.SECAGG]))
        if tamper is not None and context.node_id == LIAR:
            tamper(stage, reply)
        return reply
    return handle


def flip_inside(train):  # noqa: ANN001, ANN201 - app.handle_train, Δ × −20 on the liar before encoding
    def flipped(msg: Message, context) -> Message:  # noqa: ANN001
        reply = train(msg, context)
        if context.node_id == LIAR and not reply.has_error():
            delta = reply.content.array_records[wire.DELTA].to_torch_state_dict()
            reply.content[wire.DELTA] = ArrayRecord({n: -20.0 * t if t.is_floating_point() else t
                                                     for n, t in delta.items()})
        return reply
    return flipped


def run(name: str, data: str, out: pathlib.Path, rounds: int = 8, liars: int = 2) -> dict:
    cfg = RunConfig.of(algorithm="fedavg", model="mlp", num_server_rounds=rounds, local_steps=10,
                       batch_size=16, data_dir=data, partitioning="iid", seed=1, results_dir=str(out),
                       run_name="r", secagg="secagg+", secagg_liars=liars, overwrite=True)
    original = app.handle_train
    if name == "in-range flip × 20":
        app.handle_train = flip_inside(original)
    started = time.perf_counter()
    try:
        grid = InProcessGrid(5, cfg.to_flower(), handler=handler(ATTACKS[name]))
        rows = metric_rows(run_federated(grid, cfg))
        accuracy, aborted = rows[-1]["test-accuracy"], ""
    except RunAborted as why:
        rows, accuracy, aborted = metric_rows(out / "r"), 0.0, str(why).split("\n")[0][:90]
    finally:
        app.handle_train = original
    named = sorted({node for r in rows for node in (*r.get("rejected", {}), *r.get("secagg-excluded", {}))})
    return {"attack": name, "accuracy": accuracy, "skipped": sum(bool(r["skipped"]) for r in rows),
            "rounds": len(rows), "named": named, "aborted": aborted,
            "seconds": time.perf_counter() - started,
            "why": next((r.get("skip-reason", "") for r in rows if r["skipped"]), "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS))
    parser.add_argument("--in-reach", action="store_true",
                        help="the sizes of a lie on y: " + ", ".join(IN_REACH))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--secagg-liars", type=int, default=2, help="f of the search (the default: 2)")
    args = parser.parse_args()
    args.attacks = IN_REACH if args.in_reach else args.attacks
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    print(describe("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        data = tiny_fashion_mnist(pathlib.Path(tmp) / "data")
        print("| attack (node 5 of 5, every round) | accuracy | rounds skipped | nodes named | run |")
        print("|---|---|---|---|---|")
        for name in args.attacks:
            r = run(name, data, pathlib.Path(tmp) / name.replace(" ", "-"), args.rounds, args.secagg_liars)
            print(f"| {name} | {r['accuracy']:.3f} | {r['skipped']} of {r['rounds']} | {r['named']} | "
                  f"{r['aborted'] or 'completed'} ({r['seconds']:.0f} s) |", flush=True)
            if r["why"]:
                print(f"|   first skip: {r['why']} | | | | |", flush=True)


if __name__ == "__main__":
    main()
