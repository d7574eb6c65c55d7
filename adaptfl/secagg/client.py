"""A node's side of SecAgg+ (protocol.py): each stage checks what the server asks against what
this node did before in the round, kept in `context.state` (Flower keeps it between a run's
messages, also where each message starts a fresh ClientApp process). Anything wrong raises
ValueError, which the ClientApp answers as an error reply: the node drops out of the round.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from adaptfl.algorithms.recipe import algorithm_from_recipe, privacy_from_recipe
from adaptfl.core import wire
from adaptfl.core.privacy_settings import Privacy
from adaptfl.privacy.client import check_floor, node_settings
from adaptfl.privacy.mechanism import start_bound
from adaptfl.secagg import crypto, fixedpoint, noise
from adaptfl.secagg import protocol as p
from adaptfl.secagg.round_contract import check_first_setup, check_layout, contract_layout, note_masked

STATE = "adaptfl-secagg"  # context.state ConfigRecord: this node's protocol state for the round
Train = Callable[[Message, Context], Message]


def handle(msg: Message, context: Context, train: Train) -> Message:
    cfg = msg.content.config_records[wire.SECAGG]
    stage, server_round = str(cfg.get(p.STAGE, "")), _int(cfg, p.ROUND) if p.ROUND in cfg else -1
    if stage == p.SETUP:
        return _reply(msg, _setup(cfg, context, server_round))
    state = context.state.config_records.get(STATE)
    before = {p.SHARE_KEYS: p.SETUP, p.CHECK_SHARES: p.SHARE_KEYS, p.MASKED_INPUT: p.CHECK_SHARES,
              p.UNMASK: p.MASKED_INPUT}
    if stage not in before:
        raise ValueError(f"secagg: unknown stage {stage!r}")
    if state is None or _int(state, p.ROUND) != server_round or state[p.STAGE] != before[stage]:
        raise ValueError(f"secagg: stage {stage!r} of round {server_round} out of order")
    if stage == p.SHARE_KEYS:
        return _reply(msg, _share_keys(cfg, state, context.node_id))
    if stage == p.CHECK_SHARES:
        return _reply(msg, _check_shares(cfg, state, context.node_id))
    if stage == p.MASKED_INPUT:
        return _masked_input(msg, cfg, state, context, train)
    return _reply(msg, _unmask(cfg, state, context))


def _int(rec: ConfigRecord, key: str) -> int:
    value = rec[key]
    if not isinstance(value, int | float | str) or isinstance(value, bool):
        raise ValueError(f"secagg: {key} is not a number")
    return int(value)


def _bytes(rec: ConfigRecord, key: str) -> bytes:
    value = rec[key]
    if not isinstance(value, bytes):
        raise ValueError(f"secagg: {key} is not bytes")
    return value


def _float(rec: ConfigRecord, key: str) -> float:
    value = rec.get(key, 0.0)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"secagg: {key} is not a number")
    return float(value)


def _reply(msg: Message, record: ConfigRecord) -> Message:
    return Message(RecordDict({wire.SECAGG: record}), reply_to=msg)


def _ids(value: object) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list) else []


def _setup(cfg: ConfigRecord, context: Context, server_round: int) -> ConfigRecord:
    check_first_setup(context, server_round)
    shares, threshold = _int(cfg, p.SHARES), _int(cfg, p.THRESHOLD)
    neighbours = _ids(cfg.get(p.NEIGHBOURS))
    if 2 * threshold <= shares or threshold < 2:  # else two disjoint groups could each rebuild
        raise ValueError(f"secagg: threshold {threshold} of {shares} shares is not above half")
    if context.node_id in neighbours or len(set(neighbours)) != len(neighbours) \
            or len(neighbours) + 1 > shares:
        raise ValueError(f"secagg: {len(neighbours)} neighbours do not fit {shares} shares")
    server = _bytes(cfg, p.SERVER_KEY)
    crypto.public_key(server)
    seed = secrets.token_bytes(crypto.SEED_BYTES)  # the mask key's: Shamir shares it, not the key
    pairs = {p.PK_MASK: crypto.KeyPair.from_seed(seed)}
    pairs.update({p.enc_key(j): crypto.KeyPair() for j in neighbours})  # one per pair: see blame
    context.state[STATE] = ConfigRecord({
        p.ROUND: server_round, p.STAGE: p.SETUP, p.THRESHOLD: threshold, p.NEIGHBOURS: neighbours,
        "mask-seed": seed, **{f"sk-enc:{j}": pairs[p.enc_key(j)].private for j in neighbours}})
    out = ConfigRecord({name: pair.public for name, pair in pairs.items()})
    for name, pair in pairs.items():
        label = p.label(server_round, context.node_id, name)
        out[f"{p.PROOF}:{name}"] = crypto.possession(pair, server, label)
    return out


def _share_keys(cfg: ConfigRecord, state: ConfigRecord, own: int) -> ConfigRecord:
    threshold, neighbours = _int(state, p.THRESHOLD), set(_ids(state[p.NEIGHBOURS]))
    peers = sorted(int(k[len(p.PK_ENC) + 1:]) for k in cfg if k.startswith(p.PK_ENC + ":"))
    if not set(peers) <= neighbours or len(peers) + 1 < threshold:
        raise ValueError(f"secagg: {len(peers)} peers are not {threshold - 1} or more of this node's "
                         "neighbours")
    keys = [_bytes(cfg, f"{p.PK_ENC}:{j}") for j in peers] + [_bytes(cfg, f"{p.PK_MASK}:{j}") for j in peers]
    if len(set(keys)) != len(keys):  # a key seen twice: a server replaying one node's keys
        raise ValueError("secagg: the peers' public keys are not distinct")
    b = secrets.token_bytes(crypto.SEED_BYTES)  # the self-mask's seed
    holders = sorted([*peers, own])
    b_shares = crypto.create_shares(b, threshold, len(holders))
    s_shares = crypto.create_shares(_bytes(state, "mask-seed"), threshold, len(holders))
    out = ConfigRecord({p.COMMIT: crypto.commitment(b)})  # the mask key's is its public key
    for holder, b_share, s_share in zip(holders, b_shares, s_shares, strict=True):
        out[f"{p.HASH_B}:{holder}"] = crypto.share_digest(own, holder, "b", b_share)
        out[f"{p.HASH_S}:{holder}"] = crypto.share_digest(own, holder, "s", s_share)
        if holder == own:
            state["b:self"], state["s:self"] = b_share, s_share
            continue
        # kept: the same pair decrypts the holder's shares to this node in masked-input
        pair = crypto.KeyPair(_bytes(state, f"sk-enc:{holder}"))
        key = state[f"k-enc:{holder}"] = pair.agree(_bytes(cfg, f"{p.PK_ENC}:{holder}"))
        plaintext = crypto.share_keys_plaintext_concat(own, holder, b_share, s_share)
        out[p.key_of(holder)] = crypto.encrypt(key, plaintext)
    for j in peers:
        state[f"pk-mask:{j}"] = cfg[f"{p.PK_MASK}:{j}"]
    state["b"], state["peers"], state[p.STAGE] = b, peers, p.SHARE_KEYS
    return out


def _open(cfg: ConfigRecord, state: ConfigRecord, src: int, own: int) -> tuple[bytes, bytes] | None:
    """The shares `src` sent this node, or None where they do not open, do not name src -> this
    node, or are not the shares src hashed: src's fault, which this node reports (`_check_shares`)."""
    try:
        got_src, got_dst, b_share, s_share = crypto.share_keys_plaintext_separate(
            crypto.decrypt(_bytes(state, f"k-enc:{src}"), _bytes(cfg, f"ct:{src}")))
    except Exception:  # noqa: BLE001 - Fernet's InvalidToken, a short plaintext: all src's doing
        return None
    hashed = (crypto.share_digest(src, own, "b", b_share), crypto.share_digest(src, own, "s", s_share))
    published = (cfg.get(f"{p.HASH_B}:{src}"), cfg.get(f"{p.HASH_S}:{src}"))
    if (got_src, got_dst) != (src, own) or hashed != published:
        return None
    return b_share, s_share


