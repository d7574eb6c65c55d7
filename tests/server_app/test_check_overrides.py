"""`python -m adaptfl.server_app.check_overrides`: Flower's parsing, one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptfl.server_app.check_overrides import main, merged_config


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


def test_an_adaptfl_key_the_app_does_not_list_is_named_as_unlisted(tmp_path) -> None:  # noqa: ANN001
    # Issue 33 §4: a user's own app lists only its keys; overriding a real adaptfl key it does not
    # list said "unknown key 'tau' (no similar key)"; it must say the key exists and where to list it.
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "mine"\nversion = "0.1.0"\n[tool.flwr.app]\npublisher = "me"\n'
        '[tool.flwr.app.components]\nserverapp = "adaptfl.server_app.app:app"\n'
        'clientapp = "adaptfl.client_app.app:app"\n[tool.flwr.app.config]\nlr = 0.01\n')
    with pytest.raises(ValueError) as err:
        merged_config(["tau=0.3"], tmp_path)
    message = str(err.value)
    assert "unknown" not in message and "adaptfl key 'tau' not listed" in message, message
    assert "[tool.flwr.app.config]" in message and message.endswith('add: tau = "preset"'), message
    with pytest.raises(ValueError, match="unknown key 'taux'"):  # a key adaptfl lacks stays unknown
        merged_config(["taux=0.3"], tmp_path)


def test_an_unquoted_string_is_named_with_its_fix(capsys) -> None:  # noqa: ANN001
    """Flower answers `algorithm=fedadamw` with a generic "invalid format" naming no key."""
    assert main(["--run-config", "tau=0.3 algorithm=fedadamw"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("config error: --run-config algorithm=fedadamw: 'fedadamw' is not a TOML value; a "
                   "string needs quotes: algorithm='fedadamw' (in a shell: --run-config "
                   "\"algorithm='fedadamw'\")"), err
    assert main(["--run-config", "algorithm='fedadamw'"]) == 0


def _app(tmp_path: Path, config: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "mine"\nversion = "0.1.0"\n[tool.flwr.app]\npublisher = "me"\n'
        '[tool.flwr.app.components]\nserverapp = "mine.server_app:app"\n'
        f'clientapp = "mine.client_app:app"\n[tool.flwr.app.config]\n{config}')
    return tmp_path


def test_every_unlisted_key_is_named_in_one_message(tmp_path: Path) -> None:
    app = _app(tmp_path, "lr = 0.01\n")
    with pytest.raises(ValueError) as err:
        merged_config(["tau=0.3 local-steps=5 rho=0.2"], app)
    message = str(err.value)
    assert message.startswith("adaptfl keys 'tau', 'local-steps', 'rho' not listed in"), message
    assert message.endswith('add: tau = "preset"; local-steps = 50; rho = "preset"'), message


def test_a_missing_config_file_is_one_line_and_exit_2(capsys, tmp_path: Path) -> None:  # noqa: ANN001
    code, out, err = run(capsys, "--run-config", str(tmp_path / "missing.toml"))
    assert code == 2 and out == ""
    assert err == f"config error: --run-config {tmp_path / 'missing.toml'}: no such file " \
                  f"({tmp_path / 'missing.toml'})\n"


def test_an_app_with_keys_of_its_own_keeps_them(tmp_path: Path) -> None:
    """Flower's advanced-pytorch reads `server-device` itself: adaptfl's ServerApp would refuse
    the key, so such an app is not checked as adaptfl's; adaptfl's keys it uses in adaptfl's
    sense (`lr`) are, and one it uses in its own (`partitioning`, default invalid to adaptfl) not."""
    app = _app(tmp_path, 'server-device = "cpu"\nlr = 0.1\npartitioning = "shards"\n'
                         'num-server-rounds = 3\n')
    merged = merged_config(["server-device='cuda' partitioning='by-writer'"], app)
    assert merged["server-device"] == "cuda" and merged["partitioning"] == "by-writer"
    with pytest.raises(ValueError, match=r"^invalid lr=-1: must be > 0"):
        merged_config(["lr=-1"], app)
    with pytest.raises(ValueError, match=r"^invalid num-server-rounds=0: must be >= 1"):
        merged_config(["num-server-rounds=0"], app)
    with pytest.raises(ValueError, match=r"unknown key 'server-devices' \(did you mean 'server-device'\?\)"):
        merged_config(["server-devices='cpu'"], app)
