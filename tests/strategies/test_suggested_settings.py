"""Every setting a warning or a refusal before round 1 suggests is accepted as written: the
tolerance note's trimmed-mean (it names min-replies, and fraction-train where the rounds are too
small), the small-round note's fraction-train, the small-round refusal's two ways out, and the
aggregator refusals' settings (server_app/run_checks.py `check_tolerance`) each applied to the
run they were given for, then checked as round 1 checks them."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.sampling import fewest_replies, hostile_count, nodes_needed, sample_size
from adaptfl.server_app.run_checks import check_small_rounds, check_tolerance
from adaptfl.strategies.contribution import small_round_note, tolerance_note

SETTING = re.compile(r"([a-z][a-z0-9-]*)=('[^']*'|[0-9][0-9.e-]*|true|false)")


def suggested(text: str, after: str) -> dict[str, Any]:
    """The key=value settings of `text` after the last `after` (what the line proposes, not what
    it says of the run as it is), values read as `flwr run --run-config` reads them (TOML)."""
    tail = text.rsplit(after, 1)[-1]
    found = {k: tomllib.loads(f"v = {v}")["v"] for k, v in SETTING.findall(tail)}
    assert found, f"no setting suggested in {text!r}"
    return found


def applied(user: dict[str, Any], settings: dict[str, Any]) -> RunConfig:
    """The run config of the user's own keys with the suggested ones set over them."""
    unknown = set(settings) - set(RunConfig.of().to_flower())
    assert not unknown, f"suggested keys that are no setting: {unknown}"
    return RunConfig.from_flower({**{k.replace("_", "-"): v for k, v in user.items()}, **settings})


@pytest.mark.parametrize("nodes,fraction", [(5, 1.0), (7, 1.0), (10, 0.5), (5, 0.4), (7, 0.1), (4, 1.0),
                                            (20, 0.05)])
@pytest.mark.parametrize("algorithm", ["fedavg", "fedact"])
def test_the_tolerance_notes_setting_runs_as_named(algorithm: str, nodes: int, fraction: float) -> None:
    user = dict(algorithm=algorithm, fraction_train=fraction)
    cfg = RunConfig.of(**user)
    line = tolerance_note(cfg, sample_size(cfg.federation, nodes), nodes)
    fixed = applied(user, suggested(line, "; "))
    check_tolerance(fixed)  # refused before: min-replies=1 cannot cut one at each end
    sampled = sample_size(fixed.federation, nodes)
    assert nodes_needed(fixed.federation) <= nodes and sampled >= fixed.federation.min_replies
    assert fixed.algorithm.aggregator.name == "trimmed-mean"
    assert f"tolerates {min(hostile_count(0.3, sampled), (sampled - 1) // 2)} of the {sampled}" in line


@pytest.mark.parametrize("nodes,fraction", [(5, 0.4), (7, 0.1), (8, 0.2), (200, 0.01), (3, 0.5)])
def test_the_small_round_notes_setting_runs_as_named(nodes: int, fraction: float) -> None:
    user = dict(algorithm="fedavg", fraction_train=fraction)
    cfg = RunConfig.of(**user)
    line = small_round_note(cfg, sample_size(cfg.federation, nodes), nodes)
    assert line is not None
    fixed = applied(user, suggested(line.split(" bounds each reply")[0], "; "))
    assert sample_size(fixed.federation, nodes) >= 3
    assert small_round_note(fixed, sample_size(fixed.federation, nodes), nodes) is None


@pytest.mark.parametrize("nodes,fraction", [(5, 0.4), (7, 0.1), (2, 1.0), (3, 0.5), (200, 0.01)])
def test_the_small_round_refusals_settings_run_as_named(nodes: int, fraction: float) -> None:
    """Either way out it names: the fraction-train that samples 3 (below 3 nodes, more nodes:
    no setting), and accept-small-rounds=true."""
    user = dict(algorithm="fedavg", fraction_train=fraction)
    cfg = RunConfig.of(**user)
    with pytest.raises(ValueError) as refused:
        check_small_rounds(cfg, sample_size(cfg.federation, nodes), nodes)
    line = str(refused.value)
    more, accept = line.split(", or set ")[0], suggested(line, ", or set ")
    assert accept == {"accept-small-rounds": True}
    for way in [accept] if nodes < 3 else [suggested(more, "; use "), accept]:
        fixed = applied(user, way)
        check_small_rounds(fixed, sample_size(fixed.federation, nodes), nodes)  # accepted as written


@pytest.mark.parametrize("settings", [
    dict(aggregator="trimmed-mean", hostile_fraction=0.3),  # the setting the note used to name
    dict(aggregator="trimmed-mean", hostile_fraction=0.45),  # 3 -> ceil(1.35) = 2: 3 is not enough
    dict(aggregator="trimmed-mean", hostile_fraction=0.3, min_replies=4),
    dict(aggregator="krum", hostile_fraction=0.2),
    dict(aggregator="krum", hostile_fraction=0.3, min_replies=7),
    dict(aggregator="krum"),  # f = 1 without hostile-fraction: 5 replies
    dict(aggregator="median", hostile_fraction=0.4),
    dict(aggregator="mean", hostile_fraction=0.3),
    dict(aggregator="clip", hostile_fraction=0.2),
])
def test_each_refusals_setting_runs_as_named(settings: dict[str, Any]) -> None:
    cfg = RunConfig.of(algorithm="fedavg", **settings)
    with pytest.raises(ValueError) as refused:
        check_tolerance(cfg)
    fixed = applied({"algorithm": "fedavg", **settings}, suggested(str(refused.value), ": set "))
    check_tolerance(fixed)
    fraction = fixed.federation.hostile_fraction
    assert fixed.federation.min_replies == fewest_replies(fixed.algorithm.aggregator.check_federation,
                                                          fraction)  # the fewest, not any that holds
