"""`python -m adaptfl.algorithms.check_overrides`: Flower's parsing, one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptfl.algorithms.check_overrides import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("override", "named"), [
    ("taux=0.3", "unknown key 'taux' (did you mean 'tau'?)"),
    ("tau=0", "tau"),                       # a value the ServerApp refuses
    ("num-server-rounds=2.5", "num-server-rounds"),  # a wrong type
    ("tau = 0.3", "'tau = 0.3' is not key=value"),  # Flower would silently drop it
    ("tau=0.3 rho", "'rho' is not key=value"),
])
def test_a_bad_override_is_one_line_naming_the_key(capsys, override: str, named: str) -> None:
    code, out, err = run(capsys, "--run-config", override)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("config error: ") and named in err, err


def test_overrides_merge_over_the_defaults_as_flower_merges_them(capsys, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "-c", "tau=0.3 run-name='a b'", "-c", "tau=0.2",
                       "--get", "tau", "--get", "run-name", "--get", "rho", "--get", "resume")
    # later flags win; rho is the preset's
    assert code == 0 and out.splitlines() == ["0.2", "a b", "preset", "false"]

    settings = tmp_path / "settings.toml"
    settings.write_text("rho = 0.25\nalgorithm = 'fedadamw'\n")
    code, out, _ = run(capsys, "--run-config", str(settings), "--get", "rho", "--get", "algorithm")
    assert code == 0 and out.splitlines() == ["0.25", "fedadamw"]
