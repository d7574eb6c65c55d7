"""`codec='lean'` (adaptfl/codec/presets.py) expands to the keys docs/compression.md names, to
the very run the results page measured, and leaves a user's own keys alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.harness.compression_goals import GOALS

DOC = Path(__file__).resolve().parents[2] / "docs" / "compression.md"
# the 1-seed try that lean's choice of v grew from: v once at nf4, frozen (Δ_G was nf4 there)
V_ONCE_RUN = "fedact ≥10× fewer up (int2, v nf4 once, frozen)"


def _keys(cfg: RunConfig) -> dict[str, object]:
    return {k: v for k, v in cfg.to_flower().items()
            if k.startswith(("codec", "v-sync")) or k == "model-delta"}


def test_lean_on_fedact_is_the_v_once_run_with_int2_delta_g_and_the_model_as_a_delta() -> None:
    """The results page's goal runs codec='lean' alone; it is the written-out v-once try with
    Δ_G at int2 and model-delta='xor', every other key the same."""
    assert GOALS["fedact lean"].keys == {"codec": "lean"} and GOALS["fedact lean"].algorithm == "fedact"
    keys = {**GOALS[V_ONCE_RUN].keys, "codec-delta-g": "int2", "model-delta": "diff"}
    written = RunConfig.of(algorithm="fedact", **{k.replace("-", "_"): v for k, v in keys.items()})
    lean = RunConfig.of(algorithm="fedact", codec="lean")
    assert lean.to_flower() == written.to_flower()  # every key, effective values
    assert _keys(lean)["v-sync-until"] == 1 and _keys(lean)["codec-delta"] == "int2+ef"


def test_lean_under_dp_keeps_v_local_since_dp_fixes_the_records_each_round_carries() -> None:
    """v-sync-until is refused with dp (its noised records are fixed per run): lean there keeps
    v local, and the run is accepted."""
    keys = _keys(RunConfig.of(algorithm="fedact", codec="lean", dp="central", weighting="uniform"))
    assert keys["v-sync"] == "none" and keys["model-delta"] == "diff" and keys["codec-delta-g"] == "int2"
    assert "codec-v" not in keys or keys["codec-v"] == ""


def test_lean_expands_to_what_the_docs_say() -> None:
    # docs/compression.md: "`codec='lean'` on fedact is `k='v'` `k='v'` ..." (one line)
    line = next(ln for ln in DOC.read_text().splitlines() if ln.startswith("`codec='lean'` on fedact is"))
    documented = dict(re.findall(r"`([a-z-]+)='([^']*)'`", line.split(" is ", 1)[1]))
    keys = _keys(RunConfig.of(algorithm="fedact", codec="lean"))
    assert documented and all(str(keys[k]) == v for k, v in documented.items()), (documented, keys)
    changed = {k: v for k, v in keys.items() if v != _keys(RunConfig.of(algorithm="fedact"))[k]}
    assert set(changed) <= set(documented), changed  # nothing the docs do not name


def test_a_users_own_keys_win_and_other_algorithms_get_their_records() -> None:
    mine = _keys(RunConfig.of(algorithm="fedact", codec="lean", codec_delta="int8+ef", v_sync="block",
                              model_delta="none"))
    assert mine["codec-delta"] == "int8+ef" and mine["v-sync"] == "block" and mine["codec-v"] == "nf4"
    assert mine["model-delta"] == "none" and mine["v-sync-until"] == 0  # block: v every round
    scaffold = _keys(RunConfig.of(algorithm="scaffold", codec="lean"))
    assert (scaffold["codec-delta"], scaffold["codec-delta-c"], scaffold["codec-c"]) \
        == ("int2+ef", "int2+ef", "nf4")
    assert _keys(RunConfig.of(algorithm="fedavg", codec="lean"))["codec-delta"] == "int2+ef"


def test_an_unknown_preset_is_still_a_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^invalid codec='slim'"):
        RunConfig.of(codec="slim")
