"""Check `flwr run --run-config` overrides before Flower sees them; say what is wrong in one line.

Flower answers an unknown key with `[code: 15] Invalid run configuration.` (no key named), and a
bad value fails only inside the ServerApp, after Ray has started. This parses the overrides with
flwr's own parser (as `flwr run` does), fuses them with the app's defaults in pyproject.toml (as
the SuperLink does) and validates the result the way the ServerApp will.

    python -m adaptfl.server_app.check_overrides --run-config "tau=0.3 rho=0.2" [--get KEY ...]

With `--preflight` it also runs what the ServerApp runs before round 1 (`build_run`: load the
task, build the model, one step of the client pipeline on a few rows, its reply checked; then
the results dir's refusals, writing nothing), so a missing data file, label column or
`module:function`, a model that does not fit the task, or a run-name in use is named here in
seconds instead of inside Flower after Ray has started.

Exit 0, printing the merged value of each `--get KEY` on its own line; or exit 2
(`REFUSED_EXIT_CODE`, as `python -m adaptfl.engine` for the same input) with one line
`config error: <message>`.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
import tomllib
import warnings
from pathlib import Path
from typing import Any

import click
from flwr.common.config import flatten_dict, fuse_dicts, get_project_config, parse_config_args

from adaptfl import source as where
from adaptfl.core.exit_codes import REFUSED_EXIT_CODE
from adaptfl.core.params import PRESET, coerce

# The Flower app whose defaults the overrides go over: adaptfl's own in a source checkout (or an
# unpacked FAB), else the folder you run it in (your own app, as `flwr run .` would take).
APP_DIR = where.source_checkout() or Path.cwd()

# flwr's own key=value pattern (flwr/common/config.py, parse_config_args): text it does not match
# is dropped without a word, so `tau = 0.3` would silently change nothing.
_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def validate(merged: dict[str, Any]) -> None:
    """Raise ValueError naming the key if the ServerApp would refuse this run config."""
    from adaptfl.algorithms.config import RunConfig

    RunConfig.from_flower(merged)


def preflight(merged: dict[str, Any], nodes: int = 0) -> None:
    """Raise ValueError (or the loader's OSError/ImportError) if the ServerApp would refuse this
    run before round 1: the very function it calls first (server_app/loop.py: build_run).

    Quietly: its warnings and progress bars come again from the ServerApp itself, so a refusal
    is the one line `main` prints."""
    from adaptfl.algorithms.config import RunConfig
    from adaptfl.privacy.ledger import check_privacy_ledger
    from adaptfl.server_app.loop import build_run, check_results_dir
    from adaptfl.server_app.outputs import results_root
    from adaptfl.server_app.run_checks import check_nodes

    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # read when `datasets` is imported
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = RunConfig.from_flower(merged)
            # A relative results-dir first: Flower's ServerApp runs in the SuperLink's
            # working directory, so it would fail there after Ray started; refused here, naming
            # the key, before the task is loaded or anything is written.
            results_root(cfg)
            if cfg.output.mlflow:  # the tracking extra missing: refused here too, in one line
                from adaptfl.server_app.mlflow_log import mlflow_client_class

                mlflow_client_class()
            _, _, task = build_run(cfg)
            if nodes > 0:  # the simulation's node count: the checks the engine makes with its nodes
                check_nodes(cfg, task, [{} for _ in range(nodes)])
            check_privacy_ledger(cfg.privacy)  # a bad line, another δ or mode (docs/privacy.md, dp-ledger)
            check_results_dir(cfg, check_only=True)  # a run-name in use, a resume that cannot
    finally:
        logging.disable(logging.NOTSET)


def check_values(text: str) -> None:
    """Each value must be TOML, as Flower parses it; an unquoted string (`algorithm=fedadamw`),
    which Flower answers with a generic "invalid format", is named with its fix."""
    for key, raw in _PAIR.findall(text):
        try:
            tomllib.loads(f"v = {raw}")
        except tomllib.TOMLDecodeError:
            fix = raw.replace("'", "")
            raise ValueError(f"--run-config {key}={raw}: {raw!r} is not a TOML value; a string needs "
                             f"quotes: {key}='{fix}' (in a shell: --run-config \"{key}='{fix}'\")") from None


def merged_config(overrides: list[str], app_dir: Path = APP_DIR) -> dict[str, Any]:
    """The run config Flower would hand the ServerApp for these `--run-config` values, checked
    as adaptfl's ServerApp will check it where adaptfl reads the whole run config; in an app with
    keys of its own, only adaptfl's keys that app reads in adaptfl's sense (`app_keys`)."""
    for text in overrides:
        leftover = _PAIR.sub("", text).strip()
        if text.endswith(".toml"):
            if not Path(text).expanduser().is_file():  # Flower: a FileNotFoundError traceback
                raise ValueError(f"--run-config {text}: no such file ({Path(text).expanduser().absolute()})")
            continue
        if leftover:
            raise ValueError(f"--run-config {text!r}: {leftover!r} is not key=value "
                             "(no spaces around '='; quote strings: key='text')")
        check_values(text)
    defaults = flatten_dict(get_project_config(app_dir)["tool"]["flwr"]["app"].get("config", {}))
    parsed = parse_config_args(overrides)
    check_listed(parsed, defaults, app_dir / "pyproject.toml")
    merged = fuse_dicts(defaults, parsed)
    if app_keys(defaults):
        check_shared_keys(merged, defaults)
    else:
        validate(merged)
    return merged


def check_listed(parsed: dict[str, Any], defaults: dict[str, Any], pyproject: Path) -> None:
    """Flower's rule: an override names a key the app lists. All unlisted adaptfl keys are named in
    one message (with the lines to add); an unknown key with the app's closest ones."""
    known = _adaptfl_keys()
    unlisted = [key for key in parsed if key not in defaults and key in known]
    if unlisted:
        lines = "; ".join(f"{key} = {_default_of(key)}" for key in unlisted)
        raise ValueError(f"adaptfl key{'s' if len(unlisted) > 1 else ''} {', '.join(map(repr, unlisted))} "
                         f"not listed in {pyproject} [tool.flwr.app.config] (Flower's rule: a key "
                         f"overridden with --run-config must be listed there); add: {lines}")
    for key in parsed:
        if key not in defaults:
            close = difflib.get_close_matches(key, defaults, n=3)
            hint = f"did you mean {' or '.join(map(repr, close))}?" if close else "no similar key"
            raise ValueError(f"unknown key {key!r} ({hint}); the keys are those in "
                             f"{pyproject} [tool.flwr.app.config]")


def app_keys(defaults: dict[str, Any]) -> list[str]:
    """The app's own keys (`server-device`, …): adaptfl's ServerApp refuses an unknown key, so an
    app that lists any reads its run config with its own code, not through adaptfl's."""
    return sorted(set(defaults) - _adaptfl_keys())


def check_shared_keys(merged: dict[str, Any], defaults: dict[str, Any]) -> None:
    """In an app with keys of its own: each adaptfl key (`lr`, `local-epochs`, …) whose default in
    the app is valid to adaptfl is checked as adaptfl checks it; one the app uses in another sense
    (its default invalid to adaptfl) is the app's."""
    known = _adaptfl_keys()
    for key, value in merged.items():
        if key in known and why_invalid(key, defaults[key]) is None:
            why = why_invalid(key, value)
            if why:
                raise ValueError(f"invalid {key}={value!r}: {why}")


def why_invalid(key: str, value: Any) -> str | None:
    """Why adaptfl's declarations of `key` all refuse this value alone (None: one accepts it)."""
    from adaptfl.algorithms.config import declared_keys

    if value == PRESET:
        return None
    reasons = []
    for _, info in declared_keys()[key]:
        try:
            reason = info.param.why_invalid(coerce(key, value, info, has_preset=True))
        except ValueError as err:
            reason = str(err).split(": ", 1)[-1]
        if reason is None:
            return None
        reasons.append(reason)
    return reasons[0]


def _default_of(key: str) -> str:
    """A key's value in adaptfl's own [tool.flwr.app.config] (`--pyproject` writes it)."""
    from adaptfl.algorithms.config import pyproject_block

    lines = (line.split(" = ", 1) for line in pyproject_block().splitlines()[1:])
    return dict(lines)[key]


def _adaptfl_keys() -> set[str]:
    from adaptfl.algorithms.config import declared_keys

    return set(declared_keys())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adaptfl.server_app.check_overrides",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", "-c", action="append", default=[],
                        help="the text given to `flwr run --run-config` (repeatable)")
    parser.add_argument("--get", action="append", default=[], metavar="KEY",
                        help="print this key's merged value (repeatable)")
    parser.add_argument("--app", type=Path, default=APP_DIR, help="folder holding pyproject.toml")
    parser.add_argument("--preflight", action="store_true",
                        help="also load the task, build the model and run one client step, as the "
                             "ServerApp does before round 1")
    parser.add_argument("--nodes", type=int, default=0, metavar="N",
                        help="with --preflight: the run will have N nodes (num-supernodes); check "
                             "what needs them too (dp's planned ε and count noise, empty partitions)")
    args = parser.parse_args(argv)
    try:
        merged = merged_config(args.run_config, args.app)
        values = [merged[key] for key in args.get]
        if args.preflight:
            preflight(merged, args.nodes)
    except click.ClickException as err:  # flwr's parser reports bad TOML this way
        return _fail(err.message)
    except KeyError as err:
        return _fail(f"--get {err.args[0]!r}: no such key")
    except (ValueError, OSError, ImportError) as err:
        return _fail(str(err))
    for value in values:
        print(str(value).lower() if isinstance(value, bool) else value)
    return 0


def _fail(message: str) -> int:
    print("config error: " + " ".join(message.split()), file=sys.stderr)  # one line, always
    return REFUSED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
