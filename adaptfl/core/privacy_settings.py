"""The `dp*` keys, declared once: user-level differential privacy over everything a client shares.

    dp                     none | central (the server clips and noises) | client (each client
                           clips and adds its share of the noise before replying)
    dp-noise-multiplier    z: the accounted noise multiplier of one round's release
    dp-clip-norm           C_Δ, Δ's clipping norm (the start value when adaptive)
    dp-state-clip-norm     C_s, the clipping norm of every other shared record (v, Θ_i, Δc,
                           ∇f_i(x), f̂_i), each on its own (the start value when adaptive)
    dp-clip-lr             η of C <- C·exp(-η(b̃ - γ)) per record (0: fixed clipping)
    dp-clip-quantile       γ, the quantile of the norms each C tracks (adaptive)
    dp-count-stddev        σ_b of the noised clipped counts (0: m/20, Andrew et al.'s choice)
    dp-delta               δ of the (ε, δ) reported
    dp-target-epsilon      ε the run may spend (0: none) and `dp-on-target`: refuse to start when
                           the planned rounds exceed it, or stop before the round that would
    dp-num-clients         N for the refusal before Flower starts (0: the nodes at round 1)
    dp-accept-epsilon      without a target, the largest planned ε a run may start with: a plan
                           above it is refused before round 1 with its numbers and the ways out
    dp-accounting          the bound: without-replacement (fixed-size sampling, what the strategy
                           does) or no-amplification (Flower's fixed-clipping accountant)
    dp-ledger              absolute path of a JSON-lines file every run on the same data appends
                           its rounds' events to, for ε over all of them (privacy/ledger.py);
                           empty: the data's own ledger in a per-user place. The server's alone:
                           never sent to a client
    dp-seed                -1: noise from the OS CSPRNG; >= 0: reproducible noise, which anyone
                           who knows the seed can subtract: refused unless
    dp-testing-reproducible-noise  is true, the switch that says the run is a test, not private
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from adaptfl.core.params import Component, component, param

MODES = ("none", "central", "client")
ON_TARGET = ("refuse", "stop")
ACCOUNTING = ("without-replacement", "no-amplification")
# not in a client's recipe: a path on the server's machine, a bound the server checks alone
SERVER_ONLY = ("dp-ledger", "dp-accept-epsilon")


@component("settings", "privacy")
@dataclass(frozen=True)
class Privacy(Component):
    """User-level DP (McMahan et al. 2018; adaptive clipping: Andrew et al. 2021)."""

    dp: str = param("none", "differential privacy over every record a client shares: none, "
                    "central (server clips and noises) or client (clients clip and noise)",
                    choices=MODES)
    dp_noise_multiplier: float = param(1.0, "z: noise std / sensitivity of one round's release",
                                       within=(0.0, None), open_low=True)
    dp_clip_norm: float = param(1.0, "C_Δ: clipping norm of Δ (the start value when dp-clip-lr > 0)",
                                within=(0.0, None), open_low=True)
    dp_state_clip_norm: float = param(1.0, "C_s: clipping norm of each other shared record (v, "
                                      "Θ_i, Δc, ∇f_i(x), f̂_i), each on its own",
                                      within=(0.0, None), open_low=True)
    dp_clip_lr: float = param(0.0, "η of the adaptive C <- C·exp(-η(b̃ - γ)) per record, b̃ the "
                              "noised share not clipped; 0: fixed clipping", within=(0.0, None),
                              sane=(0.0, 10.0))
    dp_clip_quantile: float = param(0.5, "γ: the quantile of the norms an adaptive C tracks",
                                    within=(0.0, 1.0))
    dp_count_stddev: float = param(0.0, "σ_b: noise std of the clipped counts (adaptive); 0: "
                                   "replies/20", within=(0.0, None))
    dp_delta: float = param(1e-5, "δ of the (ε, δ) guarantee reported", within=(0.0, 1.0),
                            open_low=True, open_high=True)
    dp_target_epsilon: float = param(0.0, "ε the run may spend; 0: no target", within=(0.0, None))
    dp_on_target: str = param("refuse", "when the planned rounds exceed dp-target-epsilon: refuse "
                              "(before round 1) or stop (before the round that would exceed it)",
                              choices=ON_TARGET)
    dp_num_clients: int = param(0, "N, the nodes sampled from, for the target check before Flower "
                                "starts; 0: checked at round 1 with the connected nodes",
                                within=(0, None))
    dp_accept_epsilon: float = param(10.0, "without dp-target-epsilon, the largest planned ε (all "
                                     "rounds, at dp-delta) a run may start with; above it the run "
                                     "is refused before round 1 with the numbers and the ways out; "
                                     "set it higher to accept a weaker guarantee",
                                     within=(0.0, None), open_low=True)
    dp_accounting: str = param("without-replacement", "the privacy bound: without-replacement "
                               "(fixed-size sampling, replace-one) or no-amplification (add/remove "
                               "one, as Flower's fixed-clipping accountant)", choices=ACCOUNTING)
    dp_ledger: str = param("", "absolute path of the JSON-lines ledger of every run on the same "
                           "data (privacy/ledger.py): each round's event is appended and "
                           "dp-epsilon-ledger is ε over all of them; empty: the data's own "
                           "ledger, <per-user dir>/<task>-<fingerprint>.jsonl")
    dp_seed: int = param(-1, "-1: noise from the OS CSPRNG; >= 0: reproducible noise (anyone who "
                         "knows the seed can remove it): needs dp-testing-reproducible-noise",
                         within=(-1, None))
    dp_testing_reproducible_noise: bool = param(False, "TESTING ONLY: allow dp-seed >= 0; the run's "
                                                "noise can then be subtracted and it is not private")

    @property
    def on(self) -> bool:
        return self.dp != "none"

    @property
    def adaptive(self) -> bool:
        return self.dp_clip_lr > 0.0

    def check(self) -> None:
        if self.dp_ledger and not os.path.isabs(os.path.expanduser(self.dp_ledger)):
            raise ValueError(f"dp-ledger={self.dp_ledger!r} must be an absolute path: the ServerApp "
                             "runs in the SuperLink's working directory")
        if self.dp_seed >= 0 and not self.dp_testing_reproducible_noise:
            raise ValueError(f"dp-seed={self.dp_seed}: a known seed lets anyone subtract the noise; "
                             "set dp-testing-reproducible-noise=true (tests only, not private) or "
                             "drop dp-seed")
        if self.dp == "client" and self.adaptive:
            raise ValueError("dp='client' with dp-clip-lr > 0: adaptive clipping needs the clients' "
                             "clipped counts, which dp='client' does not send; use dp-clip-lr=0 "
                             "or dp='central'")
