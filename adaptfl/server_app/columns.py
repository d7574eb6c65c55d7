"""Every column of a round's row (`metrics.jsonl`, `metrics.csv`), declared once: docs/metrics.md's
table is generated from it (`python scripts/regenerate_docs.py`) and
tests/server_app/test_columns.py fails on a built-in column that is not here. A client's own
extra numeric metric is averaged into the row under its own name and is not listed."""

from __future__ import annotations

PAGE = "docs/metrics.md"
HEADER = "| column | file | meaning |"
END = "<!-- end of column table -->"
JSONL = "jsonl"  # nested values: in metrics.jsonl only (metrics.csv keeps the flat columns)

# name -> (where it appears: "both" or JSONL, meaning)
COLUMNS: dict[str, tuple[str, str]] = {
    "round": ("both", "the round; 0 is the initial model's evaluation (before any training)"),
    "test-accuracy": ("both", "the server's evaluation of the global model on the task's test split "
                      "(token accuracy for language tasks: docs/llm-lora.md)"),
    "test-loss": ("both", "the same evaluation's mean loss"),
    "test-perplexity": ("both", "language tasks: exp(test-loss)"),
    "test-response-nll": ("both", "sft tasks: the mean over examples of each response's mean token NLL"),
    "fed-eval-accuracy": ("both", "fraction-evaluate > 0: the global model's accuracy on the sampled "
                          "clients' own held-out splits, their mean weighted by num-examples after "
                          "cutting fed-eval-trimmed-per-end values at each end (docs/metrics.md, "
                          "'Federated evaluation')"),
    "fed-eval-loss": ("both", "the same evaluation's mean loss, trimmed and weighted alike"),
    "fed-eval-accuracy-p10": ("both", "the worst decile: the 10th percentile of the clients' "
                              "fed-eval accuracies kept after the cut, each client once (numpy's "
                              "linear percentile)"),
    "fed-eval-personal-accuracy": ("both", "the same clients' locally adapted models (the global model "
                                   "after evaluate-local-steps local steps, or K, on their train "
                                   "split): their accuracy, weighted by num-examples"),
    "fed-eval-personal-loss": ("both", "the locally adapted models' mean loss, weighted alike"),
    "fed-eval-personal-accuracy-p10": ("both", "the 10th percentile of the clients' personalised "
                                       "accuracies"),
    "fed-eval-sampled": ("both", "nodes sent an evaluate message this round"),
    "fed-eval-bytes-down": ("both", "bytes of the evaluate messages' arrays as they go over the wire "
                            "(the global model to each of fed-eval-sampled; not in bytes-down, which "
                            "counts training's); the replies carry a few scores"),
    "fed-eval-replies": ("both", "evaluate replies that entered the fed-eval values"),
    "fed-eval-seconds": ("both", "the round's federated evaluation alone (sending to the last reply)"),
    "fed-eval-trimmed-per-end": ("both", "replies cut at each end of every fed-eval score before its "
                                 "mean and decile: ceil(hostile-fraction × replies), at least 1, at "
                                 "most (replies − 1) / 2 (0 for one or two replies)"),
    "fed-eval-weights-capped": ("both", "evaluate replies whose num-examples claim was capped "
                                "(max-weight-ratio × the round's median claim)"),
    "fed-eval-clients": (JSONL, "partition -> its evaluate reply's values (num-examples, node-id, "
                         "eval-accuracy, eval-loss, personal-accuracy, personal-loss; node-<id> for a "
                         "reply without a partition id of its own); under dp in "
                         "server-confidential.jsonl only, as every fed-eval column"),
    "non-finite": (JSONL, "key paths of the row whose value was not a finite number, written as null "
                   "(JSON has no Infinity or NaN: core/json_rows.py); absent when none"),
    "fed-eval-rejected": (JSONL, "node -> why its evaluate reply was dropped; absent when none"),
    "lr": ("both", "the round's lr, as the clients stepped with it: lr after lr-schedule, or the lr "
           "the train config gave the round (docs/own-app.md, 'Learning-rate schedules'); not "
           "released under dp"),
    "train-loss": ("both", "the clients' mean local training loss over their K steps (weighted as "
                   "the aggregate)"),
    "direction-consistency": ("both", "mean over the accepted replies of cos(Δ_i, mean Δ) (seed 000, "
                              "appendix A)"),
    "pos-ratio": ("both", "PosRatio of the trust scores s = u ⊙ g, the clients' mean over the steps "
                  "measured (diagnostics-every)"),
    "top-mass": ("both", "TopMass_0.01 of the trust scores, the clients' mean (same steps)"),
    "preconditioner-drift": ("both", "Θ sharing (FedPAC, FedMIX-P): mean ‖Θ_i − Θ̄‖² over the replies"),
    "theta-compression": ("both", "Θ sharing: bytes of the uploaded Θ_i over a full Θ_i (1: none; "
                          "light=true compresses)"),
    "f-hat": ("both", "HaFedHo: the clients' mean f̂_i (mean local loss)"),
    "rectified-loss": ("both", "HaFedHo: the clients' mean of the rectified objective φ_i over the steps"),
    "took-part-last-round": ("both", "HaFedHo: share of the replies whose client took part in the "
                             "round before (its participation rule)"),
    "local-state-source": ("both", "local-state='persist' (DiLoCo): mean of where each kept inner "
                           "optimizer state came from (0 none, 1 memory, 2 disk); per client "
                           "under `clients`"),
    "peak-memory-mb": ("both", "the largest client peak memory this round (CUDA max allocated, else "
                       "the process's peak RSS); per client under `clients`"),
    "local-steps": ("both", "local-epochs: the clients' mean K (each ran ceil(E·rows/batch-size) "
                    "steps; the server divides each reply by its own)"),
    "step-path": ("both", "the local-step paths the accepted replies took: native, eager, cuda, "
                  "cohort-grouped, cohort-vmap or cohort-loop (python -m adaptfl.engine --cohort: "
                  "the clients' steps stacked, their gradients by one grouped model, by vmap or "
                  "client by client), or e.g. eager+native where they differ"),
    "cohort-size": ("both", "python -m adaptfl.engine --cohort: the most clients whose steps ran "
                    "stacked together this round; absent one client at a time"),
    "replies-sampled": ("both", "nodes sampled this round"),
    "replies-accepted": ("both", "replies that entered the aggregate"),
    "replies-rejected": ("both", "replies dropped, each with its reason under `rejected`"),
    "replies-screened": ("both", "replies dropped by the screen (screen-ratio: a shared record's "
                         "norm against the round's median or the screen reference)"),
    "replies-missing": ("both", "sampled nodes that sent nothing within round-timeout (under `missing`)"),
    "replies-clipped": ("both", "replies pulled back to the contribution bound (max-contribution-"
                        "ratio: their weighted deviation from the round's coordinate-wise median); "
                        "absent when none"),
    "weights-capped": ("both", "replies whose num-examples claim was capped (max-weight-ratio, "
                       "max-weight-share); absent when none"),
    "screen-ratio-max": ("both", "the largest norm ratio to the median among the replies kept"),
    "latency-max": ("both", "seconds from an instruction's creation to its reply, the slowest reply "
                    "decoded (hosts' clocks may differ in a deployment)"),
    "bytes-down": ("both", "bytes sent to the sampled nodes as they go over the wire (the model and the "
                   "records sent down, encoded; a record a node holds at its version is not sent)"),
    "bytes-up": ("both", "bytes of the accepted replies' records as they came over the wire"),
    "compression-ratio": ("both", "with a lossy codec: the round's bytes (both directions, the model "
                          "included) at fp32 over its bytes on the wire; absent under fp32"),
    "codec-warmup": ("both", "with codec-warmup=R: 1 in rounds 1..R (every shared record at "
                     "codec-warmup-codec), 0 after; absent without"),
    "ef-residual-norm": ("both", "with error feedback (+ef): the clients' mean ‖residual‖ after their "
                         "reply (what is still to be sent)"),
    "skipped": ("both", "true when the round changed nothing (too few replies, or the round refused)"),
    "skip-reason": ("both", "why a skipped round changed nothing; absent otherwise"),
    "seconds": ("both", "the whole round, evaluation included"),
    "eval-seconds": ("both", "the round's central evaluation alone"),
    "server-rss-mb": ("both", "the server process's resident memory after the round"),
    "dp-epsilon": ("both", "dp: ε spent so far at dp-delta (privacy/accountant.py)"),
    "dp-epsilon-ledger": ("both", "dp with dp-ledger: ε of every run in the ledger, this round included"),
    "dp-noise-multiplier": ("both", "dp: the round's accounted noise multiplier z (dp='client': "
                            "z·√(m/n) at m = min-replies, the least a released round has)"),
    "dp-ledger-file": (JSONL, "dp: the ledger dp-epsilon-ledger is the total of (dp-ledger, else the "
                       "data's per-user ledger: privacy/ledger.py); server-confidential.jsonl only"),
    "dp-noise-std": ("both", "dp='central': the std of the noise on Δ's mean (server-confidential.jsonl "
                     "only: it tells m)"),
    "dp-clip-norm": ("both", "dp: Δ's clipping norm this round (moves with adaptive clipping)"),
    "dp-unclipped-share": ("both", "dp, adaptive clipping: the noised share of replies within their norm"),
    "secagg-suspects": (JSONL, "secagg+: the nodes in some set of at most secagg-liars nodes that "
                        "explains every sum out of reach, while the search runs (docs/secagg.md, 'An "
                        "input out of range'); absent otherwise"),
    "secagg-excluded": (JSONL, "secagg+: node -> why it is left out of every later round (the search "
                        "named it: it is in every set of at most secagg-liars nodes meeting each "
                        "cohort whose sum was out of reach); absent while none"),
    "secagg-narrowed": ("both", "secagg+: true on a skipped round whose sum out of reach ruled out an "
                        "explanation or named a node (max-skipped-rounds does not count it); absent "
                        "otherwise"),
    "secagg-search-stopped": (JSONL, "secagg+: why the search names nobody more: no secagg-liars "
                              "nodes explain the sums out of reach (more liars than declared), or "
                              "finding the sets that do takes more than its cap; absent otherwise"),
    "rejected": (JSONL, "node -> the reason its reply was dropped"),
    "bytes": (JSONL, "{down, up}: record -> its bytes on the wire this round, all messages together "
              "(the model is `arrays`)"),
    "missing": (JSONL, "the sampled nodes that sent nothing"),
    "latency": (JSONL, "node -> seconds to its reply"),
    "clients": (JSONL, "partition -> where each accepted reply's client ran and its state came from "
                "(node-id, ray-node, client-state and local-state-source: 0 none, 1 memory, 2 disk, "
                "peak-memory-mb, step-path)"),
}


def column_table() -> str:
    rows = [HEADER, "|---|---|---|"]
    for name, (where, meaning) in COLUMNS.items():
        rows.append(f"| `{name}` | {'both' if where == 'both' else 'metrics.jsonl'} | {meaning} |")
    return "\n".join(rows) + "\n"
