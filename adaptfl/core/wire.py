"""Every record name and metric key that crosses the wire, in one place.

Kebab-case, as Flower does. A reader who sees `"delta-g"` in a message finds here what it is;
which algorithm sends which record is declared by its components (core/contract.py).
"""

# --- Records in a TRAIN instruction (server -> client) ---
ARRAYS = "arrays"  # ArrayRecord: the global model x (state_dict names; Flower's own key)
RECIPE = "recipe"  # ConfigRecord: what the client runs this round (algorithms/recipe.py)
CONFIG = "config"  # ConfigRecord: the `train_config` of Strategy.start, plus "server-round"
DELTA_G = "delta-g"  # ArrayRecord: global direction Δ_G of the previous round (FedACT family)
V_BAR = "v-bar"  # ArrayRecord: server-averaged second moment v̄ (full or one value per tensor)
HAFEDHO_G = "g"  # ArrayRecord: HaFedHo's g^{t-1}, mean of the clients' summed local gradients
HAFEDHO_F_HAT = "f-hat"  # ArrayRecord {"f-hat": [f̂^{t-1}]}: HaFedHo's mean local loss
HAFEDHO_N_TOTAL = "n-total"  # ArrayRecord {"n-total": [|D|]} float64: HaFedHo's federation size
SCAFFOLD_C = "c"  # ArrayRecord: SCAFFOLD's server control variate c
THETA = "theta"  # ArrayRecord: FedPAC's averaged Θ^r / FedMIX-P's reference P^r ("<param>/<slot>")
G_G = "g-g"  # ArrayRecord: FedPAC's global direction g_G = -mean Δ_i / (K·lr)
MIME_M = "m"  # ArrayRecord: MimeLite's server momentum m
# ConfigRecord {record: version}: each array record's version (a digest of its bytes as sent,
# codec/versions.py); a record the node holds at that version goes without its bytes. In a
# reply: the versions the node now holds (an instruction without it is whole, as before)
VERSIONS = "versions"
# ArrayRecord {"zlib": uint8}: the model as its XOR against a model the node holds (model-delta,
# codec/model_delta.py), in place of `arrays`; VERSIONS names that model's version under this key
ARRAYS_DELTA = "arrays-delta"

# --- Records in a TRAIN reply (client -> server) ---
DELTA = "delta"  # ArrayRecord: Δ_i = x_i^{r,K} - x^r
V_LOCAL = "v"  # ArrayRecord: terminal second moment v_i
DELTA_C = "delta-c"  # ArrayRecord: SCAFFOLD's Δc_i = c_i⁺ - c_i
THETA_LOCAL = "theta-i"  # ArrayRecord: terminal Θ_i / P_i (full, or compressed with light=true)
GRAD_AT_X = "grad-at-x"  # ArrayRecord: MimeLite's full local gradient ∇f_i(x^r) at the global model
SECAGG = "secagg"  # ConfigRecord: a SecAgg+ stage's values (secagg/protocol.py)
MASKED = "masked"  # ArrayRecord {"y": integers mod 2^m}: a SecAgg+ reply's masked shared records
METRICS = "metrics"  # MetricRecord: the keys below, plus any numeric metric the client adds

# Every array record but the model, by direction: each has its own wire codec (adaptfl/codec/)
SHARED_DOWN = (DELTA_G, V_BAR, HAFEDHO_G, HAFEDHO_F_HAT, HAFEDHO_N_TOTAL, SCAFFOLD_C, THETA, G_G, MIME_M)
VERSIONED = (ARRAYS, *SHARED_DOWN)  # what VERSIONS versions: the model and every broadcast record
SHARED_UP = (DELTA, V_LOCAL, DELTA_C, THETA_LOCAL, GRAD_AT_X)

# --- MetricRecord keys of a reply ---
NUM_EXAMPLES = "num-examples"  # int, the client's data size (aggregation weight); required
PARTITION_ID = "partition-id"  # int, informational (replies are ordered by node id)
PEAK_MEMORY = "peak-memory-mb"  # float, the client's peak memory this round (client_app/device.py)
TRAIN_LOSS = "train-loss"  # float, mean loss over the K local steps
POS_RATIO = "pos-ratio"  # float, PosRatio of the trust scores (mean over the steps measured)
TOP_MASS = "top-mass"  # float, TopMass_0.01 of the trust scores (same steps)
F_HAT = "f-hat"  # float, HaFedHo's f̂_i: mean local loss f_i over the local steps
CLIENT_STATE = "client-state"  # int, where durable client state came from: 0 none, 1 memory, 2 disk
RAY_NODE = "ray-node"  # int, the first 12 hex digits of the Ray node id a simulated client ran on
LOCAL_STATE_SOURCE = "local-state-source"  # int, where a kept inner optimizer state came from (same codes)
LOCAL_STEPS = "local-steps"  # int, the K this client ran under local-epochs (ceil(E·rows/batch))
STEP_PATH = "step-path"  # int code into STEP_PATHS: the local-step path this client's round took
# python -m adaptfl.engine --cohort-form: how the cohort computes its clients' gradients
# (engine/cohort_steps.py); auto picks the fastest that applies
COHORT_FORMS = ("auto", "grouped", "vmap", "loop")
# step-path codes (a metrics row holds the names); cohort-*: many clients' steps at once, the
# reference step batched over them, each form's gradients (engine/cohort.py). Codes only grow.
STEP_PATHS = ("eager", "native", "cuda", "cohort-loop", "cohort-vmap", "cohort-grouped")
COHORT_SIZE = "cohort-size"  # int, how many clients this one's steps were stacked with (itself included)
EF_RESIDUAL = "ef-residual-norm"  # float, ‖residual‖ the client's error feedback keeps after this reply
TOOK_PART = "took-part-last-round"  # int 0/1, HaFedHo's participation rule as the client applied it

# --- MetricRecord keys of an EVALUATE reply (federated evaluation; with NUM_EXAMPLES, the
# held-out rows, and PARTITION_ID): the global model's scores on the client's own held-out split,
# and those of its locally adapted ("personal") model
EVAL_LOSS = "eval-loss"
EVAL_ACCURACY = "eval-accuracy"
PERSONAL_LOSS = "personal-loss"
PERSONAL_ACCURACY = "personal-accuracy"
# what Flower's quickstart examples call them (`eval_loss`, `eval_acc`), read as the keys above
EVAL_ALIASES = {"eval_loss": EVAL_LOSS, "eval_acc": EVAL_ACCURACY, "eval_accuracy": EVAL_ACCURACY}

# --- Node config keys (set by simulation or `flower-supernode --node-config`) ---
NODE_PARTITION_ID = "partition-id"
NODE_NUM_PARTITIONS = "num-partitions"
NODE_DEVICE = "device"  # optional per-node override: "cpu", "cuda", "cuda:1", "auto"
NODE_SECAGG_REQUIRED = "secagg-required"  # optional: true, the node trains only inside SecAgg+
NODE_DATA_DIR = "data-dir"  # optional: this node's own data (then it trains on all of it)

# --- A client's own context.state (kept by Flower across the rounds of one run) ---
WARNED = "adaptfl-warned"  # ConfigRecord {warning: True}: the warnings this client gave in this run
