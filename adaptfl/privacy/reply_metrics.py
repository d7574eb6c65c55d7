"""What a node's training reply carries under dp='client', value by value, declared once here
(docs/privacy.md's table "What a node returns" is generated from `VALUES`).

Every value the node computes from its rows either goes through the Gaussian mechanism with the
update (the algorithm's averaged metrics, noised by `privatize` and counted by the node's
ledger) or does not leave the node: the training loss and the optimizer's diagnostics are exact
functions of the rows (removing one row moves them), and the row count is the node's data, so
`num-examples` goes up as 1 (dp='client' weights uniformly: algorithms/privacy_checks.py).
What remains names the node or the machinery, never its rows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from adaptfl.core import wire


@dataclass(frozen=True)
class ReplyValue:
    key: str
    treatment: str  # "sent", "sent as 1", "noised", "not sent"
    why: str


VALUES = (
    ReplyValue(wire.PARTITION_ID, "sent", "who the node is: the server knows whom it asked"),
    ReplyValue(wire.STEP_PATH, "sent", "which code path ran the steps (device, compiler), not the rows"),
    ReplyValue(wire.COHORT_SIZE, "sent", "how many clients the in-process engine stacked"),
    ReplyValue(wire.RAY_NODE, "sent", "the simulation's Ray node"),
    ReplyValue(wire.CLIENT_STATE, "sent", "where its state came from: whether it took part before, "
               "which the server knows"),
    ReplyValue(wire.NUM_EXAMPLES, "sent as 1", "its row count is its data; dp='client' weights uniformly"),
    ReplyValue("(the algorithm's averaged metrics, e.g. HaFedHo's f̂_i)", "noised",
               "clipped and noised with the update, one mechanism (privacy/mechanism.py)"),
    ReplyValue(wire.TRAIN_LOSS, "not sent", "the mean loss over its rows: one row moves it"),
    ReplyValue(wire.PEAK_MEMORY, "not sent", "grows with its batches' shapes (sequence lengths)"),
    ReplyValue(wire.LOCAL_STEPS, "not sent", "K from local-epochs is its row count over the batch "
               "size (local-epochs is refused under dp='client')"),
    ReplyValue("(every other metric: optimizer diagnostics, the ClientApp's own)", "not sent",
               "computed from its gradients or rows, no noise covers them"),
)
SENT = frozenset(v.key for v in VALUES if v.treatment == "sent")
TABLE_HEADER = "| reply value | under dp='client' | why |"
TABLE_END = "<!-- end of reply-value table -->"


def reply_table() -> str:
    """docs/privacy.md's table of `VALUES` (scripts/regenerate_docs.py writes it)."""
    rows = [f"| {v.key if v.key.startswith('(') else f'`{v.key}`'} | {v.treatment} | {v.why} |"
            for v in VALUES]
    return "\n".join([TABLE_HEADER, "|---|---|---|", *rows]) + "\n\n"


def released_metrics(values: Mapping[str, int | float], noised: Collection[str]) -> dict[str, int | float]:
    """The reply's metrics under dp='client': the noised shared ones, the `sent` ones, and
    num-examples as 1; nothing else (the reply's own `metrics=` included)."""
    out = {k: v for k, v in values.items() if k in SENT or k in noised}
    out[wire.NUM_EXAMPLES] = 1
    return out
