"""docs/privacy.md's headline command does what its text says (issue 33 §3): it plans more than one
round and its rounds fit the target (it trained one round at z = 1.0), and a target that round 1
alone exceeds is not told to "plan fewer rounds"."""

from __future__ import annotations

import re

from adaptfl.core.privacy_settings import Privacy
from adaptfl.privacy.accountant import planned_epsilon
from adaptfl.privacy.server import target_error
from tests.support.flower_processes import PROJECT


def _headline() -> dict[str, str]:
    text = (PROJECT / "docs" / "privacy.md").read_text()
    command = re.findall(r"```bash\n(.*?)```", text, flags=re.S)[0].replace("\\\n", " ")
    assert command.startswith("python -m adaptfl.engine"), command
    pairs = dict(re.findall(r"(\S+?)=(\S+)", command))
    pairs["num-nodes"] = re.search(r"--num-nodes (\d+)", command).group(1)
    return pairs


def test_the_headline_command_trains_every_planned_round_within_its_target() -> None:
    got = _headline()
    rounds, population = int(got["num-server-rounds"]), int(got["num-nodes"])
    sampled = round(float(got["fraction-train"]) * population)
    spent = planned_epsilon(float(got["dp-noise-multiplier"]), sampled, population, rounds,
                            Privacy().dp_delta, Privacy().dp_accounting)
    assert rounds > 1 and spent <= float(got["dp-target-epsilon"]), (rounds, spent)


def test_round_one_past_the_target_is_not_told_to_plan_fewer_rounds() -> None:
    privacy = Privacy(dp_target_epsilon=5.0, dp_noise_multiplier=1.0)
    alone = target_error(privacy, planned=7.7, rounds=1, sampled=10, population=100)
    assert "round 1 alone" in alone and "fewer rounds" not in alone, alone
    assert "raise dp-noise-multiplier or the target" in alone, alone
    many = target_error(privacy, planned=9.0, rounds=15, sampled=10, population=100)
    assert "fewer rounds" in many and "dp-on-target='stop'" in many, many
