"""Run settings that are not part of an algorithm: the federation, the local training, the data,
where outputs go and what runs where. Declared like every component (params.py), so their keys,
checks and docs come from here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from adaptfl.algorithms.lr_schedule import SCHEDULES, check_schedule, parse_milestones, round_lr_scale
from adaptfl.core.params import Component, component, param

PARTITIONINGS = ("dirichlet", "iid", "pathological", "natural-id")
_OUTPUTS = "start() returns Flower's Result; write your outputs from it"
MIN_ROUND_TIMEOUT = 1.0  # s; below it every round of a real deployment times out (3 s polls)
MIN_SCREEN_RATIO = 2.0  # below it, the screen would drop honest replies near the median


@component("settings", "federation")
@dataclass(frozen=True)
class Federation(Component):
    """Rounds, sampling, how replies are weighted and bounded."""

    num_server_rounds: int = param(20, "number of rounds", within=(1, None))
    fraction_train: float = param(1.0, "share of the connected nodes sampled per round",
                                  within=(0.0, 1.0), open_low=True)
    fraction_evaluate: float = param(0.0, "federated evaluation: share of the connected nodes "
                                     "sampled after each round to evaluate the global model, and "
                                     "their locally adapted one, on their own held-out split "
                                     "(docs/metrics.md, 'Federated evaluation'); 0: central "
                                     "evaluation only", within=(0.0, 1.0))
    evaluate_local_steps: int = param(0, "federated evaluation's personalised model: the global "
                                      "model after this many local steps of the round's optimizer "
                                      "on the client's train split; 0: the round's K",
                                      within=(0, None))
    min_replies: int = param(1, "below this many replies from the sampled nodes (late, missing "
                             "and failed ones do not count; ones the checks set aside do) a round "
                             "leaves the state unchanged", within=(1, None))
    weighting: str = param("examples", "weights of the means over replies: examples (sample count) "
                           "or uniform", choices=("examples", "uniform"))
    round_timeout: float = param(600.0, "seconds to wait for a round's replies (later ones are "
                                 "dropped); 0: no limit (a silent node stalls the run)",
                                 within=(0.0, None), loop_only="start(timeout=...)")
    node_wait: float = param(300.0, "seconds to wait for enough connected nodes before a round "
                             "(min-replies after fraction-train); then the run aborts",
                             within=(1.0, None))
    max_reply_mb: float = param(0.0, "replies larger than this are dropped; 0: the size the "
                                "algorithm's contract gives a reply (its arrays' bytes plus headers)",
                                within=(0.0, None))
    max_weight_share: float = param(1.0, "largest share of one reply in a weighted mean (1: no "
                                    "cap); claims of num-examples above it are capped",
                                    within=(0.0, 1.0), open_low=True)
    max_weight_ratio: float = param(10.0, "cap each reply's weight (its num-examples) at this many "
                                    "times the round's median weight (0: off)", within=(0.0, None))
    hostile_fraction: float = param(0.0, "the share of each round's sampled replies the run must "
                                    "survive as hostile: sizes trimmed-mean's cut and Krum's f "
                                    "each round, ceil(share × sampled), and refuses an aggregator "
                                    "or min-replies that cannot (0: their own trim-fraction, "
                                    "krum-byzantine)", within=(0.0, 0.5), open_high=True)
    screen_ratio: float = param(10.0, "drop a reply whose norm in some shared record (Δ, each "
                                "upload) exceeds this many times the median of the round's "
                                "other replies' (a lone reply: of the last 32 kept replies'; its "
                                "capped weight × norm if its claim was capped); 0: off",
                                within=(0.0, None))
    max_contribution_ratio: float = param(2.0, "clip each reply's weighted deviation from the round's "
                                          "coordinate-wise median (its weight over the median weight × "
                                          "the distance of its Δ, and Δc) to this many times the round's "
                                          "median one; in a round of one or two replies, its weighted size "
                                          "to the median of the last 32 kept replies' (docs/robustness.md, "
                                          "'Contribution bound'); 0: off",
                                          within=(0.0, None))
    accept_small_rounds: bool = param(False, "run rounds that sample fewer than 3 nodes (a "
                                      "federation of two, fraction-train × few nodes); refused "
                                      "before round 1 without it: no round median bounds a hostile "
                                      "reply there (docs/robustness.md, 'Rounds of one and two "
                                      "replies')")
    max_skipped_rounds: int = param(3, "abort the run (non-zero exit) after this many consecutive "
                                    "skipped or refused rounds (also under Flower's Strategy.start)",
                                    within=(1, None))
    skip_window: int = param(0, "abort also when max-skipped-rounds of the last this many rounds "
                             "were skipped or refused, consecutive or not (0: 2 × max-skipped-rounds)",
                             within=(0, None))
    seed: int = param(42, "seed of the model, the partitions, the client sampling and the batches",
                      within=(0, None))
    partition_map: str = param("", "node-id:partition-id pairs, comma-separated (e.g. '11:0,12:1'): "
                               "the only partition id each listed node may claim, and no other node "
                               "may reply; empty: bound from the claims (docs/robustness.md, "
                               "'Partition ownership')")

    def check(self) -> None:
        parse_partition_map(self.partition_map)  # a malformed map stops the run before round 1
        if self.evaluate_local_steps and not self.fraction_evaluate:
            raise ValueError(f"evaluate-local-steps={self.evaluate_local_steps} is read only by "
                             "federated evaluation: set fraction-evaluate > 0, or remove it")
        if 0.0 < self.round_timeout < MIN_ROUND_TIMEOUT:
            raise ValueError(f"invalid round-timeout={self.round_timeout!r}: no round answers within "
                             f"{self.round_timeout:g} s; use >= {MIN_ROUND_TIMEOUT:g} s, or 0 (no limit)")
        if 0.0 < self.screen_ratio < MIN_SCREEN_RATIO:
            # below 2, honest replies a little above the round's median would be dropped
            raise ValueError(f"invalid screen-ratio={self.screen_ratio!r}: it would drop honest replies "
                             f"near the round's median; use >= {MIN_SCREEN_RATIO:g}, or 0 (off)")
        if 0.0 < self.max_contribution_ratio < 1.0:
            raise ValueError(f"invalid max-contribution-ratio={self.max_contribution_ratio!r}: below 1 it "
                             "clips the round's median reply itself; use >= 1, or 0 (off)")


def parse_partition_map(text: str) -> dict[int, int]:
    """node id -> partition id of a `partition-map` ('' : {}); a one-line ValueError naming the
    first bad pair, a node listed twice or a partition given to two nodes."""
    mapping: dict[int, int] = {}
    for pair in (p.strip() for p in text.replace(" ", ",").split(",")):
        if not pair:
            continue
        node, sep, pid = pair.partition(":")
        if not sep or not node.strip().isdigit() or not pid.strip().isdigit():
            raise ValueError(f"invalid partition-map: {pair!r} is not node-id:partition-id "
                             "(two non-negative ints)")
        if int(node) in mapping:
            raise ValueError(f"invalid partition-map: node {int(node)} is listed twice")
        if int(pid) in mapping.values():
            raise ValueError(f"invalid partition-map: partition-id {int(pid)} is given to two nodes")
        mapping[int(node)] = int(pid)
    return mapping


@component("settings", "local")
@dataclass(frozen=True)
class LocalTraining(Component):
    """The clients' local steps."""

    local_steps: int = param(50, "K: local steps per round (unless local-epochs)", within=(1, None))
    local_epochs: float = param(0.0, "E: local epochs per round, as Flower's examples train; > 0: "
                                "each client runs its own K = ceil(E·rows/batch-size) steps, reports "
                                "it, and the server divides each reply by its own K", within=(0.0, None),
                                excludes="local-steps")
    batch_size: int = param(50, "examples per local step", within=(1, None))
    lr: float | None = param(None, "local learning rate at round 1; preset: the preconditioner's "
                             "(sgd 0.1, adam/adamw/sophia 1e-3, muon 0.02, soap 3e-3)",
                             within=(0.0, None), open_low=True, sane=(0.0, 10.0))
    lr_schedule: str = param("cosine", "lr over rounds, torch's lr_scheduler stepped once a round "
                             "(docs/own-app.md, 'Learning-rate schedules'): cosine (to 0 after the "
                             "last), constant, step (× lr-gamma every lr-step-every rounds), "
                             "multistep (× lr-gamma from each of lr-milestones on), exponential "
                             "(× lr-gamma each round)", choices=tuple(SCHEDULES))
    lr_gamma: float = param(0.1, "lr-schedule step, multistep, exponential: the factor (torch's gamma)",
                            within=(0.0, 1.0), open_low=True)
    lr_step_every: int = param(0, "lr-schedule step: rounds between two multiplications by lr-gamma "
                               "(torch's step_size)", within=(0, None))
    lr_milestones: str = param("", "lr-schedule multistep: comma-separated rounds from which the lr "
                               "is multiplied by lr-gamma once more (e.g. '5,8'; torch's milestones)")
    weight_decay: float | None = param(None, "decoupled weight decay (L2 for adam); preset: the "
                                       "algorithm's (diloco 0.1), else the preconditioner's",
                                       within=(0.0, None), sane=(0.0, 10.0))
    diagnostics_every: int = param(10, "PosRatio / TopMass on local steps 1, 1+N, 1+2N, … (0: off); "
                                   "kept on the device, read once per round", within=(0, None))

    def check(self) -> None:
        defaults = LocalTraining.__dataclass_fields__
        schedule_keys = {"lr-gamma": self.lr_gamma, "lr-step-every": self.lr_step_every,
                         "lr-milestones": self.lr_milestones}
        set_keys = {k: v for k, v in schedule_keys.items()
                    if v != defaults[k.replace("-", "_")].default}
        check_schedule(self.lr_schedule, set_keys)
        if self.lr_milestones:
            parse_milestones(self.lr_milestones)

    def round_lr_scale(self, server_round: int, num_rounds: int) -> float:
        """The lr factor of a round (lr_schedule.py)."""
        return round_lr_scale(self.lr_schedule, server_round, num_rounds, self.lr_gamma,
                              self.lr_step_every, self.lr_milestones)


