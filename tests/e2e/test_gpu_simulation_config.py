"""Flower simulation on GPUs: `client-resources-num-gpus` is a fraction, so several ClientApps
share one GPU (docs/speed.md). The federation config that page documents goes through
Flower's own parser exactly as `flwr run --federation-config` parses it."""

from __future__ import annotations

import re

import pytest
from flwr.common.config import parse_config_args
from flwr.supercore.utils import simulation_config_from_json

from tests.support.flower_processes import PROJECT


def _as_flwr_run_parses_it(text: str):  # noqa: ANN202 - Flower's SimulationConfig protobuf
    values = parse_config_args([text])  # flwr/cli/run/run.py: _parse_federation_config_overrides
    return simulation_config_from_json({k.replace("-", "_"): v for k, v in values.items()})


def test_the_documented_gpu_federation_config_is_accepted() -> None:
    page = (PROJECT / "docs" / "speed.md").read_text()
    documented = re.findall(r'--federation-config "([^"]*client-resources-num-gpus[^"]*)"', page)
    assert documented, "docs/speed.md documents no client-resources-num-gpus example"
    for text in documented:
        config = _as_flwr_run_parses_it(text)
        assert 0.0 < config.client_resources_num_gpus <= 1.0  # a share of one GPU per ClientApp


def test_a_misspelt_federation_key_is_refused() -> None:
    with pytest.raises(ValueError, match="client_resources_num_gpu"):
        _as_flwr_run_parses_it("client-resources-num-gpu=0.25")