def _check_shares(cfg: ConfigRecord, state: ConfigRecord, own: int) -> ConfigRecord:
    """The shares sent to this node, opened and kept; the blame of those that do not open, each
    with this node's key for that pair alone (the server checks it and learns nothing else).
    However few open, an honest node reports rather than fails: the server removes the senders
    at fault, never this node for their garbage (docs/secagg.md, "Blame")."""
    senders = sorted(int(k[3:]) for k in cfg if k.startswith("ct:") and k[3:].isdigit())
    if not set(senders) <= set(_ids(state["peers"])):
        raise ValueError(f"secagg: shares from nodes {sorted(set(senders) - set(_ids(state['peers'])))[:3]} "
                         "that are not this node's peers")
    blamed = ConfigRecord()
    for src in senders:
        opened = _open(cfg, state, src, own)
        if opened is None:
            blamed[f"{p.BLAME}:{src}"] = _bytes(state, f"sk-enc:{src}")
            continue
        state[f"b:{src}"], state[f"s:{src}"] = opened
    state["opened"] = [j for j in senders if f"{p.BLAME}:{j}" not in blamed]
    state[p.STAGE] = p.CHECK_SHARES
    return blamed


def _masked_input(msg: Message, cfg: ConfigRecord, state: ConfigRecord, context: Context,
                  train: Train) -> Message:
    own, threshold = context.node_id, _int(state, p.THRESHOLD)
    senders = _ids(cfg.get(p.MASK_WITH))
    if not set(senders) <= set(_ids(state["opened"])) or len(senders) + 1 < threshold:
        raise ValueError(f"secagg: asked to mask with {len(senders)} peers, not {threshold - 1} or more "
                         "of those whose shares this node opened")
    note_masked(context, _int(state, p.ROUND))
    del msg.content[wire.SECAGG]  # the training instruction as any round's
    reply = train(msg, context)
    if reply.has_error():
        return reply
    bits, bound = _int(cfg, p.BITS), _int(cfg, p.BOUND)
    recipe = msg.content.config_records.get(wire.RECIPE, ConfigRecord())
    check_layout(_names(cfg), contract_layout(recipe, {name: dict(rec.to_torch_state_dict()) for name, rec
                                                       in reply.content.array_records.items()}))
    total = _masked(reply.content, cfg, state, senders, own, bits, bound,
                    lambda slots: own_noise(recipe, cfg, slots, bits, bound,
                                                          node_settings(context.node_config)))
    metrics = dict(reply.content.metric_records[wire.METRICS])
    for name in [str(s).split("/", 1)[0] for s in _names(cfg) if str(s).endswith("/" + fixedpoint.METRIC)]:
        metrics.pop(name, None)  # averaged through the sum, never sent alone
    state["masked-with"], state[p.STAGE] = senders, p.MASKED_INPUT
    y = Array(total.astype(fixedpoint.wire_dtype(bits)))
    content = RecordDict({wire.MASKED: ArrayRecord({p.MASKED_ARRAY: y}),
                          wire.METRICS: MetricRecord(metrics)})
    if wire.VERSIONS in reply.content.config_records:  # what this node holds (codec/versions.py)
        content[wire.VERSIONS] = reply.content.config_records[wire.VERSIONS]
    return Message(content, reply_to=msg)


