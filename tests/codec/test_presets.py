"""`codec='lean'` (adaptfl/codec/presets.py) expands to the keys docs/compression.md names, to
the very run the results page measured, and leaves a user's own keys alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.harness.compression_goals import GOALS

DOC = Path(__file__).resolve().parents[2] / "docs" / "compression.md"
LEAN_RUN = "fedact ≥10× fewer up (int2, v local, Δ_G nf4)"


def _keys(cfg: RunConfig) -> dict[str, object]:
    return {k: v for k, v in cfg.to_flower().items() if k.startswith("codec") or k == "v-sync"}


def test_lean_on_fedact_is_the_run_the_results_page_measured() -> None:
    """The results page's goal runs codec='lean' alone; it equals the written-out run the 1-seed
    table measured before the preset existed."""
    assert GOALS["fedact lean"].keys == {"codec": "lean"} and GOALS["fedact lean"].algorithm == "fedact"
    algorithm, keys = GOALS[LEAN_RUN].algorithm, GOALS[LEAN_RUN].keys
    measured = RunConfig.of(algorithm=algorithm, **{k.replace("-", "_"): v for k, v in keys.items()})
    lean = RunConfig.of(algorithm="fedact", codec="lean")
    assert lean.to_flower() == measured.to_flower()  # every key, effective values
    assert _keys(lean)["v-sync"] == "none" and _keys(lean)["codec-delta"] == "int2+ef"


def test_lean_expands_to_what_the_docs_say() -> None:
    # docs/compression.md: "`codec='lean'` on fedact is `k='v'` `k='v'` ..." (one line)
    line = next(ln for ln in DOC.read_text().splitlines() if ln.startswith("`codec='lean'` on fedact is"))
    documented = dict(re.findall(r"`([a-z-]+)='([^']*)'`", line.split(" is ", 1)[1]))
    keys = _keys(RunConfig.of(algorithm="fedact", codec="lean"))
    assert documented and all(keys[k] == v for k, v in documented.items()), (documented, keys)
    changed = {k: v for k, v in keys.items() if v != _keys(RunConfig.of(algorithm="fedact"))[k]}
    assert set(changed) <= set(documented), changed  # nothing the docs do not name


def test_a_users_own_keys_win_and_other_algorithms_get_their_records() -> None:
    mine = _keys(RunConfig.of(algorithm="fedact", codec="lean", codec_delta="int8+ef", v_sync="block"))
    assert mine["codec-delta"] == "int8+ef" and mine["v-sync"] == "block" and mine["codec-v"] == "int2+ef"
    scaffold = _keys(RunConfig.of(algorithm="scaffold", codec="lean"))
    assert (scaffold["codec-delta"], scaffold["codec-delta-c"], scaffold["codec-c"]) \
        == ("int2+ef", "int2+ef", "nf4")
    assert _keys(RunConfig.of(algorithm="fedavg", codec="lean"))["codec-delta"] == "int2+ef"


def test_an_unknown_preset_is_still_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^invalid codec='slim'"):
        RunConfig.of(codec="slim")
