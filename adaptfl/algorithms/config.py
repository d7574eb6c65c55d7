"""The run config, converted once at the edge into typed, validated components.

Every key is declared by exactly one kind of thing: a run setting (settings.py), the selection
of the algorithm and its switchable components (algorithm.py), or a field of a component
(a preconditioner's β, the trust rule's τ, a term's μ, a server optimizer's η, …). A run config
holds only the keys a user sets; the rest come from the declarations. The value "preset" asks
for the algorithm's or the component's default, so no valid number is a sentinel.

    unknown key                      -> refused, with the closest known keys
    key the algorithm does not read  -> refused, naming the algorithm's components
    bad value                        -> refused, naming the key and the allowed values
    combination that makes no sense  -> refused (Algorithm.check)

`python -m adaptfl.algorithms.config --pyproject | --markdown` prints the `[tool.flwr.app.config]`
block and the key table of docs/algorithms.md from the same declarations (tests keep both in sync).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adaptfl.algorithms.algorithm import SLOTS, TERM_SWITCH, Algorithm, Selection, term_choices
from adaptfl.algorithms.catalog import catalog, get_algorithm
from adaptfl.algorithms.privacy_checks import check_privacy
from adaptfl.algorithms.secagg_checks import check_secagg, secagg_defaults
from adaptfl.algorithms.settings import (
    SETTINGS,
    Data,
    Federation,
    LanguageModel,
    LocalTraining,
    Output,
    Runtime,
    check_llm_keys,
)
from adaptfl.codec import presets
from adaptfl.codec.settings import CompressionBase, check_shared
from adaptfl.core.params import PRESET, Component, FieldInfo, all_fields, fields_of, registry
from adaptfl.core.privacy_settings import Privacy
from adaptfl.core.secagg_settings import SecAggBase
from adaptfl.core.stage import RoundInfo

# Fields a title leaves out: numerical details, not what tells runs apart.
_QUIET = {"eps", "beta2", "muon-adam-eps", "muon-adam-beta1", "muon-adam-beta2", "max-precond-dim",
          "bias-correction", "trust-scope", "server-tau", "adamom-eps"}


def declared_keys() -> dict[str, list[tuple[type[Component], FieldInfo]]]:
    """Every run-config key and the declarations that read it."""
    out: dict[str, list[tuple[type[Component], FieldInfo]]] = {}
    for cls, info in all_fields():
        out.setdefault(info.key, []).append((cls, info))
    return out


# Python keywords Flower's own strategies and examples use, and what adaptfl calls them or does
KEYWORD_ALIASES = {"learning_rate": "lr", "learning-rate": "lr", "epochs": "local_epochs",
                   "local_epochs_per_round": "local_epochs", "num_rounds": "num_server_rounds"}


def check_keywords(values: dict[str, Any]) -> None:
    """Python keywords (snake_case run-config keys) in the caller's words: an unknown one is a
    keyword, with the closest one adaptfl has (or the name a Flower habit maps to)."""
    known = sorted(k.replace("-", "_") for k in declared_keys())
    for keyword in values:
        if keyword.replace("-", "_") in known:
            continue
        close = [KEYWORD_ALIASES[keyword]] if keyword in KEYWORD_ALIASES else \
            difflib.get_close_matches(keyword, known, n=2)
        hint = f"did you mean {' or '.join(f'{c}=' for c in close)}?" if close else "no similar keyword"
        raise ValueError(f"unknown keyword {keyword}= ({hint}); the keywords are adaptfl's run-config "
                         "keys in snake_case (docs/algorithms.md)")


def _unknown_key_error(keys: list[str], known: list[str]) -> ValueError:
    hints = []
    for key in keys:
        close = difflib.get_close_matches(key, known, n=2)
        hints.append(f"{key!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
    return ValueError(f"unknown run-config key{'s' if len(keys) > 1 else ''} {', '.join(hints)}")


@dataclass(frozen=True)
class RunConfig:
    selection: Selection
    algorithm: Algorithm
    federation: Federation
    local: LocalTraining
    data: Data
    output: Output
    runtime: Runtime
    llm: LanguageModel
    privacy: Privacy
    compression: CompressionBase
    secagg: SecAggBase

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any], drop_unused: bool = False) -> RunConfig:
        """From Flower's run config (kebab-case keys); anything wrong raises one ValueError.

        `drop_unused`: keys this algorithm does not read are dropped instead of refused (a sweep
        grid fixes keys for all its algorithms; each cell uses those that apply)."""
        declared = declared_keys()
        unknown = sorted(set(run_config) - set(declared))
        if unknown:
            raise _unknown_key_error(unknown, sorted(declared))
        values = secagg_defaults(dict(run_config))
        selection = Selection.build(values)
        values = presets.expand(  # codec='lean' and the like, written out before anything reads them
            values, lambda v: get_algorithm(selection.algorithm).configured(v).moments.synced,
            lambda v: get_algorithm(selection.algorithm).configured(v).shared_records())
        algorithm = get_algorithm(selection.algorithm).configured(values)
        settings = {s: s.build(values) for s in SETTINGS}
        read = algorithm.keys() | {f.key for s in (Selection, *SETTINGS) for f in fields_of(s)}
        unused = sorted(k for k, v in values.items() if v != PRESET and k not in read)
        if unused and drop_unused:
            return cls.from_flower({k: v for k, v in values.items() if k not in unused})
        if unused:
            raise ValueError(f"run-config key{'s' if len(unused) > 1 else ''} {unused} not used by "
                             f"algorithm {algorithm.name!r} ({algorithm.describe()}); remove "
                             f"{'them' if len(unused) > 1 else 'it'} or choose a component that reads "
                             f"{'them' if len(unused) > 1 else 'it'}")
        check_llm_keys(settings[LanguageModel], settings[Data])  # type: ignore[arg-type]
        config = cls(selection, algorithm, *(settings[s] for s in SETTINGS))  # type: ignore[arg-type]
        check_privacy(config.privacy, algorithm, config.federation)
        check_shared(config.compression, algorithm.shared_records(), algorithm.name)
        check_secagg(config)
        check_epochs(config)
        check_upload_schedule(config)
        return config

    @classmethod
    def of(cls, **values: Any) -> RunConfig:
        """Python keywords (snake_case) for the same keys: `RunConfig.of(algorithm="fedact", tau=0.3)`."""
        check_keywords(values)
        return cls.from_flower({k.replace("_", "-"): v for k, v in values.items()})

    def replace(self, **values: Any) -> RunConfig:
        """A copy with some keys (snake_case) changed."""
        return RunConfig.from_flower({**self.to_flower(), **{k.replace("_", "-"): v
                                                             for k, v in values.items()}})

    def to_flower(self) -> dict[str, Any]:
        """Every key with its effective value ("preset" for keys this algorithm does not read);
        `from_flower(to_flower())` gives the same config."""
        out: dict[str, Any] = {key: PRESET for key in declared_keys()}
        for settings in (self.federation, self.local, self.data, self.output, self.runtime, self.llm,
                         self.privacy, self.compression, self.secagg):
            out.update(settings.values())
        out["lr"], out["weight-decay"] = self.lr, self.weight_decay
        out["algorithm"] = self.algorithm.name
        for slot, (_, switch) in SLOTS.items():
            if switch:
                out[switch] = getattr(self.algorithm, slot).name
        terms = [t.name for t in self.algorithm.terms]
        if terms != [t.name for t in get_algorithm(self.algorithm.name).terms]:
            out[TERM_SWITCH] = terms[0] if terms else "none"
        for c in self.algorithm.components():
            out.update({k: v for k, v in c.values().items() if v is not None})
        return out

    def title(self) -> str:
        """One line a reader can tell runs apart by: the algorithm, its numbers, the workload."""
        parts = []
        for c in self.algorithm.components():
            if c.name in ("none", "mean", "fresh") and c is not self.algorithm.preconditioner:
                continue
            knobs = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in c.values().items()
                              if v is not None and not isinstance(v, bool) and k not in _QUIET)
            parts.append(f"{c.name}({knobs})" if knobs else c.name)
        data = self.data
        split = f"dirichlet α={data.dirichlet_alpha:g}" if data.partitioning == "dirichlet" \
            else data.partitioning
        return (f"{self.algorithm.name}: {' + '.join(parts)}\n{data.model} on {data.task}, {split}, "
                f"K={self.local.local_steps}, batch {self.local.batch_size}, lr={self.lr:g}")

    # --- derived values -------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self.algorithm.preconditioner.default_lr if self.local.lr is None else self.local.lr

    @property
    def weight_decay(self) -> float:
        wd = self.local.weight_decay if self.local.weight_decay is not None else self.algorithm.weight_decay
        return self.algorithm.preconditioner.default_weight_decay if wd is None else wd

    def round_info(self, server_round: int, run_key: str = "") -> RoundInfo:
        scale = self.local.round_lr_scale(server_round, self.federation.num_server_rounds)
        return RoundInfo(server_round=server_round, num_rounds=self.federation.num_server_rounds,
                         lr=self.lr * scale, lr_scale=scale, weight_decay=self.weight_decay,
                         local_steps=self.local.local_steps, batch_size=self.local.batch_size,
                         step_offset=(server_round - 1) * self.local.local_steps,
                         seed=self.federation.seed, run_key=run_key,
                         diagnostics_every=self.local.diagnostics_every,
                         local_epochs=self.local.local_epochs)


def check_epochs(cfg: RunConfig) -> None:
    """local-epochs divides each reply by its own K (Aggregation.delta_per_step): that needs each
    reply's Δ and the plain weighted mean, which dp (one noised release), SecAgg+ (only the sum)
    and the robust aggregators (a second, different selection) do not give."""
    if cfg.local.local_epochs <= 0.0:
        return
    blocker = ("dp" if cfg.privacy.on else "secagg" if cfg.secagg.on else
               "aggregator" if cfg.algorithm.aggregator.name != "mean" else "")
    if blocker:
        raise ValueError(f"local-epochs={cfg.local.local_epochs:g} with {blocker} on: each reply's own K "
                         "needs each reply's Δ and the plain mean; use local-steps (one K for all)")


def check_upload_schedule(cfg: RunConfig) -> None:
    """A reply that carries v only some rounds (v-sync-every, v-sync-until) changes the records
    dp noises and SecAgg+ masks from round to round, which both fix per run."""
    if not cfg.algorithm.skips_uploads():
        return
    blocker = "dp" if cfg.privacy.on else "secagg" if cfg.secagg.on else ""
    if blocker:
        raise ValueError(f"{cfg.algorithm.moments.upload_schedule()} "
                         f"with {blocker} on: its records are fixed per run, so the replies must "
                         "carry v every round; use v-sync-every=1 v-sync-until=0 or v-sync='none'")


# --- docs derived from the declarations ------------------------------------------------------
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


# The page that holds the generated key and algorithm tables (relative to the checkout).
ALGORITHMS_PAGE = "docs/algorithms.md"


def pyproject_block() -> str:
    """`[tool.flwr.app.config]`: settings with their defaults, component keys as "preset"."""
    lines = ["[tool.flwr.app.config]"]
    settings = [(f.key, f.default) for s in (Selection, *SETTINGS) for f in fields_of(s)]
    setting_keys = {k for k, _ in settings}
    lines += [f"{key} = {_toml(PRESET if default is None else default)}" for key, default in settings]
    lines += [f"{key} = \"{PRESET}\"" for key in sorted(declared_keys()) if key not in setting_keys]
    return "\n".join(lines) + "\n"


def key_table() -> str:
    """The key table of docs/algorithms.md: every key, who reads it, its default and what it means."""
    rows = ["| key | read by | default | meaning |", "|---|---|---|---|"]
    for key, decls in sorted(declared_keys().items()):
        # (kind, name) order, not the registry's: that follows import order, which a test or a
        # program importing one component first changes.
        for cls, info in sorted(decls, key=lambda decl: (decl[0].kind, decl[0].name)):
            who = f"{cls.kind.replace('_', '-')} `{cls.name}`"
            default = "preset" if info.default is None else _toml(info.default)
            rows.append(f"| `{key}` | {who} | {default} | {_doc(key, info)} |")
    return "\n".join(rows) + "\n"


def _doc(key: str, info: FieldInfo) -> str:
    """A field's doc; for a switch (`server-opt`, `trust`, …) the choices after its ':' are the
    registered components, so a new component file is listed without editing the switch."""
    kind = next((kind for kind, switch in SLOTS.values() if switch == key), None)
    if info.param.excludes:
        return f"{info.param.doc}; not with `{info.param.excludes}`"
    if key == TERM_SWITCH:
        choices = term_choices()
    elif kind is not None:
        choices = sorted(registry(kind))
    else:
        return info.param.doc
    return f"{info.param.doc.split(':', 1)[0]}: {', '.join(choices)}"


def algorithm_table() -> str:
    """The algorithm table of docs/algorithms.md: every named algorithm, its paper, its components and what
    crosses the wire (the model `arrays` goes down and Δ `delta` comes back in every round)."""
    rows = ["| `algorithm=` | paper | components | also down / also up |", "|---|---|---|---|"]
    for name, a in catalog().items():
        parts = [f"{slot.replace('_', '-')} `{c.name}`" for slot, c in
                 (("preconditioner", a.preconditioner), ("correction", a.correction), ("trust", a.trust),
                  ("v-sync", a.moments), ("sharing", a.sharing), ("server-opt", a.server_opt),
                  ("local-state", a.local_state))
                 if c.name not in ("none", "fresh") or slot == "preconditioner"]
        parts += [f"term `{t.name}`" for t in a.terms]
        down = ", ".join(f"`{r.name}`" for s in a.stages() for r in s.records_down()) or "–"
        up = ", ".join(f"`{r.name}`" for s in a.stages() for r in s.records_up()) or "–"
        rows.append(f"| `{name}` | {a.paper} | {', '.join(parts)} | {down} / {up} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(pyproject_block() if "--pyproject" in sys.argv else key_table(), end="")
