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


@pytest.mark.parametrize("override, expected", [
    ("local-epochs=1 local-steps=10", "local-epochs=1.0 and local-steps=10 contradict each other: "
     "local-epochs replaces local-steps; set one of them"),
    ("run-name='a' resume=true overwrite=true", "overwrite=True and resume=True contradict each "
     "other: overwrite replaces resume; set one of them"),
])
def test_contradictory_keys_are_refused_in_one_line(capsys, override: str, expected: str) -> None:  # noqa: ANN001
    assert check_overrides(["--run-config", override]) == 2
    assert capsys.readouterr().err == f"config error: {expected}\n"
    single = override.split()[0]  # each key alone is fine
    assert check_overrides(["--run-config", single]) == 0


def test_names_that_differ_only_in_case_are_suggested(capsys) -> None:  # noqa: ANN001
    from adaptfl.workloads.models import build_model
    from adaptfl.workloads.tasks import load_task

    assert check_overrides(["--run-config", "algorithm='FedACT'"]) == 2  # the class name
    assert "unknown algorithm 'FedACT' (did you mean 'fedact'?)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"unknown model 'MLP' \(did you mean 'mlp'\?\)"):
        build_model("MLP", 10, 1, 28)
    with pytest.raises(ValueError, match=r"unknown task 'Fashion-MNIST' \(did you mean 'fashion-mnist'\?\)"):
        load_task("Fashion-MNIST")