@component("settings", "data")
@dataclass(frozen=True)
class Data(Component):
    """The task, the model and how the data is split across clients."""

    task: str = param("fashion-mnist", "a built-in task, 'package.module:function' (your own), "
                      "'hf:<name>' (Hugging Face), or a local 'csv:'/'parquet:'/'imagefolder:' path")
    model: str = param("cnn", "a built-in model or 'package.module:function' (your own)")
    partitioning: str = param("dirichlet", "how one data set is split across clients",
                              choices=PARTITIONINGS)
    dirichlet_alpha: float = param(0.3, "Dirichlet concentration α of the label shares",
                                   within=(0.0, None), open_low=True)
    classes_per_client: int = param(2, "labels per client ('pathological' partitioning)",
                                    within=(1, None))
    data_dir: str = param("", "where the data lives; a SuperNode's node config may set its own")


@component("settings", "output")
@dataclass(frozen=True)
class Output(Component):
    """Where a run's results and the clients' durable state go."""

    results_dir: str = param("", "absolute results root; empty: <checkout>/results or "
                             "~/.adaptfl/results", loop_only=_OUTPUTS)
    run_name: str = param("", "results sub-folder; empty: <algorithm>-<time>", loop_only=_OUTPUTS)
    resume: bool = param(False, "continue results-dir/run-name from its last complete round",
                         loop_only=_OUTPUTS)
    resume_from: str = param("", "absolute path of an earlier run's results dir to continue from",
                             loop_only=_OUTPUTS)
    overwrite: bool = param(False, "replace results-dir/run-name when it holds a run already "
                            "(else refused, unless resume=true)", loop_only=_OUTPUTS, excludes="resume")
    client_state_dir: str = param("", "durable client state (HaFedHo, SCAFFOLD, …); empty: the "
                                  "system's temp dir")
    # false by default: durable state is model-sized, and in simulation every node's context
    # lives in the server's process and rides along with each message (docs/scale.md)
    client_state_memory: bool = param(False, "also keep durable client state in Flower's "
                                      "context.state: in simulation that is the server process's "
                                      "memory (model-sized per client that took part) and follows a "
                                      "client across Ray nodes; false: client-state-dir only (shared "
                                      "by every node of a multi-node Ray cluster)")
    # matplotlib's layout and drawing are ~0.6 s of CPU a run: in a sweep of many short runs,
    # or a test that reads only the numbers, that is a large share of the whole run
    figures: bool = param(True, "write plot.png, diagnostics.png and partitions.png beside "
                          "metrics.csv; false: the numbers only", loop_only=_OUTPUTS)
    tensorboard: bool = param(False, "also write TensorBoard event files to <results dir>/tensorboard "
                              "(needs the tensorboard extra)", loop_only=_OUTPUTS)
    mlflow: bool = param(False, "also log the run config and every round's numeric metrics to "
                         "an offline MLflow file store, <results dir>/mlruns (needs the tracking "
                         "extra)", loop_only=_OUTPUTS)


