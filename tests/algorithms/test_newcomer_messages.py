"""Issue 33 §7's one-line messages: `--num-nodes 0` is named as typed, and "preset" is offered
only for keys that have one (num-server-rounds has none)."""

from __future__ import annotations

import pytest

from adaptfl.engine.__main__ import main as engine_main
from adaptfl.server_app.check_overrides import main as check_overrides


def test_num_nodes_zero_is_named_as_the_flag(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as done:
        engine_main(["--num-nodes", "0"])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == "config error: --num-nodes 0: must be >= 1"


@pytest.mark.parametrize("override, expected", [
    ("num-server-rounds='x'", "expected int"),
    ("rho='x'", 'expected float or "preset"'),  # an algorithm's preset sets rho
    ("server-opt=3", 'expected str or "preset"'),  # a component key: "preset" is its default
])
def test_preset_is_offered_only_where_there_is_one(capsys, override: str, expected: str) -> None:  # noqa: ANN001
    assert check_overrides(["--run-config", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(expected), err
