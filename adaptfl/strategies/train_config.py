"""What a Flower train config may carry to adaptfl's strategies.

A round's lr, as Flower's strategies take it: `strategy.start(...,
train_config=ConfigRecord({"lr": 0.1}))` and a `configure_train` that changes `config["lr"]`
(Flower's `advanced-pytorch` halves it at round 5). Such an lr is the round's lr as given, on
both sides: the clients step with it and the server's rules that divide by the lr (FedACT's
Δ_G = −mean Δ/(K·lr), SCAFFOLD's control variate) divide by it; `lr-schedule` does not scale it
(the app's `configure_train` is the schedule). Checked as the `lr` key is (settings.py).

Any other key that names an adaptfl setting (`local-steps`, …) is refused: the clients' round
is built from the strategy's recipe, which would not read it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from adaptfl.algorithms.config import declared_keys
from adaptfl.algorithms.settings import LocalTraining
from adaptfl.core.params import fields_of
from adaptfl.core.stage import RoundInfo

LR_ALIASES = {"learning-rate": "lr", "learning_rate": "lr"}  # what Flower apps call it too


def is_lr_key(key: str) -> bool:
    return LR_ALIASES.get(key.lower(), key.lower()) == "lr"


def train_config_lr(config: Mapping[str, Any]) -> float | None:
    """The lr a train (or evaluate) config sets, checked as the `lr` key; None if it sets none."""
    keys = [key for key in config if is_lr_key(key)]
    if not keys:
        return None
    if len(keys) > 1:
        raise ValueError(f"train_config sets the lr twice ({', '.join(map(repr, keys))}): keep one")
    value = config[keys[0]]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"train_config[{keys[0]!r}]={value!r}: expected a number")
    lr_field = next(info for info in fields_of(LocalTraining) if info.key == "lr")
    why = lr_field.param.why_invalid(float(value))
    if why:
        raise ValueError(f"train_config[{keys[0]!r}]={value!r}: {why}")
    return float(value)


def with_lr(info: RoundInfo, lr: float, base_lr: float) -> RoundInfo:
    """The round's values with the train config's lr (its scale against the run's lr: Muon's
    AdamW half follows it, as it follows the schedule)."""
    return dataclasses.replace(info, lr=lr, lr_scale=lr / base_lr)


def refuse_adaptfl_keys(config: Mapping[str, Any], strategy: str) -> None:
    """A key other than the lr that names an adaptfl setting would reach the client as
    `session.config`, and the round's optimizer, built from the recipe, would not read it:
    refused in one line, naming the keyword that sets it."""
    declared = set(declared_keys())
    for key, value in config.items():
        kebab = key.lower().replace("_", "-")
        if kebab in declared and not is_lr_key(key):
            raise ValueError(f"train_config[{key!r}]={value!r}: adaptfl's clients take {kebab} "
                             f"from the strategy, not from train_config; pass "
                             f"{strategy}({kebab.replace('-', '_')}={value!r}) instead")