def _names(cfg: ConfigRecord) -> list[str]:
    value = cfg.get(p.LAYOUT)
    return [str(v) for v in value] if isinstance(value, list) else []


def _masked(content: RecordDict, cfg: ConfigRecord, state: ConfigRecord, senders: list[int], own: int,
            bits: int, bound: int, noise_of: Callable[[list[fixedpoint.Slot]], float]) -> np.ndarray:
    """y: this reply's shared records in the server's layout, as integers, masked."""
    records = {name: dict(rec.to_torch_state_dict()) for name, rec in content.array_records.items()}
    metrics = {k: v for k, v in content.metric_records[wire.METRICS].items() if isinstance(v, int | float)}
    slots = []
    for entry in _names(cfg):
        record, name = entry.split("/", 1)
        tensor = records.get(record, {}).get(name)
        shape, dtype = ((1,), torch.float64) if tensor is None else (tuple(tensor.shape), tensor.dtype)
        slots.append(fixedpoint.Slot(record, name, shape, dtype, _float(cfg, f"clip:{record}")))
    sent = {f"{s.record}/{s.name}" for s in slots}
    extra = sorted(f"{r}/{n}" for r, arrays in records.items() for n in arrays if f"{r}/{n}" not in sent)
    if extra:  # a record the server would not sum is a record it would never see
        raise ValueError(f"secagg: the reply holds arrays the layout lacks: {extra[:3]}")
    std = noise_of(slots)  # checked before anything is encoded
    q = fixedpoint.encode(records, metrics, slots, bound, _rounding(cfg, own))
    if std > 0.0:  # dp='client': this node's share of the sum's discrete Gaussian noise
        q = q + noise.discrete_gaussian(std, len(q))
    total = fixedpoint.to_ring(q, bits)
    p.add_mask(total, crypto.self_mask_key(_bytes(state, "b")), 1, bits)
    masks = crypto.KeyPair.from_seed(_bytes(state, "mask-seed"))
    for j in senders:
        p.add_mask(total, masks.agree(_bytes(state, f"pk-mask:{j}")), p.pair_sign(own, j), bits)
    return total