@component("settings", "runtime")
@dataclass(frozen=True)
class Runtime(Component):
    """What the clients run on."""

    device: str = param("auto", "auto, cpu, cuda or cuda:N (a node config may override it)")
    precision: str = param("auto", "local steps' forward pass: auto (bf16 autocast on CUDA, fp32 "
                           "on CPU), fp32, or bf16 (CUDA only); weights and optimizer state stay "
                           "fp32", choices=("auto", "fp32", "bf16"))
    num_threads: int = param(0, "torch threads per client; 0: the CPUs it has (simulation: "
                             "client-resources-num-cpus; python -m adaptfl.engine: CPUs // "
                             "num-nodes; a SuperNode: its process's CPUs)", within=(0, None))

    def check(self) -> None:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"invalid device={self.device!r}: choose auto, cpu, cuda or cuda:N")


@component("settings", "llm")
@dataclass(frozen=True)
class LanguageModel(Component):
    """A pretrained causal LM (`model='hf:…'`) with LoRA adapters, and instruction SFT
    (`task='sft:…'`): docs/llm-lora.md."""

    lora_rank: int = param(32, "LoRA rank r of the adapters (hf: models)", within=(1, None))
    lora_alpha: float = param(64.0, "LoRA scale α (the update is α/r·B·A)", within=(0.0, None),
                              open_low=True)
    lora_dropout: float = param(0.05, "dropout on the adapters' input", within=(0.0, 1.0),
                                open_high=True)
    lora_targets: str = param("all-linear", "modules that get adapters: all-linear (every linear "
                              "layer but the output head) or comma-separated names (q_proj,v_proj)")
    max_length: int = param(256, "tokens per SFT example (prompt + response), longer ones cut",
                            within=(8, None))
    prompt_template: str = param("alpaca", "SFT prompt: alpaca (the Alpaca template) or chat (the "
                                 "tokenizer's chat template)", choices=("alpaca", "chat"))
    gradient_checkpointing: bool = param(False, "recompute activations in backward: less memory "
                                         "for one more forward pass (hf: models)")


from adaptfl.codec.settings import Compression  # noqa: E402 - declared in its own package
from adaptfl.core.privacy_settings import Privacy  # noqa: E402 - declared in its own package
from adaptfl.core.secagg_settings import SecAgg  # noqa: E402 - declared in its own package

SETTINGS = (Federation, LocalTraining, Data, Output, Runtime, LanguageModel, Privacy, Compression, SecAgg)
# llm keys and what they need to matter: the adapters an hf: model, the rest an sft: task
_NEEDS = {"lora-rank": "model", "lora-alpha": "model", "lora-dropout": "model",
          "lora-targets": "model", "gradient-checkpointing": "model", "max-length": "task",
          "prompt-template": "task"}


def check_llm_keys(llm: LanguageModel, data: Data) -> None:
    """An llm key set away from its default must be read by something: refused otherwise."""
    defaults = LanguageModel().values()
    for key, value in llm.values().items():
        needs = _NEEDS[key]
        wanted = "hf:" if needs == "model" else "sft:"
        if value != defaults[key] and not getattr(data, needs).startswith(wanted):
            raise ValueError(f"{key}={value!r} is read only with {needs}='{wanted}…' "
                             f"({needs}={getattr(data, needs)!r}); remove it")
