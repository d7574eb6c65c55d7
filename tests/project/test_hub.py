"""Flower Hub readiness: the pyproject meets the FAB format version 1 rules
(flower.ai/docs/hub/fab-format-version.html), which flwr 1.42's own build enforces: a `flwr`
dependency with an inclusive `>=` lower bound, `flwr-version-target` within it, and
`[project].license` a root-level LICENSE(.md) file that the built FAB contains."""

from __future__ import annotations

import copy
import io
import tomllib
import zipfile

import flwr
import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.supercore.fab_format_version import normalize_and_validate_fab_format

from tests.support.flower_processes import PROJECT

CONFIG = tomllib.loads((PROJECT / "pyproject.toml").read_text())


def test_the_pyproject_declares_fab_format_1_and_passes_its_rules() -> None:
    app = CONFIG["tool"]["flwr"]["app"]
    assert app["fab-format-version"] == 1 and app["flwr-version-target"] == flwr.__version__
    metadata = normalize_and_validate_fab_format(copy.deepcopy(CONFIG))
    assert metadata.fab_format_version == 1 and metadata.flwr_version_min == "1.42.0"


def test_the_built_fab_ships_the_license_file() -> None:
    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(PROJECT))).namelist()
    assert CONFIG["project"]["license"] == {"file": "LICENSE.md"} and "LICENSE.md" in names
    assert "Apache License" in (PROJECT / "LICENSE.md").read_text()


@pytest.mark.parametrize("change,refusal", [
    (lambda c: c["project"].update(dependencies=["flwr[simulation]==1.42.0"]), "inclusive lower bound"),
    (lambda c: c["project"].update(license="Apache-2.0"), "requires [project].license"),
    (lambda c: c["tool"]["flwr"]["app"].pop("flwr-version-target"), "flwr-version-target"),
])
def test_what_the_rules_refuse(change, refusal: str) -> None:  # noqa: ANN001
    """The rules the test relies on do refuse: the pin before, an SPDX string, no target."""
    config = copy.deepcopy(CONFIG)
    change(config)
    with pytest.raises(ValueError, match=refusal.replace("[", r"\[").replace("]", r"\]")):
        normalize_and_validate_fab_format(config)
