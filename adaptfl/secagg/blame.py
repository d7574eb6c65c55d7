"""Who sent garbage in a SecAgg+ round: the server's checks that name the node at fault, never
its victim, whatever order the replies come in (crypto.py, "blame").

    setup         each public key comes with a proof that its node holds the private key; a
                  key without one, or one two nodes both prove (each knows a secret an honest
                  node never shows), names its node(s)
    check-shares  a node that cannot open a ciphertext hands the server that pair's private
                  key; the server checks it is the key the node signed up with, opens the
                  ciphertext itself and names the sender if it does not open, names the wrong
                  pair or holds other shares than the sender hashed, and the accuser otherwise
    unmask        each returned share against its owner's hash for that holder: a changed one
                  names its holder; a secret rebuilt from shares that all match its owner's
                  hashes and still failing its commitment names its owner
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import ConfigRecord

from adaptfl.secagg import crypto
from adaptfl.secagg import protocol as p

Digests = dict[tuple[str, int], bytes]  # (kind b or s, holder) -> SHA-256 of that share


def signed_up_keys(rec: ConfigRecord, node: int, neighbours: set[int], server: crypto.KeyPair,
                   server_round: int) -> tuple[dict[int, bytes], bytes] | str:
    """(its encryption key for each neighbour, its mask key), or why not: a key missing, not an
    X25519 key, or without the proof that `node` holds it."""
    names = [p.PK_MASK, *(p.enc_key(j) for j in sorted(neighbours))]
    if set(rec) != set(names) | {f"{p.PROOF}:{n}" for n in names}:
        return "not one public key per neighbour and a mask key, each with its proof"
    for name in names:
        key, proof = rec[name], rec[f"{p.PROOF}:{name}"]
        try:
            valid = isinstance(key, bytes) and isinstance(proof, bytes) and \
                crypto.holds(server, key, p.label(server_round, node, name), proof)
        except ValueError:
            valid = False
        if not valid:
            return f"{name} is no key this node proves it holds"
    return {j: bytes(rec[p.enc_key(j)]) for j in neighbours}, bytes(rec[p.PK_MASK])  # type: ignore[arg-type]


def shared_keys(keys: Mapping[int, list[bytes]]) -> dict[int, str]:
    """Nodes whose proven keys repeat (their own, or another's): each holds a secret that an
    honest node generates fresh and never shows, so each is at fault."""
    why = {n: "setup: the same public key twice" for n, held in keys.items() if len(set(held)) != len(held)}
    owners: dict[bytes, set[int]] = {}
    for node, held in keys.items():
        for key in set(held):
            owners.setdefault(key, set()).add(node)
    for nodes in (n for n in owners.values() if len(n) > 1):
        why.update({n: f"setup: a public key nodes {sorted(nodes)} all prove they hold" for n in nodes})
    return why


def at_fault(accuser: int, accused: int, private: object, enc: Mapping[int, Mapping[int, bytes]],
             sealed: Mapping[int, Mapping[int, bytes]], digests: Mapping[int, Digests]) -> tuple[int, str]:
    """(the node at fault, why) for `accuser`'s report that `accused`'s ciphertext to it does
    not open, checked with the pair key `private` it revealed."""
    if accused not in sealed or accuser not in sealed[accused]:
        return accuser, f"check-shares: blamed node {accused}, which sent it nothing"
    try:
        pair = crypto.KeyPair(private if isinstance(private, bytes) else b"")
    except ValueError:
        pair = None
    if pair is None or pair.public != enc[accuser].get(accused):
        return accuser, f"check-shares: blamed node {accused} with a key it did not sign up with"
    try:
        src, dst, b_share, s_share = crypto.share_keys_plaintext_separate(
            crypto.decrypt(pair.agree(enc[accused][accuser]), sealed[accused][accuser]))
    except Exception:  # noqa: BLE001 - Fernet's InvalidToken: garbage from the sender
        return accused, f"check-shares: its shares to node {accuser} do not decrypt"
    if (src, dst) != (accused, accuser):
        return accused, f"check-shares: its shares to node {accuser} name {src} -> {dst}"
    mine = digests[accused]
    hashed = (crypto.share_digest(accused, accuser, "b", b_share),
              crypto.share_digest(accused, accuser, "s", s_share))
    if hashed != (mine.get(("b", accuser)), mine.get(("s", accuser))):
        return accused, f"check-shares: its shares to node {accuser} are not the ones it hashed"
    return accuser, f"check-shares: blamed node {accused}, whose shares to it open as hashed"


def returned_shares(replies: Mapping[int, ConfigRecord], wanted: Mapping[str, set[int]],
                    may_hold: Mapping[int, set[int]], digests: Mapping[int, Digests]
                    ) -> tuple[dict[str, dict[int, list[tuple[int, bytes]]]], dict[int, str]]:
    """({kind: {owner: [(holder, share)] by holder}}, {holder at fault: why}): the unmask
    answers, each share checked against its owner's hash for that holder; a holder that
    returned a changed share is named, and only the shares that match their owners' hashes are
    used. Ordered by holder, not by arrival: the secret rebuilt does not depend on reply order."""
    got: dict[str, dict[int, list[tuple[int, bytes]]]] = {k: {o: [] for o in owners}
                                                          for k, owners in wanted.items()}
    bad: dict[int, str] = {}
    for holder, rec in sorted(replies.items()):
        for key, share in sorted(rec.items()):
            kind, _, of = key.partition(":")
            if kind not in got or not of.isdigit() or int(of) not in got[kind] \
                    or int(of) not in may_hold[holder] or not isinstance(share, bytes):
                continue
            owner = int(of)
            if crypto.share_digest(owner, holder, kind, share) != digests[owner].get((kind, holder)):
                bad.setdefault(holder, f"unmask: returned a share of node {owner}'s {kind}-secret other "
                                       "than the one it was given")
                continue
            got[kind][owner].append((holder, share))
    return got, bad
