"""SecAgg+ (Bell, Bonawitz, Gascón, Lepoint, Raykova, CCS 2020) as five message exchanges of a
round, each a `secagg` ConfigRecord naming its stage:

    setup         server -> node: the round, shares s, threshold t, the node's neighbours on a
                  random ring (s - 1 of them: the k-regular graph), the round's server key;
                  node -> server: fresh public keys (one per neighbour to encrypt shares, one to
                  derive masks), each with a proof that the node holds it
    share-keys    server -> node: its live neighbours' public keys; node -> server: its self-mask
                  seed b and its mask key's seed, each Shamir-shared t-of-s, one share of each
                  encrypted for each neighbour, the hash of every share (owner, holder), and a
                  commitment to b
    check-shares  server -> node: the encrypted shares sent to it, with their owners' hashes;
                  node -> server: for each it cannot open (or that are not as hashed), that
                  pair's private key (the server checks the blame: the sender's fault or the
                  accuser's); a node named here leaves before any input is masked, and the
                  round starts again from setup without it
    masked-input  server -> node: the round's training instruction and the peers to mask with
                  (its live neighbours, all of whose shares it opened); node -> server:
                  y = q + PRG(b) + Σ_j ±PRG(K_ij) mod 2^m (fixedpoint.py's q)
    unmask        server -> node: which neighbours sent y (whose b-shares it wants) and which
                  did not (whose mask-key shares it wants); an honest node refuses a list that
                  names one node in both, and answers once per round; each share is checked
                  against its owner's hash

The server then rebuilds each live node's b and each dead node's mask key from t shares,
removes their masks, and has the sum of the live nodes' q; it never holds one node's q alone.
"""

from __future__ import annotations

import random

import numpy as np

from adaptfl.secagg import crypto

SETUP, SHARE_KEYS, CHECK_SHARES = "setup", "share-keys", "check-shares"
MASKED_INPUT, UNMASK = "masked-input", "unmask"
STAGES = (SETUP, SHARE_KEYS, CHECK_SHARES, MASKED_INPUT, UNMASK)
STAGE, ROUND = "stage", "round"
SHARES, THRESHOLD, NEIGHBOURS = "shares", "threshold", "neighbours"
PK_ENC, PK_MASK = "pk-enc", "pk-mask"
BOUND, BITS, NOISE_STD, LAYOUT, SEED = "bound", "bits", "noise-std", "layout", "seed"
ACTIVE, DEAD = "active", "dead"
COMMIT = "commit-b"  # share-keys reply: SHA-256 of the self-mask seed, checked after rebuilding
SERVER_KEY = "server-pk"  # setup: the round's server key, which the proofs of possession use
PROOF = "proof"  # setup reply: proof:<key name> for each public key
HASH_B, HASH_S = "hb", "hs"  # share-keys reply: hb:<holder>, hs:<holder>, each share's SHA-256
BLAME = "blame"  # check-shares reply: blame:<sender> = this node's private key for that pair
MASK_WITH = "mask-with"  # masked-input: the peers whose pair masks go into y
MASKED_ARRAY = "y"


def ring_neighbours(nodes: list[int], shares: int, seed: int) -> dict[int, set[int]]:
    """Each node's neighbours: the (shares-1)//2 on each side of it on a seeded random ring (all
    others when the ring is no larger than `shares`)."""
    order = sorted(nodes)
    random.Random(seed).shuffle(order)
    n, half = len(order), (shares - 1) // 2
    if shares >= n:
        return {node: set(order) - {node} for node in order}
    return {node: {order[(i + o) % n] for o in range(-half, half + 1)} - {node}
            for i, node in enumerate(order)}


def pair_sign(own: int, other: int) -> int:
    """+1 if `own` adds the pair's mask, -1 if it subtracts it: the pair's two masks cancel."""
    return 1 if own < other else -1


def key_of(node: int, prefix: str = "") -> str:
    return f"{prefix}{node}"


def add_mask(total: np.ndarray, key: bytes, sign: int, bits: int) -> None:
    """total += sign · PRG(key) mod 2^bits, in place (uint64)."""
    m = crypto.mask(key, len(total), bits)
    if sign > 0:
        total += m
    else:
        total -= m
    if bits < 64:
        total &= np.uint64((1 << bits) - 1)


def enc_key(peer: int) -> str:
    """The setup reply's key name of the public key that encrypts shares to and from `peer`."""
    return f"{PK_ENC}:{peer}"


def label(server_round: int, node: int, name: str) -> bytes:
    """What a proof of possession binds a key to: the round, the node and the key's name."""
    return f"adaptfl-secagg+/{server_round}/{node}/{name}/".encode()