def own_noise(recipe: ConfigRecord, cfg: ConfigRecord, slots: list[fixedpoint.Slot], bits: int,
              bound: int, node_config: Mapping[str, Any]) -> float:
    """This node's std of discrete noise, computed from its own floor and the public round
    (docs/secagg.md, "Distributed DP"): every parameter the server sends (the layout's records,
    each range, B, the modulus, n, the noise std) is checked against what the floor needs, and a
    round that asks for less is refused (ValueError, one line). Without dp: the server's std."""
    privacy, sampled = privacy_from_recipe(recipe)
    requested = _float(cfg, p.NOISE_STD)
    shared = _shared_names(recipe) if "algorithm" in recipe else None
    _check_layout(slots, shared)
    reply_z = check_floor(privacy, sampled, node_config)  # the cohort n and z against the floor
    if privacy.dp != "client":
        return requested
    if shared is None:
        raise ValueError("secagg: a dp='client' recipe without its algorithm")
    _check_ranges_and_bound(privacy, slots, bits, bound, sampled, len(shared[0]))
    own = reply_z * fixedpoint.sensitivity(bound, slots)
    if requested < own * (1.0 - 1e-9):
        raise ValueError(f"secagg: noise std {requested:.6g} is below this node's own {own:.6g} "
                         f"(z/√n={reply_z:.4g} of its integers' reach)")
    return max(requested, own)


def _check_layout(slots: list[fixedpoint.Slot], shared: tuple[set[str], set[str]] | None) -> None:
    """The layout masks exactly the algorithm's shared records (its averaged metrics among
    them: one left out would go up in the clear), each with a range > 0."""
    layout = {s.record for s in slots}
    if shared is not None and not (layout <= shared[0] and shared[1] <= layout):
        raise ValueError(f"secagg: the layout's records {sorted(layout)} are not this algorithm's shared "
                         f"records (its averaged metrics {sorted(shared[1])} among them)")
    if not all(math.isfinite(s.clip) and s.clip > 0.0 for s in slots):
        raise ValueError("secagg: a record's range is not a number > 0")


def _check_ranges_and_bound(privacy: Privacy, slots: list[fixedpoint.Slot], bits: int, bound: int,
                            sampled: int, records: int) -> None:
    """Each range at least its record's clipping norm, and B the one this node derives from the
    modulus, n and z (a smaller range or another B would shrink the noise the node adds)."""
    for slot in slots:
        if not slot.clip >= start_bound(privacy, slot.record):
            raise ValueError(f"secagg: the range {slot.clip:g} of {slot.record!r} is below its clipping "
                             f"norm {start_bound(privacy, slot.record):g}: it would shrink the noise")
    expected = fixedpoint.budget(bits, sampled, privacy.dp_noise_multiplier * math.sqrt(records),
                                 fixedpoint.rounding_width(slots)) if 16 <= bits <= 64 else -1
    if bound != expected or bound < fixedpoint.MIN_BOUND:
        raise ValueError(f"secagg: B={bound} at modulus 2^{bits} is not the B of {sampled} nodes at "
                         f"z={privacy.dp_noise_multiplier:g} ({expected}), or below {fixedpoint.MIN_BOUND}")


def _shared_names(recipe: ConfigRecord) -> tuple[set[str], set[str]]:
    """(every record this node's algorithm shares, its averaged metrics), from the recipe's
    algorithm as the node rebuilds it."""
    algorithm = algorithm_from_recipe(recipe)
    metrics = {m.name for s in algorithm.stages() for m in s.up_metrics}
    return {wire.DELTA} | {r.name for s in algorithm.stages() for r in s.records_up()} | metrics, metrics


def _rounding(cfg: ConfigRecord, own: int) -> torch.Generator:
    """The stochastic rounding's generator, seeded by the run seed, the round and the node, so a
    run replays (the masks cancel exactly; only dp's noise is fresh OS entropy)."""
    seed = _int(cfg, p.SEED) if p.SEED in cfg else 0
    digest = hashlib.sha256(f"secagg/{seed}/{_int(cfg, p.ROUND)}/{own}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:7], "little"))


def _unmask(cfg: ConfigRecord, state: ConfigRecord, context: Context) -> ConfigRecord:
    own, threshold = context.node_id, _int(state, p.THRESHOLD)
    active, dead = set(_ids(cfg.get(p.ACTIVE))), set(_ids(cfg.get(p.DEAD)))
    masked_with = set(_ids(state["masked-with"]))
    if active & dead:  # both shares of one node would unmask its input
        raise ValueError(f"secagg: nodes {sorted(active & dead)[:3]} named both alive and dead")
    if own not in active or not (active | dead) <= masked_with | {own} or len(active) < threshold:
        raise ValueError(f"secagg: an unmask request for {len(active)} live nodes (threshold "
                         f"{threshold}) outside this node's neighbourhood")
    out = ConfigRecord()
    for j in active:
        out[f"b:{j}"] = state["b:self" if j == own else f"b:{j}"]
    for j in dead:
        out[f"s:{j}"] = state[f"s:{j}"]
    del context.state[STATE]  # one unmask per round: a second request finds nothing
    return out
